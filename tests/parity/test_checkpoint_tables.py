"""Our tensor-name/shape tables equal the official models', and every saved tensor is consumed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine.codec.weights import expected_codec_tensor_table, load_codec
from engine.model.config import load_config, preset
from engine.model.weights import expected_tensor_table, load_model
from tests.parity.conftest import Reference

pytestmark = pytest.mark.parity


def _shapes(table: dict) -> dict[str, tuple[int, ...]]:
    return {name: tuple(shape) for name, shape in table.items()}


@pytest.mark.parametrize("size", ["1.7b", "0.6b"])
def test_official_model_table_equals_ours(reference: Reference, size: str) -> None:
    official = _shapes(reference.json("tables.json")[size])
    ours = expected_tensor_table(preset(size))
    assert sorted(set(official) - set(ours)) == [], "official tensors we do not have"
    assert sorted(set(ours) - set(official)) == [], "tensors the official model does not have"
    assert ours == official


def test_official_speech_tokenizer_table_equals_ours_minus_the_encoder(reference: Reference) -> None:
    official = _shapes(reference.json("tables.json")["speech_tokenizer"])
    decoder = {k: v for k, v in official.items() if k.startswith("decoder.")}
    assert all(k.startswith("encoder.") for k in official if k not in decoder), "only encoder.* may be exempt"
    assert expected_codec_tensor_table(preset("1.7b").codec) == decoder


@pytest.mark.parametrize("size", ["1.7b", "0.6b"])
def test_presets_equal_the_published_configs(reference: Reference, size: str, tmp_path: Path) -> None:
    configs = reference.json("tables.json")["configs"]
    (tmp_path / "speech_tokenizer").mkdir()
    (tmp_path / "config.json").write_text(json.dumps(configs[size] | {"transformers_version": "4.57.3"}))
    (tmp_path / "speech_tokenizer" / "config.json").write_text(json.dumps(configs["speech_tokenizer"]))
    loaded, built = load_config(tmp_path), preset(size)
    assert loaded.talker == built.talker
    assert loaded.code_predictor == built.code_predictor
    assert loaded.codec == built.codec
    assert loaded.prompt_ids == built.prompt_ids


@pytest.mark.parametrize("size", ["1b7", "0b6"])
def test_every_tensor_of_the_saved_checkpoint_is_consumed(reference: Reference, size: str) -> None:
    ckpt = reference.checkpoint(size)
    saved = load_file(str(ckpt / "model.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in saved.values()), "the Hub layout stores bf16"
    assert {k: tuple(v.shape) for k, v in saved.items()} == expected_tensor_table(load_config(ckpt))
    model = load_model(ckpt, dtype=torch.float32)
    loaded = dict(model.checkpoint_tensors())
    assert set(loaded) == set(saved)
    for name, tensor in saved.items():
        assert torch.equal(loaded[name].float().cpu(), tensor.float()), name


def test_every_decoder_tensor_of_the_saved_codec_is_consumed(reference: Reference) -> None:
    st = reference.checkpoint("1b7") / "speech_tokenizer" / "model.safetensors"
    with safe_open(str(st), framework="pt") as handle:
        names = list(handle.keys())  # noqa: SIM118
    assert any(n.startswith("encoder.") for n in names), "the official file carries encoder tensors too"
    saved = load_file(str(st))
    decoder = {k[len("decoder.") :]: v for k, v in saved.items() if k.startswith("decoder.")}
    state = load_codec(reference.checkpoint("1b7"), dtype=torch.float32).state_dict()
    assert set(state) == set(decoder)
    for name, tensor in decoder.items():
        assert torch.equal(state[name], tensor), name


def _copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_an_unexpected_tensor_is_rejected_by_name(reference: Reference, tmp_path: Path) -> None:
    ckpt = _copy_checkpoint(reference.checkpoint("0b6"), tmp_path / "ckpt")
    tensors = load_file(str(ckpt / "model.safetensors"))
    tensors["talker.model.layers.0.self_attn.extra.weight"] = torch.zeros(2, dtype=torch.bfloat16)
    save_file(tensors, str(ckpt / "model.safetensors"))
    with pytest.raises(ValueError, match="extra.weight"):
        load_model(ckpt)


def test_a_missing_tensor_is_reported_by_name(reference: Reference, tmp_path: Path) -> None:
    ckpt = _copy_checkpoint(reference.checkpoint("0b6"), tmp_path / "ckpt")
    tensors = load_file(str(ckpt / "model.safetensors"))
    del tensors["talker.code_predictor.lm_head.3.weight"]
    save_file(tensors, str(ckpt / "model.safetensors"))
    with pytest.raises(ValueError, match=r"lm_head\.3\.weight"):
        load_model(ckpt)
