"""`load_voice_encoders`: the speaker and codec encoders of a model, equal bit for bit to `load_model`'s,
read alone from a checkpoint (other shards never opened, the talker never built), or replayed from the
same seeded generator for random weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.model.qwen3_tts import Qwen3TTS
from engine.model.voice_encoders import load_voice_encoders
from engine.model.weights import CheckpointError, load_model
from tests.engine.base_checkpoint import (
    SPEAKER_SHARD,
    forbid_building_the_generation_modules,
    sharded_without_the_talker,
    write_base_checkpoint,
)


def _same(a: torch.nn.Module | None, b: torch.nn.Module | None) -> bool:
    assert a is not None and b is not None
    x, y = a.state_dict(), b.state_dict()
    return x.keys() == y.keys() and all(x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize(("seed", "dtype"), [(0, torch.float32), (3, torch.float32), (0, torch.bfloat16)])
def test_random_weight_encoders_equal_the_full_models_bit_for_bit(seed: int, dtype: torch.dtype) -> None:
    full = load_model("tiny-base", seed=seed, dtype=dtype, voice_models=True)
    alone = load_voice_encoders("tiny-base", seed=seed, dtype=dtype)
    assert _same(alone.speaker_encoder, full.speaker_encoder)
    assert _same(alone.codec_encoder, full.codec_encoder)
    other = load_voice_encoders("tiny-base", seed=seed + 1, dtype=dtype)
    assert not torch.equal(other.speaker_encoder.fc.weight, alone.speaker_encoder.fc.weight)  # type: ignore[union-attr]


def test_checkpoint_encoders_are_read_alone_without_building_the_talker(
    base_model: Qwen3TTS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = write_base_checkpoint(tmp_path / "whole", base_model)
    sharded = sharded_without_the_talker(tmp_path / "sharded", base_model)
    forbid_building_the_generation_modules(monkeypatch)
    for root in (whole, sharded):
        alone = load_voice_encoders(root)
        assert alone.config.is_base and alone.config.source == str(root)
        assert _same(alone.speaker_encoder, base_model.speaker_encoder)
        assert _same(alone.codec_encoder, base_model.codec_encoder)
    with pytest.raises(AssertionError, match="Talker was built"):
        load_model(whole, voice_models=True)  # the guard bites: the full loader does build it


def test_a_missing_or_misshapen_speaker_tensor_is_named(base_model: Qwen3TTS, tmp_path: Path) -> None:
    root = write_base_checkpoint(tmp_path, base_model)
    tensors = load_file(str(root / "model.safetensors"))
    del tensors["speaker_encoder.fc.bias"]
    tensors["speaker_encoder.mfa.conv.bias"] = torch.zeros(3)
    save_file(tensors, str(root / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"1 missing tensor\(s\): speaker_encoder.fc.bias.*"
                                              r"wrong shape: speaker_encoder.mfa.conv.bias: file \(3,\)"):  # fmt: skip
        load_voice_encoders(root)


def test_an_index_naming_a_missing_speaker_shard_fails_naming_the_shard(
    base_model: Qwen3TTS, tmp_path: Path
) -> None:
    root = sharded_without_the_talker(tmp_path, base_model)
    (root / SPEAKER_SHARD).unlink()
    with pytest.raises(FileNotFoundError, match=SPEAKER_SHARD):
        load_voice_encoders(root)


def test_a_model_without_a_speaker_encoder_gives_no_encoders() -> None:
    encoders = load_voice_encoders("tiny")
    assert encoders.speaker_encoder is None and encoders.codec_encoder is None and not encoders.config.is_base
