"""Reference-code parity: reference PCM -> 16-codebook codes of the 12 Hz tokenizer's encoder, vs the official.

The official codes are `create_voice_clone_prompt((pcm, rate)).ref_code` on the tiny Base checkpoint
(librosa resampling to 24 kHz, then `Qwen3TTSTokenizerV2Model.encode`: transformers' MimiModel, first 16
codebooks, ceil(n / 1920) frames). The 11 s clip has 330 transformer frames at 25 Hz, more than the
configured 250-frame sliding window, which the official encoder does not apply.
"""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.codec.encoder_weights import expected_encoder_tensor_table, load_codec_encoder
from engine.model.reference_audio import resample

AUDIOS = ["a24k", "a16k", "a44k", "long24k"]


@pytest.mark.parametrize("name", AUDIOS)
def test_reference_codes_equal_the_official_encode_exactly(reference, voices, name: str) -> None:
    meta, ref = voices
    model = reference.voice_model("ckpt-base")
    pcm24 = resample(ref[f"audio.{name}"].numpy(), meta["audios"][name]["rate"], 24000)
    ours = model.codec_encoder.encode(torch.from_numpy(pcm24))
    theirs = ref[f"{name}.codes"]
    assert ours.shape == theirs.shape == (math.ceil(pcm24.shape[0] / 1920), 16)
    assert len(set(theirs[:, 0].tolist())) > theirs.shape[0] // 2, "degenerate reference codes"
    mismatched = (ours != theirs).sum().item()
    assert mismatched == 0, f"{mismatched} of {ours.numel()} codes differ"


def test_the_long_clip_exceeds_the_configured_encoder_window(reference, voices) -> None:
    meta, _ = voices
    model = reference.voice_model("ckpt-base")
    frames_25hz = math.ceil(meta["audios"]["long24k"]["samples"] / 960)
    assert frames_25hz > model.config.codec_encoder.sliding_window


def test_encoder_tensor_table_equals_the_checkpoint_and_a_missing_tensor_is_named(
    reference, tmp_path
) -> None:
    source = reference.checkpoint("base") / "speech_tokenizer"
    tensors = load_file(str(source / "model.safetensors"))
    model = reference.voice_model("ckpt-base")
    expected = expected_encoder_tensor_table(model.config.codec_encoder)
    assert expected == {k: tuple(v.shape) for k, v in tensors.items() if k.startswith("encoder.")}
    broken = tmp_path / "speech_tokenizer"
    broken.mkdir()
    (broken / "config.json").write_text((source / "config.json").read_text())
    name = "encoder.downsample.conv.weight"
    save_file({k: v for k, v in tensors.items() if k != name}, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        load_codec_encoder(tmp_path)
