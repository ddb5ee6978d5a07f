"""Model configuration: the official `config.json` layout read into frozen dataclasses.

Torch-free on purpose (the gateway and tools import it). `load_config(dir)` reads a checkpoint
directory (`config.json` + `speech_tokenizer/config.json`); `preset(name)` builds the same records
for the built-in random-weight shapes (`tiny`, `1.7b`, `0.6b`, and the Base / VoiceDesign shapes; see
`presets.py`). Base (voice cloning) and VoiceDesign checkpoints are read only when the caller asks
for them (`voice_models=True`); the engine asks, and serves Base in x-vector mode and VoiceDesign with
the request's instruction as the voice. Anything this implementation cannot run exactly (another model
type, attention bias, a sliding window, a non-default RoPE) is rejected here with a message naming the
field, never half-supported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.codec.config import CodecConfig, codec_preset
from engine.codec.encoder_config import CodecEncoderConfig, codec_encoder_preset
from engine.text.prompt import PromptIds

SUPPORTED_MODEL_TYPE = "qwen3_tts"
SUPPORTED_TOKENIZER_TYPE = "qwen3_tts_tokenizer_12hz"
SUPPORTED_TTS_MODEL_TYPES = ("custom_voice",)
VOICE_TTS_MODEL_TYPES = ("base", "voice_design")  # readable with voice_models=True
BASE_MODEL_TYPE = "base"
VOICE_DESIGN_MODEL_TYPE = "voice_design"


class ConfigError(ValueError):
    """A checkpoint configuration this implementation cannot run exactly."""


@dataclass(frozen=True, slots=True)
class TalkerConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # codec vocabulary: 2048 codes + 1024 control/language/speaker ids
    text_vocab_size: int
    text_hidden_size: int
    num_code_groups: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    codec_eos_id: int

    @property
    def num_codes(self) -> int:
        """Codebook-0 codes are ids 0..num_codes-1; the top 1024 ids are control ids (reference 6.3)."""
        return self.vocab_size - 1024


@dataclass(frozen=True, slots=True)
class CodePredictorConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # codes per codebook group (2048)
    num_code_groups: int  # 16: the predictor fills groups 1..15
    rms_norm_eps: float
    rope_theta: float
    input_size: int  # talker hidden size; a biased projection maps it to hidden_size when they differ

    @property
    def has_input_projection(self) -> bool:
        return self.input_size != self.hidden_size


@dataclass(frozen=True, slots=True)
class SpeakerEncoderConfig:
    """`speaker_encoder_config` of a Base checkpoint (ECAPA-TDNN); absent fields take the official defaults."""

    mel_dim: int
    embedding_dim: int  # `enc_dim`: must equal the talker width (the x-vector is a codec-embedding row)
    channels: tuple[int, ...]
    kernel_sizes: tuple[int, ...]
    dilations: tuple[int, ...]
    attention_channels: int
    res2net_scale: int
    se_channels: int
    sample_rate: int

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "speaker_encoder_config") -> SpeakerEncoderConfig:
        config = cls(
            mel_dim=int(d.get("mel_dim", 128)),
            embedding_dim=int(d.get("enc_dim", 1024)),
            channels=tuple(int(x) for x in d.get("enc_channels", (512, 512, 512, 512, 1536))),
            kernel_sizes=tuple(int(x) for x in d.get("enc_kernel_sizes", (5, 3, 3, 3, 1))),
            dilations=tuple(int(x) for x in d.get("enc_dilations", (1, 2, 3, 4, 1))),
            attention_channels=int(d.get("enc_attention_channels", 128)),
            res2net_scale=int(d.get("enc_res2net_scale", 8)),
            se_channels=int(d.get("enc_se_channels", 128)),
            sample_rate=int(d.get("sample_rate", 24000)),
        )
        if not len(config.channels) == len(config.kernel_sizes) == len(config.dilations) >= 3:
            raise ConfigError(f"{where}: enc_channels, enc_kernel_sizes, enc_dilations need one length >= 3")
        if any(c % config.res2net_scale for c in config.channels[1:-1]):
            raise ConfigError(f"{where}: SE-Res2Net channels must be multiples of enc_res2net_scale")
        if config.mel_dim != 128 or config.sample_rate != 24000:
            raise ConfigError(f"{where}: the official mel front end is fixed at 128 bands, 24 kHz")
        return config


@dataclass(frozen=True, slots=True)
class ModelConfig:
    talker: TalkerConfig
    code_predictor: CodePredictorConfig
    codec: CodecConfig
    prompt_ids: PromptIds
    model_size: str  # `tts_model_size` of config.json: "1b7", "0b6", or "tiny"
    model_type: str  # `tts_model_type`: "custom_voice", or with voice_models=True "base" / "voice_design"
    random_weights: bool  # True for presets and `load_format="dummy"`: the length model replaces EOS
    source: str  # where the config came from (directory or preset name), for logs and errors
    speaker_encoder: SpeakerEncoderConfig | None = None  # Base checkpoints only
    codec_encoder: CodecEncoderConfig | None = None  # Base checkpoints only: reference audio -> codes

    @property
    def supports_instruct(self) -> bool:
        """The official wrapper drops instructions for the 0.6B model (reference 5.1)."""
        return self.model_size != "0b6"

    @property
    def is_base(self) -> bool:
        """A Base checkpoint: voices come from reference audio (speaker encoder + codec encoder)."""
        return self.model_type == BASE_MODEL_TYPE

    @property
    def is_voice_design(self) -> bool:
        """A VoiceDesign checkpoint: the voice is described in words (the instruction); no built-in speakers."""
        return self.model_type == VOICE_DESIGN_MODEL_TYPE


def load_config(path: str | Path, *, voice_models: bool = False) -> ModelConfig:
    """Read `config.json` and `speech_tokenizer/config.json` of an official checkpoint directory.

    `voice_models=True` also accepts Base and VoiceDesign checkpoints (`VOICE_TTS_MODEL_TYPES`)."""
    root = Path(path)
    config_json = _read_json(root / "config.json")
    codec_json = _read_json(root / "speech_tokenizer" / "config.json")
    return config_from_dicts(
        config_json, codec_json, source=str(root), random_weights=False, voice_models=voice_models
    )


def preset(name: str) -> ModelConfig:
    """Built-in random-weight model shapes: "tiny" (CPU tests and demo), "1.7b", "0.6b" (full size)."""
    from engine.model.presets import PRESETS  # local import: presets.py imports this module's records

    key = name.lower()
    if key not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    config_json, codec_name = PRESETS[key]()
    encoder = (
        codec_encoder_preset(codec_name) if config_json.get("tts_model_type") == BASE_MODEL_TYPE else None
    )
    return _from_dicts(
        config_json,
        codec_preset(codec_name),
        source=key,
        random_weights=True,
        voice_models=True,
        codec_encoder=encoder,
    )


def config_from_dicts(
    config_json: dict[str, Any],
    codec_json: dict[str, Any],
    *,
    source: str,
    random_weights: bool,
    voice_models: bool = False,
) -> ModelConfig:
    is_base = config_json.get("tts_model_type") == BASE_MODEL_TYPE
    return _from_dicts(
        config_json,
        CodecConfig.from_dict(codec_json),
        source=source,
        random_weights=random_weights,
        voice_models=voice_models,
        codec_encoder=CodecEncoderConfig.from_dict(codec_json) if voice_models and is_base else None,
    )


def _from_dicts(
    config_json: dict[str, Any],
    codec: CodecConfig,
    *,
    source: str,
    random_weights: bool,
    voice_models: bool = False,
    codec_encoder: CodecEncoderConfig | None = None,
) -> ModelConfig:
    _check_top_level(config_json, source, voice_models=voice_models)
    talker_json = _require(config_json, "talker_config", source)
    predictor_json = _require(talker_json, "code_predictor_config", source)
    talker = _talker_config(talker_json, source)
    speaker_encoder = None
    if config_json["tts_model_type"] == BASE_MODEL_TYPE:
        speaker_encoder = SpeakerEncoderConfig.from_dict(
            config_json.get("speaker_encoder_config") or {}, f"{source}: speaker_encoder_config"
        )
        if speaker_encoder.embedding_dim != talker.hidden_size:
            raise ConfigError(
                f"{source}: speaker_encoder_config.enc_dim {speaker_encoder.embedding_dim} must equal the "
                f"talker hidden size {talker.hidden_size} (the x-vector replaces a codec-embedding row)"
            )
    return ModelConfig(
        talker=talker,
        code_predictor=_code_predictor_config(predictor_json, talker.hidden_size, source),
        codec=codec,
        prompt_ids=PromptIds.from_config(config_json),
        model_size=str(config_json.get("tts_model_size") or "unknown"),
        model_type=str(config_json["tts_model_type"]),
        random_weights=random_weights,
        source=source,
        speaker_encoder=speaker_encoder,
        codec_encoder=codec_encoder,
    )


def _check_top_level(config_json: dict[str, Any], source: str, *, voice_models: bool = False) -> None:
    model_type = config_json.get("model_type")
    if model_type != SUPPORTED_MODEL_TYPE:
        raise ConfigError(f"{source}: unknown model_type {model_type!r}; expected {SUPPORTED_MODEL_TYPE!r}")
    tokenizer_type = config_json.get("tokenizer_type")
    if tokenizer_type != SUPPORTED_TOKENIZER_TYPE:
        raise ConfigError(
            f"{source}: unknown tokenizer_type {tokenizer_type!r}; expected {SUPPORTED_TOKENIZER_TYPE!r}"
        )
    tts_model_type = config_json.get("tts_model_type")
    if voice_models and tts_model_type in VOICE_TTS_MODEL_TYPES:
        return
    if tts_model_type not in SUPPORTED_TTS_MODEL_TYPES:
        raise ConfigError(
            f"{source}: tts_model_type {tts_model_type!r} is not supported; only CustomVoice checkpoints "
            f"({', '.join(SUPPORTED_TTS_MODEL_TYPES)}) can be served"
        )


def _talker_config(d: dict[str, Any], source: str) -> TalkerConfig:
    _check_plain_decoder(d, f"{source}: talker_config")
    hidden = int(_require(d, "hidden_size", source))
    heads = int(_require(d, "num_attention_heads", source))
    head_dim = int(d.get("head_dim") or hidden // heads)
    _check_rope_scaling(d.get("rope_scaling"), head_dim, f"{source}: talker_config")
    return TalkerConfig(
        hidden_size=hidden,
        num_layers=int(_require(d, "num_hidden_layers", source)),
        num_heads=heads,
        num_kv_heads=int(_require(d, "num_key_value_heads", source)),
        head_dim=head_dim,
        intermediate_size=int(_require(d, "intermediate_size", source)),
        vocab_size=int(_require(d, "vocab_size", source)),
        text_vocab_size=int(_require(d, "text_vocab_size", source)),
        text_hidden_size=int(_require(d, "text_hidden_size", source)),
        num_code_groups=int(_require(d, "num_code_groups", source)),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=float(_require(d, "rope_theta", source)),
        max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
        codec_eos_id=int(_require(d, "codec_eos_token_id", source)),
    )


def _code_predictor_config(d: dict[str, Any], talker_hidden: int, source: str) -> CodePredictorConfig:
    _check_plain_decoder(d, f"{source}: code_predictor_config")
    if d.get("rope_scaling") not in (None, {}):
        raise ConfigError(f"{source}: code_predictor_config.rope_scaling must be null (plain RoPE)")
    hidden = int(_require(d, "hidden_size", source))
    heads = int(_require(d, "num_attention_heads", source))
    return CodePredictorConfig(
        hidden_size=hidden,
        num_layers=int(_require(d, "num_hidden_layers", source)),
        num_heads=heads,
        num_kv_heads=int(_require(d, "num_key_value_heads", source)),
        head_dim=int(d.get("head_dim") or hidden // heads),
        intermediate_size=int(_require(d, "intermediate_size", source)),
        vocab_size=int(_require(d, "vocab_size", source)),
        num_code_groups=int(_require(d, "num_code_groups", source)),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=float(_require(d, "rope_theta", source)),
        input_size=talker_hidden,
    )


def _check_plain_decoder(d: dict[str, Any], where: str) -> None:
    """Reject variants the layers do not implement, instead of silently computing something else."""
    if d.get("attention_bias", False):
        raise ConfigError(f"{where}: attention_bias=true is not supported")
    if d.get("use_sliding_window", False) or d.get("sliding_window") is not None:
        raise ConfigError(f"{where}: sliding-window attention is not supported (full causal only)")
    if d.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{where}: hidden_act {d.get('hidden_act')!r} is not supported (silu only)")
    layer_types = d.get("layer_types")
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        raise ConfigError(f"{where}: only full_attention layers are supported, got {layer_types}")


def _check_rope_scaling(rope_scaling: dict[str, Any] | None, head_dim: int, where: str) -> None:
    """The talker's M-RoPE with three identical position streams is exactly 1-D RoPE (reference 2.2)."""
    if rope_scaling is None:
        return
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"{where}: rope_type {rope_type!r} is not supported (default only)")
    section = rope_scaling.get("mrope_section")
    if section is not None and sum(section) != head_dim // 2:
        raise ConfigError(f"{where}: mrope_section {section} must sum to head_dim/2 = {head_dim // 2}")


def _require(d: dict[str, Any], key: str, source: str) -> Any:
    if key not in d:
        raise ConfigError(f"{source}: config is missing required field {key!r}")
    return d[key]


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data
