"""Built-in model shapes, written as official `config.json` dicts so presets and checkpoints share one parser.

`tiny` keeps every structural feature of the 1.7B model (GQA, q/k norm, text projection to a different
width, a code-predictor input projection, the full 151936-row text vocabulary and the real special-id
tables) at widths small enough for one CPU core to run faster than realtime. `1.7b` and `0.6b` are the
exact released shapes (reference section 2), used with random weights for GPU benchmarks.
`CHECKPOINT_PRESETS` names the preset of each released checkpoint, so `--load-format dummy` with a known
Hugging Face id needs neither its files nor a download.

Voice presets: `tiny-base`, `1.7b-base`, `0.6b-base` (Base: no named speakers, a speaker encoder whose
`enc_dim` is the talker width, the other `speaker_encoder_config` fields at the official defaults, as the
published Base configs carry only `enc_dim` and `sample_rate`) and `tiny-voice-design`,
`1.7b-voice-design` (VoiceDesign: no named speakers). Base presets also build the codec encoder.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

# Codec-side ids of the released CustomVoice checkpoints (reference section 4; the same for both sizes).
_CODEC_IDS: dict[str, Any] = {
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
    "codec_language_id": {
        "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
        "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
        "beijing_dialect": 2074, "sichuan_dialect": 2062,
    },
    "spk_id": {
        "serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
        "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878,
    },
    "spk_is_dialect": {
        "serena": False, "vivian": False, "uncle_fu": False, "ryan": False, "aiden": False,
        "ono_anna": False, "sohee": False, "eric": "sichuan_dialect", "dylan": "beijing_dialect",
    },
}  # fmt: skip


def _config_json(
    model_size: str, talker: dict[str, Any], predictor: dict[str, Any], model_type: str = "custom_voice"
) -> dict[str, Any]:
    head_dim = talker["head_dim"]
    # M-RoPE sections as in the release (24/20/20 of 64), scaled to the head size; with identical
    # position streams they select identical values, so any split summing to head_dim/2 is equivalent.
    third = head_dim // 2 // 3
    mrope_section = [head_dim // 2 - 2 * third, third, third]
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": model_size,
        "tts_model_type": model_type,
        "im_start_token_id": 151644,
        "im_end_token_id": 151645,
        "assistant_token_id": 77091,
        "tts_pad_token_id": 151671,
        "tts_bos_token_id": 151672,
        "tts_eos_token_id": 151673,
        "transformers_version": "4.57.3",
        "talker_config": {
            "model_type": "qwen3_tts_talker",
            "attention_bias": False,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000,
            "rope_scaling": {"interleaved": True, "mrope_section": mrope_section, "rope_type": "default"},
            "max_position_embeddings": 32768,
            "sliding_window": None,
            "use_sliding_window": False,
            "vocab_size": 3072,
            "text_vocab_size": 151936,
            "num_code_groups": 16,
            "position_id_per_seconds": 13,
            **talker,
            **copy.deepcopy(_CODEC_IDS),
            "code_predictor_config": {
                "model_type": "qwen3_tts_talker_code_predictor",
                "attention_bias": False,
                "hidden_act": "silu",
                "rms_norm_eps": 1e-6,
                "rope_theta": 1000000,
                "rope_scaling": None,
                "max_position_embeddings": 65536,
                "sliding_window": None,
                "use_sliding_window": False,
                "vocab_size": 2048,
                "num_code_groups": 16,
                "layer_types": ["full_attention"] * predictor["num_hidden_layers"],
                **predictor,
            },
        },
    }


def tiny() -> tuple[dict[str, Any], str]:
    talker = {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "text_hidden_size": 32,
    }  # fmt: skip
    predictor = {
        "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "intermediate_size": 64,
    }  # fmt: skip
    return _config_json("tiny", talker, predictor), "tiny"


def size_1_7b() -> tuple[dict[str, Any], str]:
    talker = {
        "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 6144, "text_hidden_size": 2048,
    }  # fmt: skip
    return _config_json("1b7", talker, _FULL_PREDICTOR), "full"


def size_0_6b() -> tuple[dict[str, Any], str]:
    talker = {
        "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 3072, "text_hidden_size": 2048,
    }  # fmt: skip
    return _config_json("0b6", talker, _FULL_PREDICTOR), "full"


_FULL_PREDICTOR: dict[str, Any] = {
    "hidden_size": 1024, "num_hidden_layers": 5, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "intermediate_size": 3072,
}  # fmt: skip


def _voice_variant(
    builder: Callable[[], tuple[dict[str, Any], str]], model_type: str
) -> Callable[[], tuple[dict[str, Any], str]]:
    """The same shapes as a Base or VoiceDesign checkpoint: no named speakers; Base adds the speaker encoder."""

    def build() -> tuple[dict[str, Any], str]:
        config, codec = builder()
        config["tts_model_type"] = model_type
        config["talker_config"]["spk_id"] = {}
        config["talker_config"]["spk_is_dialect"] = {}
        if model_type == "base":
            config["speaker_encoder_config"] = {
                "enc_dim": config["talker_config"]["hidden_size"],
                "sample_rate": 24000,
                **(_TINY_SPEAKER_ENCODER if config["tts_model_size"] == "tiny" else {}),
            }
        return config, codec

    return build


# Small ECAPA-TDNN for the tiny Base preset (the released one is 512/1536 channels wide).
_TINY_SPEAKER_ENCODER: dict[str, Any] = {
    "enc_channels": [32, 32, 32, 32, 96], "enc_attention_channels": 16, "enc_res2net_scale": 4,
    "enc_se_channels": 16,
}  # fmt: skip

# name -> builder of (config.json dict, codec preset name)
PRESETS: dict[str, Callable[[], tuple[dict[str, Any], str]]] = {
    "tiny": tiny,
    "1.7b": size_1_7b,
    "0.6b": size_0_6b,
    "tiny-base": _voice_variant(tiny, "base"),
    "1.7b-base": _voice_variant(size_1_7b, "base"),
    "0.6b-base": _voice_variant(size_0_6b, "base"),
    "tiny-voice-design": _voice_variant(tiny, "voice_design"),
    "1.7b-voice-design": _voice_variant(size_1_7b, "voice_design"),
}

# Hugging Face id of a released checkpoint -> the preset with its exact shapes (random weights need no files).
CHECKPOINT_PRESETS: dict[str, str] = {
    "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice": "1.7b",
    "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice": "0.6b",
    "Qwen/Qwen3-TTS-12Hz-1.7B-Base": "1.7b-base",
    "Qwen/Qwen3-TTS-12Hz-0.6B-Base": "0.6b-base",
    "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign": "1.7b-voice-design",
}
