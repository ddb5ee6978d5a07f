"""Encoders-only loading against the official Base checkpoint: `load_voice_encoders` on the official tiny
Base checkpoint, re-sharded so that the talker's shard can be deleted, gives the official x-vectors and
reference codes exactly (fp32), as the whole-model loader does."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.model.reference_audio import resample
from engine.model.speaker_encoder import speaker_embedding
from engine.model.voice_encoders import VoiceEncoders, load_voice_encoders

AUDIOS = ["a24k", "a16k", "a44k", "long24k"]


@pytest.fixture(scope="module")
def encoders(reference, tmp_path_factory) -> VoiceEncoders:
    source = reference.checkpoint("base")
    root = tmp_path_factory.mktemp("base-sharded")
    shutil.copy(source / "config.json", root / "config.json")
    shutil.copytree(source / "speech_tokenizer", root / "speech_tokenizer")
    tensors = load_file(str(source / "model.safetensors"))
    weight_map = {}
    for file, keys in (("talker.safetensors", [k for k in tensors if not k.startswith("speaker_encoder.")]),
                       ("speaker.safetensors", [k for k in tensors if k.startswith("speaker_encoder.")])):  # fmt: skip
        assert keys
        save_file({k: tensors[k] for k in keys}, str(root / file))
        weight_map.update(dict.fromkeys(keys, file))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (root / "talker.safetensors").unlink()
    return load_voice_encoders(root)


@pytest.mark.parametrize("name", AUDIOS)
def test_encoders_alone_give_the_official_x_vector_and_reference_codes(encoders, voices, name: str) -> None:
    meta, ref = voices
    pcm, rate = ref[f"audio.{name}"].numpy(), meta["audios"][name]["rate"]
    assert encoders.speaker_encoder is not None and encoders.codec_encoder is not None
    assert torch.equal(speaker_embedding(encoders.speaker_encoder, pcm, rate), ref[f"{name}.spk"])
    pcm24 = resample(pcm, rate, 24000)
    codes = encoders.codec_encoder.encode(torch.from_numpy(pcm24))
    assert codes.shape == (math.ceil(pcm24.shape[0] / 1920), 16)
    assert torch.equal(codes, ref[f"{name}.codes"])


def test_encoders_alone_equal_the_whole_models_encoders(reference, encoders) -> None:
    model = reference.voice_model("ckpt-base")
    for ours, theirs in (
        (encoders.speaker_encoder, model.speaker_encoder),
        (encoders.codec_encoder, model.codec_encoder),
    ):
        a, b = ours.state_dict(), theirs.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not Path(encoders.config.source, "talker.safetensors").exists()
