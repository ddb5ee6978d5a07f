"""CodecConfig: the official speech_tokenizer/config.json read exactly, presets, clear errors."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from engine.codec.config import CodecConfig, codec_preset

# The decoder part of the released speech_tokenizer/config.json (reference section 2.4), extra keys included.
RELEASED = {
    "model_type": "qwen3_tts_tokenizer_12hz",
    "encoder_valid_num_quantizers": 16,
    "input_sample_rate": 24000,
    "output_sample_rate": 24000,
    "decode_upsample_rate": 1920,
    "encode_downsample_rate": 1920,
    "encoder_config": {"model_type": "mimi"},
    "decoder_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "latent_dim": 1024,
        "codebook_dim": 512,
        "codebook_size": 2048,
        "decoder_dim": 1536,
        "hidden_act": "silu",
        "hidden_size": 512,
        "intermediate_size": 1024,
        "layer_scale_initial_scale": 0.01,
        "max_position_embeddings": 8000,
        "head_dim": 64,
        "num_attention_heads": 16,
        "num_hidden_layers": 8,
        "num_key_value_heads": 16,
        "num_quantizers": 16,
        "num_semantic_quantizers": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000,
        "semantic_codebook_size": 4096,
        "sliding_window": 72,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "vector_quantization_hidden_dimension": 512,
    },
}


def test_released_config_reads_as_the_full_preset():
    assert CodecConfig.from_dict(RELEASED) == codec_preset("full")


def test_both_presets_make_1920_samples_per_80_ms_frame_with_a_72_frame_window():
    for name in ("full", "tiny"):
        config = codec_preset(name)
        assert config.samples_per_frame == 1920 and config.frame_ms == 80.0
        assert config.sliding_window == 72 and config.kv_window == 71
        assert config.num_quantizers == 16


def test_to_dict_round_trips():
    for name in ("full", "tiny"):
        assert CodecConfig.from_dict(codec_preset(name).to_dict()) == codec_preset(name)


def test_absent_fields_take_the_official_class_defaults():
    minimal = {"model_type": "qwen3_tts_tokenizer_12hz", "decoder_config": {"codebook_dim": 512}}
    config = CodecConfig.from_dict(minimal)
    assert (config.hidden_size, config.intermediate_size) == (1024, 3072)  # not the checkpoint's 512 / 1024
    assert config.head_dim == 1024 // 16


def test_unknown_model_type_missing_codebook_dim_and_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="qwen3_tts_tokenizer_25hz"):
        CodecConfig.from_dict({**RELEASED, "model_type": "qwen3_tts_tokenizer_25hz"})
    with pytest.raises(ValueError, match="codebook_dim is required"):
        CodecConfig.from_dict({"model_type": "qwen3_tts_tokenizer_12hz", "decoder_config": {}})
    with pytest.raises(ValueError, match="decode_upsample_rate 960"):
        CodecConfig.from_dict({**RELEASED, "decode_upsample_rate": 960})
    with pytest.raises(ValueError, match="hidden_act"):
        dataclasses.replace(codec_preset("tiny"), hidden_act="gelu")
    with pytest.raises(ValueError, match="unknown codec preset 'huge'"):
        codec_preset("huge")


def test_config_module_does_not_import_torch():
    import subprocess

    code = (
        "import sys, engine.codec.config, engine.codec.state_layout, engine.codec.chunking, "
        "engine.codec.silence; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
