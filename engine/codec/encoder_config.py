"""The 12 Hz speech tokenizer's ENCODER shape, read from `speech_tokenizer/config.json` (torch-free).

One promise: `CodecEncoderConfig.from_dict(speech_tokenizer_config)` reads the `encoder_config` object (a
transformers `MimiConfig`, with MimiConfig's defaults for absent fields) plus the top-level
`encoder_valid_num_quantizers` / `encode_downsample_rate`, and rejects what `engine.codec.encoder` does not
implement (non-causal convs, conv shortcuts, attention bias, other activations). `codec_encoder_preset`
gives the released shape ("full", 3rd-party values, reference 2.4) and the "tiny" test shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

# MimiConfig defaults (transformers 4.57.3) for fields a config.json may leave out.
_MIMI_DEFAULTS: dict[str, Any] = {
    "sampling_rate": 24000,
    "audio_channels": 1,
    "hidden_size": 512,
    "num_filters": 64,
    "num_residual_layers": 1,
    "upsampling_ratios": (8, 6, 5, 4),
    "kernel_size": 7,
    "last_kernel_size": 3,
    "residual_kernel_size": 3,
    "dilation_growth_rate": 2,
    "use_causal_conv": True,
    "pad_mode": "constant",
    "compress": 2,
    "use_conv_shortcut": False,
    "codebook_size": 2048,
    "codebook_dim": 256,
    "num_quantizers": 32,
    "vector_quantization_hidden_dimension": 256,
    "num_semantic_quantizers": 1,
    "num_hidden_layers": 8,
    "intermediate_size": 2048,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "hidden_act": "gelu",
    "norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 8000,
    "sliding_window": 250,
    "layer_scale_initial_scale": 0.01,
    "attention_bias": False,
}


@dataclass(frozen=True)
class CodecEncoderConfig:
    """Mimi encoder hyper-parameters; field names follow `encoder_config`."""

    sampling_rate: int
    audio_channels: int
    hidden_size: int
    num_filters: int
    num_residual_layers: int
    upsampling_ratios: tuple[int, ...]  # SEANet strides, applied in reverse order (4, 5, 6, 8)
    kernel_size: int
    last_kernel_size: int
    residual_kernel_size: int
    dilation_growth_rate: int
    pad_mode: str  # padding of the SEANet convs ("constant" = zeros); the downsample conv replicates
    compress: int
    codebook_size: int
    codebook_dim: int
    num_quantizers: int  # quantizers in the file (32 released); only `valid_quantizers` are kept
    vector_quantization_hidden_dimension: int
    num_semantic_quantizers: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    norm_eps: float
    rope_theta: float
    # Carried, NOT applied: the official encoder transformer builds a plain causal mask (no cache, so
    # transformers' `create_causal_mask` never sees the window); every frame attends to all earlier ones.
    sliding_window: int
    frame_rate: float  # 12.5
    valid_quantizers: int  # top-level `encoder_valid_num_quantizers` (16): the codes a frame keeps
    downsample_rate: int  # top-level `encode_downsample_rate` (1920 samples per frame)

    def __post_init__(self) -> None:
        object.__setattr__(self, "upsampling_ratios", tuple(int(r) for r in self.upsampling_ratios))
        problems = []
        if self.audio_channels != 1:
            problems.append("only mono encoders (audio_channels=1) are supported")
        if self.num_semantic_quantizers != 1:
            problems.append("exactly one semantic quantizer is supported")
        if not 1 < self.valid_quantizers <= self.num_quantizers:
            problems.append(f"encoder_valid_num_quantizers {self.valid_quantizers} out of range")
        if self.samples_per_frame != self.downsample_rate:
            problems.append(f"encode_downsample_rate {self.downsample_rate} != {self.samples_per_frame}")
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append("num_attention_heads must be a multiple of num_key_value_heads")
        if problems:
            raise ValueError("invalid codec encoder config: " + "; ".join(problems))

    @property
    def conv_frame_rate(self) -> int:
        """Frames per second after the SEANet convs (25): ceil(rate / prod(ratios)), as MimiConfig."""
        return math.ceil(self.sampling_rate / math.prod(self.upsampling_ratios))

    @property
    def downsample_stride(self) -> int:
        return 2

    @property
    def downsample_kernel(self) -> int:
        return 2 * int(self.conv_frame_rate / self.frame_rate)

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsampling_ratios) * self.downsample_stride

    @classmethod
    def from_dict(cls, speech_tokenizer_config: dict[str, Any]) -> CodecEncoderConfig:
        encoder = speech_tokenizer_config.get("encoder_config")
        if not isinstance(encoder, dict):
            raise ValueError("speech tokenizer config has no encoder_config object (needed to encode audio)")
        values = {**_MIMI_DEFAULTS, **encoder}
        unsupported = []
        if not values["use_causal_conv"]:
            unsupported.append("use_causal_conv=false")
        if values["use_conv_shortcut"]:
            unsupported.append("use_conv_shortcut=true")
        if values["attention_bias"]:
            unsupported.append("attention_bias=true")
        if values["hidden_act"] != "gelu":
            unsupported.append(f"hidden_act {values['hidden_act']!r}")
        if values["pad_mode"] not in ("constant", "replicate", "reflect"):
            unsupported.append(f"pad_mode {values['pad_mode']!r}")
        if isinstance(values["residual_kernel_size"], list):
            unsupported.append("a list residual_kernel_size")
        if unsupported:
            raise ValueError("unsupported codec encoder config: " + ", ".join(unsupported))
        frame_rate = encoder.get("frame_rate", encoder.get("_frame_rate"))
        if frame_rate is None:  # MimiConfig's derived value: rate / (prod(ratios) * 2)
            frame_rate = values["sampling_rate"] / (math.prod(values["upsampling_ratios"]) * 2)
        kwargs = {f.name: values[f.name] for f in fields(cls) if f.name in values}
        kwargs["head_dim"] = int(
            encoder.get("head_dim") or values["hidden_size"] // values["num_attention_heads"]
        )
        kwargs["frame_rate"] = float(frame_rate)
        kwargs["valid_quantizers"] = int(speech_tokenizer_config.get("encoder_valid_num_quantizers", 16))
        kwargs["downsample_rate"] = int(speech_tokenizer_config.get("encode_downsample_rate", 1920))
        return cls(**kwargs)


_FULL = {  # the released encoder_config (3rd-party copies, reference 2.4)
    "audio_channels": 1, "num_filters": 64, "kernel_size": 7, "residual_kernel_size": 3, "last_kernel_size": 3,
    "num_residual_layers": 1, "compress": 2, "upsampling_ratios": [8, 6, 5, 4], "hidden_size": 512,
    "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64,
    "intermediate_size": 2048, "hidden_act": "gelu", "norm_eps": 1e-5, "layer_scale_initial_scale": 0.01,
    "rope_theta": 10000, "max_position_embeddings": 8000, "sliding_window": 250, "num_quantizers": 32,
    "num_semantic_quantizers": 1, "codebook_size": 2048, "codebook_dim": 256,
    "vector_quantization_hidden_dimension": 256, "pad_mode": "constant", "use_causal_conv": True,
    "frame_rate": 12.5,
}  # fmt: skip
_TINY = _FULL | {
    "num_filters": 4, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 32, "codebook_dim": 8,
    "vector_quantization_hidden_dimension": 8, "num_quantizers": 16,
}  # fmt: skip


def codec_encoder_preset(name: str) -> CodecEncoderConfig:
    """Built-in encoder shapes: "full" (the released one) and "tiny" (CPU tests)."""
    presets = {"full": _FULL, "tiny": _TINY}
    if name not in presets:
        raise ValueError(f"unknown codec encoder preset {name!r}; choose one of {sorted(presets)}")
    return CodecEncoderConfig.from_dict(
        {"encoder_config": dict(presets[name]), "encoder_valid_num_quantizers": 16}
    )
