"""Checkpoint loading by official names, its error messages, random (dummy) weights, config parsing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.codec.config import codec_preset
from engine.model.config import ConfigError, load_config, preset
from engine.model.presets import PRESETS
from engine.model.weights import CheckpointError, expected_tensor_table, load_model


def _tensors(model) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone().contiguous() for name, t in model.checkpoint_tensors()}


def _write_checkpoint(root: Path, tensors: dict[str, torch.Tensor], model) -> Path:
    """The official layout: config.json, model.safetensors, speech_tokenizer/{config.json, model.safetensors}."""
    (root / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(PRESETS["tiny"]()[0]))
    save_file(tensors, str(root / "model.safetensors"))
    (root / "speech_tokenizer" / "config.json").write_text(json.dumps(codec_preset("tiny").to_dict()))
    codec = {"decoder." + k: v.contiguous() for k, v in model.codec.state_dict().items()}
    save_file(codec, str(root / "speech_tokenizer" / "model.safetensors"))
    return root


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_model) -> Path:
    return _write_checkpoint(tmp_path_factory.mktemp("ckpt"), _tensors(tiny_model), tiny_model)


def test_a_saved_checkpoint_loads_back_tensor_for_tensor(checkpoint, tiny_model):
    loaded = load_model(checkpoint)
    assert not loaded.config.random_weights and loaded.config.source == str(checkpoint)
    ours = dict(loaded.checkpoint_tensors())
    for name, tensor in tiny_model.checkpoint_tensors():
        assert torch.equal(ours[name], tensor), name
    for (name, a), b in zip(
        loaded.codec.state_dict().items(), tiny_model.codec.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    assert loaded.tokenizer is not None and loaded.tokenizer.is_fallback  # no tokenizer files in the dir


def test_bf16_loading_casts_every_tensor_and_keeps_the_rope_table_fp32(checkpoint):
    model = load_model(checkpoint, dtype=torch.bfloat16)
    assert {t.dtype for _, t in model.checkpoint_tensors()} == {torch.bfloat16}
    assert model.talker.rotary.inv_freq.dtype == torch.float32
    assert next(model.codec.parameters()).dtype == torch.float32  # codec stays fp32 unless asked


def test_sharded_checkpoints_with_an_index_load_too(tmp_path, tiny_model):
    tensors = _tensors(tiny_model)
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    root = _write_checkpoint(tmp_path, tensors, tiny_model)
    (root / "model.safetensors").unlink()
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(root / file))
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loaded = dict(load_model(root).checkpoint_tensors())
    assert all(torch.equal(loaded[k], tensors[k]) for k in names)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("missing", r"1 missing tensor\(s\): talker.model.layers.1.mlp.up_proj.weight"),
        ("shape", r"wrong shape: talker.codec_head.weight: file \(3072, 63\), expected \(3072, 64\)"),
        ("extra", r"1 unexpected tensor\(s\): talker.model.layers.9.extra.weight"),
    ],
)
def test_mismatched_checkpoints_fail_naming_the_tensor(tmp_path, tiny_model, change, message):
    tensors = _tensors(tiny_model)
    if change == "missing":
        del tensors["talker.model.layers.1.mlp.up_proj.weight"]
    elif change == "shape":
        tensors["talker.codec_head.weight"] = torch.zeros(3072, 63)
    else:
        tensors["talker.model.layers.9.extra.weight"] = torch.zeros(2)
    with pytest.raises(CheckpointError, match=message):
        load_model(_write_checkpoint(tmp_path, tensors, tiny_model))


def test_dummy_weights_are_random_nonzero_and_shaped_like_the_checkpoint(checkpoint):
    model = load_model(checkpoint, load_format="dummy", seed=3)
    assert model.config.random_weights
    table = expected_tensor_table(model.config)
    tensors = dict(model.checkpoint_tensors())
    assert {k: tuple(t.shape) for k, t in tensors.items()} == table
    for name, tensor in tensors.items():
        assert torch.isfinite(tensor).all(), name
        assert (tensor == 0).float().mean() < 1e-4, f"{name} is (nearly) all zeros"
        assert tensor.numel() < 2 or tensor.std() > 0, f"{name} is constant"
    again = dict(load_model("tiny", seed=3).checkpoint_tensors())
    assert all(torch.equal(again[k], tensors[k]) for k in table)  # seeded: deterministic
    other = dict(load_model("tiny", seed=4).checkpoint_tensors())
    assert not torch.equal(other["talker.codec_head.weight"], tensors["talker.codec_head.weight"])


@pytest.mark.parametrize(
    ("name", "count", "params"),
    [("1.7b", 404, 1_916_676_352), ("0.6b", 402, 905_788_672)],  # reference section 2.5
)
def test_full_size_tensor_tables_match_the_released_checkpoints(name, count, params):
    table = expected_tensor_table(preset(name))
    assert len(table) == count
    assert sum(math.prod(shape) for shape in table.values()) == params
    assert table["talker.model.text_embedding.weight"] == (151936, 2048)
    assert ("talker.code_predictor.small_to_mtp_projection.weight" in table) == (name == "1.7b")


def test_presets_keep_the_released_structure():
    tiny, full = preset("tiny"), preset("1.7b")
    assert tiny.random_weights and full.random_weights
    assert tiny.talker.text_vocab_size == full.talker.text_vocab_size == 151936
    assert tiny.talker.vocab_size == 3072 and tiny.code_predictor.num_code_groups == 16
    assert tiny.talker.num_heads > tiny.talker.num_kv_heads  # GQA
    assert tiny.code_predictor.has_input_projection and full.code_predictor.has_input_projection
    assert not preset("0.6b").code_predictor.has_input_projection
    assert tiny.prompt_ids == full.prompt_ids


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("model_type", "llama", "unknown model_type 'llama'"),
        ("tokenizer_type", "qwen3_tts_tokenizer_25hz", "unknown tokenizer_type"),
        ("tts_model_type", "base", "only CustomVoice"),
    ],
)
def test_unknown_model_types_are_rejected_with_a_clear_error(tmp_path, checkpoint, field, value, message):
    config = json.loads((checkpoint / "config.json").read_text())
    config[field] = value
    (tmp_path / "speech_tokenizer").mkdir()
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "speech_tokenizer" / "config.json").write_text(
        (checkpoint / "speech_tokenizer" / "config.json").read_text()
    )
    with pytest.raises(ConfigError, match=message):
        load_config(tmp_path)


def test_unknown_sources_and_presets_are_clear_errors():
    with pytest.raises(ConfigError, match="unknown model preset 'huge'"):
        preset("huge")
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache"):
        load_model("vivace-tests/not-a-real-repo")
    with pytest.raises(FileNotFoundError, match="neither a checkpoint directory"):
        load_model("./no/such/dir")
    with pytest.raises(ValueError, match="unknown load_format"):
        load_model("tiny", load_format="gguf")
