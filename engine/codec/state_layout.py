"""Names and fixed shapes of one stream's incremental-decoding state (torch-free, so admission can size it).

Every causal stage of the decoder keeps exactly what its next input needs from the past; nothing depends on
how many frames a stream has decoded, so one shape serves every stream and a batch of streams at different
positions shares one graph. Per stream (full codec, fp32; C = channels, L = samples at that stage's rate):

    name                                  shape [C, L] or [H, W, D]   holds
    pre_conv                              [512, 2]                    last 2 dequantized frames (k3 conv)
    pre_transformer.layers.{i}.k / .v     [16, 71, 64]                post-RoPE keys / values of the last 71
                                                                      frames, a ring indexed by position % 71
    upsample.{0,1}.1.dwconv               [1024, 6]                   ConvNeXt depthwise k7 inputs (rate 2, 4)
    decoder.0                             [1024, 6]                   k7 conv inputs (rate 4)
    decoder.{b}.block.1                   [C_b, r_b]                  transposed-conv tail overlap, bias-free
                                                                      (r = 8, 5, 4, 3; C = 768 .. 96)
    decoder.{b}.block.{2,3,4}.conv1       [C_b, 6 * d]                post-SnakeBeta inputs of the dilated k7
                                                                      residual convs (d = 1, 3, 9)
    decoder.6                             [96, 6]                     final k7 conv inputs

plus one int64 frame position per stream (absolute RoPE position of the next frame; it also says which ring
entries are valid: min(position, 71) of them). SnakeBeta, norms, linear layers, 1x1 convs, the dequantizer
and the k = stride transposed convs hold no state.
"""

from __future__ import annotations

import math

from engine.codec.config import CodecConfig

_CONV_KERNEL = (
    7  # every stride-1 conv after the pre-conv is k7 (ConvNeXt dwconv, decoder.0, res units, final)
)
_PRE_CONV_KERNEL = 3
_RESIDUAL_DILATIONS = (1, 3, 9)
POSITION_BYTES = 8  # one int64 per stream


def codec_state_layout(config: CodecConfig) -> dict[str, tuple[int, ...]]:
    """Per-stream state tensors: name -> shape without the batch dimension, in decoder order."""
    layout: dict[str, tuple[int, ...]] = {"pre_conv": (config.codebook_dim, _PRE_CONV_KERNEL - 1)}
    ring = (config.num_key_value_heads, config.kv_window, config.head_dim)
    for layer in range(config.num_hidden_layers):
        layout[f"pre_transformer.layers.{layer}.k"] = ring
        layout[f"pre_transformer.layers.{layer}.v"] = ring
    for stage in range(len(config.upsampling_ratios)):
        layout[f"upsample.{stage}.1.dwconv"] = (config.latent_dim, _CONV_KERNEL - 1)
    layout["decoder.0"] = (config.latent_dim, _CONV_KERNEL - 1)
    for index, rate in enumerate(config.upsample_rates):
        out_dim = config.decoder_dim // 2 ** (index + 1)
        block = index + 1
        # Transposed conv k = 2r, stride r: each call leaves k - r = r samples that the next frame overlaps.
        layout[f"decoder.{block}.block.1"] = (out_dim, rate)
        for unit, dilation in enumerate(_RESIDUAL_DILATIONS):
            layout[f"decoder.{block}.block.{unit + 2}.conv1"] = (out_dim, (_CONV_KERNEL - 1) * dilation)
    final = len(config.upsample_rates) + 2
    layout[f"decoder.{final}"] = (config.output_dim, _CONV_KERNEL - 1)
    return layout


def state_elements(config: CodecConfig) -> int:
    """Floating-point elements of one stream's state (excluding the int64 position)."""
    return sum(math.prod(shape) for shape in codec_state_layout(config).values())


def kv_elements(config: CodecConfig) -> int:
    return sum(
        math.prod(shape)
        for name, shape in codec_state_layout(config).items()
        if name.startswith("pre_transformer")
    )


def state_bytes(config: CodecConfig, dtype_bytes: int) -> int:
    """Bytes of one stream's state with floats of `dtype_bytes` (4 = fp32, 2 = bf16), position included."""
    return state_elements(config) * dtype_bytes + POSITION_BYTES
