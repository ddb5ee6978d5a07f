"""The codec decoder's shape, read from `speech_tokenizer/config.json` or a built-in preset (torch-free).

`CodecConfig` holds exactly what the 12 Hz speech-tokenizer decoder needs to be built; `from_dict` reads the
official `speech_tokenizer/config.json` (model_type `qwen3_tts_tokenizer_12hz`) with the official config class's
defaults for absent fields, and `codec_preset("tiny" | "full")` gives the built-in shapes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

MODEL_TYPE = "qwen3_tts_tokenizer_12hz"

# Defaults of the official decoder config class, used only for fields a config.json leaves out. They are NOT
# the checkpoint's values (hidden_size 1024 and intermediate_size 3072 differ from the released 512 / 1024);
# `codebook_dim` has no default at all and must be present.
_OFFICIAL_DECODER_DEFAULTS: dict[str, Any] = {
    "codebook_size": 2048,
    "hidden_size": 1024,
    "latent_dim": 1024,
    "max_position_embeddings": 8000,
    "rope_theta": 10000.0,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "attention_bias": False,
    "sliding_window": 72,
    "intermediate_size": 3072,
    "hidden_act": "silu",
    "layer_scale_initial_scale": 0.01,
    "rms_norm_eps": 1e-5,
    "num_hidden_layers": 8,
    "num_quantizers": 16,
    "upsample_rates": (8, 5, 4, 3),
    "upsampling_ratios": (2, 2),
    "decoder_dim": 1536,
}


@dataclass(frozen=True)
class CodecConfig:
    """Decoder hyper-parameters (reference section 2.4). Field names follow the official `decoder_config`."""

    codebook_size: int  # entries per codebook (codes are 0..codebook_size-1)
    codebook_dim: int  # width after each quantizer's output projection; each VQ works in codebook_dim // 2
    latent_dim: int  # pre_conv output / transformer in-out width / upsample width
    hidden_size: int  # transformer residual width
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int  # SwiGLU inner width
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int  # carried for completeness; RoPE is computed for any position
    sliding_window: int  # each frame attends to itself and the previous sliding_window - 1 frames
    layer_scale_initial_scale: float
    num_quantizers: int  # codebooks per frame: 1 semantic (rvq_first) + the rest acoustic (rvq_rest)
    upsampling_ratios: tuple[int, ...]  # k = stride transposed convs + ConvNeXt, at latent_dim
    upsample_rates: tuple[int, ...]  # SnakeBeta decoder blocks, channels halve per block
    decoder_dim: int
    attention_bias: bool = False
    hidden_act: str = "silu"
    output_sample_rate: int = 24000

    def __post_init__(self) -> None:
        object.__setattr__(self, "upsampling_ratios", tuple(int(r) for r in self.upsampling_ratios))
        object.__setattr__(self, "upsample_rates", tuple(int(r) for r in self.upsample_rates))
        problems = []
        if self.hidden_act != "silu":
            problems.append(f"hidden_act {self.hidden_act!r} is not supported (only 'silu')")
        if self.attention_bias:
            problems.append("attention_bias=True is not supported (the released codec has none)")
        if self.codebook_dim % 2:
            problems.append(f"codebook_dim must be even, got {self.codebook_dim}")
        if self.num_quantizers < 2:
            problems.append(f"num_quantizers must be >= 2 (1 semantic + acoustic), got {self.num_quantizers}")
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            problems.append(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.sliding_window < 1:
            problems.append(f"sliding_window must be >= 1, got {self.sliding_window}")
        if self.decoder_dim % (2 ** len(self.upsample_rates)):
            problems.append("decoder_dim must halve exactly once per upsample rate")
        if any(r < 1 for r in self.upsampling_ratios + self.upsample_rates):
            problems.append("upsampling ratios and rates must be >= 1")
        if problems:
            raise ValueError("invalid codec config: " + "; ".join(problems))

    # ------------------------------------------------------------------ derived sizes

    @property
    def samples_per_frame(self) -> int:
        """Output samples per code frame (1920 for the released codec: 2*2*8*5*4*3)."""
        return math.prod(self.upsampling_ratios + self.upsample_rates)

    @property
    def frame_ms(self) -> float:
        return 1000.0 * self.samples_per_frame / self.output_sample_rate

    @property
    def kv_window(self) -> int:
        """Frames of keys/values a stream must keep per layer (the window minus the query itself)."""
        return self.sliding_window - 1

    @property
    def output_dim(self) -> int:
        """Channels entering the final SnakeBeta + conv (96 for the released codec)."""
        return self.decoder_dim // 2 ** len(self.upsample_rates)

    # ------------------------------------------------------------------ (de)serialisation

    @classmethod
    def from_dict(cls, speech_tokenizer_config: dict[str, Any]) -> CodecConfig:
        """Read the official `speech_tokenizer/config.json` dict (top level, with `decoder_config` inside)."""
        if not isinstance(speech_tokenizer_config, dict):
            raise TypeError(
                "speech tokenizer config must be a dict (the parsed speech_tokenizer/config.json)"
            )
        model_type = speech_tokenizer_config.get("model_type")
        if model_type != MODEL_TYPE:
            raise ValueError(
                f"unsupported speech tokenizer model_type {model_type!r}: only {MODEL_TYPE!r} "
                "(the 12 Hz codec of Qwen3-TTS-12Hz checkpoints) is supported"
            )
        decoder = speech_tokenizer_config.get("decoder_config") or {}
        if not isinstance(decoder, dict):
            raise ValueError("speech tokenizer config: decoder_config must be an object")
        fields = {**_OFFICIAL_DECODER_DEFAULTS, **{k: v for k, v in decoder.items() if k in _FIELD_NAMES}}
        if "codebook_dim" not in decoder:
            raise ValueError("speech tokenizer config: decoder_config.codebook_dim is required (no default)")
        # Official attention: head_dim = getattr(config, "head_dim", hidden_size // num_attention_heads).
        fields.setdefault("head_dim", fields["hidden_size"] // fields["num_attention_heads"])
        if "output_sample_rate" in speech_tokenizer_config:
            fields["output_sample_rate"] = int(speech_tokenizer_config["output_sample_rate"])
        config = cls(**fields)
        declared = speech_tokenizer_config.get("decode_upsample_rate")
        if declared is not None and int(declared) != config.samples_per_frame:
            raise ValueError(
                f"speech tokenizer config: decode_upsample_rate {declared} does not match the decoder's "
                f"upsampling product {config.samples_per_frame}"
            )
        return config

    def to_dict(self) -> dict[str, Any]:
        """A `speech_tokenizer/config.json`-shaped dict (decoder part only) that `from_dict` reads back."""
        decoder = asdict(self)
        sample_rate = decoder.pop("output_sample_rate")
        decoder["upsampling_ratios"] = list(self.upsampling_ratios)
        decoder["upsample_rates"] = list(self.upsample_rates)
        return {
            "model_type": MODEL_TYPE,
            "decoder_config": decoder,
            "encoder_valid_num_quantizers": self.num_quantizers,
            "input_sample_rate": sample_rate,
            "output_sample_rate": sample_rate,
            "decode_upsample_rate": self.samples_per_frame,
            "encode_downsample_rate": self.samples_per_frame,
        }


_FIELD_NAMES = frozenset(CodecConfig.__dataclass_fields__)

_PRESETS: dict[str, CodecConfig] = {
    # The released Qwen3-TTS-Tokenizer-12Hz decoder (reference section 2.4).
    "full": CodecConfig(
        codebook_size=2048,
        codebook_dim=512,
        latent_dim=1024,
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=16,
        head_dim=64,
        intermediate_size=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=8000,
        sliding_window=72,
        layer_scale_initial_scale=0.01,
        num_quantizers=16,
        upsampling_ratios=(2, 2),
        upsample_rates=(8, 5, 4, 3),
        decoder_dim=1536,
    ),
    # Same structure, window and upsampling (1920 samples per frame), small widths: far faster than realtime
    # on one CPU core. Attention width (4 x 16) differs from hidden (32), as in the full codec (16 x 64 vs 512).
    "tiny": CodecConfig(
        codebook_size=2048,
        codebook_dim=64,
        latent_dim=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=16,
        intermediate_size=64,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=8000,
        sliding_window=72,
        layer_scale_initial_scale=0.01,
        num_quantizers=16,
        upsampling_ratios=(2, 2),
        upsample_rates=(8, 5, 4, 3),
        decoder_dim=64,
    ),
}


def codec_preset(name: str) -> CodecConfig:
    """Built-in codec shapes: "full" (the released codec) and "tiny" (CPU tests and demos)."""
    try:
        return _PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown codec preset {name!r}; choose one of {sorted(_PRESETS)}") from None
