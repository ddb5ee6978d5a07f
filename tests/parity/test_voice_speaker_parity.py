"""Speaker embedding parity: reference PCM -> resampled PCM -> log-mel -> ECAPA-TDNN x-vector, vs the official path.

The official values come from `Qwen3TTSModel.create_voice_clone_prompt((pcm, rate))` on the tiny Base
checkpoint (librosa soxr_hq resampling to 24 kHz, `mel_spectrogram`, `Qwen3TTSSpeakerEncoder`), fp32.
Audio at 24, 16 and 44.1 kHz (the last one hits librosa's `ceil(n * ratio)` rounding), and an 11 s clip.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.model.reference_audio import mel_filterbank, resample, speaker_mel
from engine.model.speaker_encoder import speaker_embedding

AUDIOS = ["a24k", "a16k", "a44k", "long24k"]


@pytest.mark.parametrize("name", AUDIOS)
def test_resampled_reference_pcm_equals_librosa_soxr_hq_bit_for_bit(voices, name: str) -> None:
    meta, ref = voices
    pcm = ref[f"audio.{name}"].numpy()
    ours = resample(pcm, meta["audios"][name]["rate"], 24000)
    assert ours.dtype == np.float32
    assert torch.equal(torch.from_numpy(ours), ref[f"{name}.pcm24k"])


@pytest.mark.parametrize("name", AUDIOS)
def test_speaker_mel_equals_the_official_mel_spectrogram_bit_for_bit(voices, name: str) -> None:
    _, ref = voices
    ours = speaker_mel(ref[f"{name}.pcm24k"])
    assert ours.shape == ref[f"{name}.mel"].shape
    assert torch.equal(ours, ref[f"{name}.mel"])


@pytest.mark.parametrize("name", AUDIOS)
def test_speaker_embedding_equals_the_official_x_vector_in_fp32(reference, voices, name: str) -> None:
    meta, ref = voices
    model = reference.voice_model("ckpt-base")
    ours = speaker_embedding(
        model.speaker_encoder, ref[f"audio.{name}"].numpy(), meta["audios"][name]["rate"]
    )
    theirs = ref[f"{name}.spk"]
    assert ours.shape == theirs.shape == (model.config.talker.hidden_size,)
    assert torch.equal(ours, theirs), f"max |diff| {float((ours - theirs).abs().max()):.3g}"


def test_speaker_embedding_in_bf16_stays_close_to_the_fp32_official(reference, voices) -> None:
    meta, ref = voices
    model = reference.voice_model("ckpt-base", torch.bfloat16)
    ours = speaker_embedding(model.speaker_encoder, ref["audio.a24k"].numpy(), 24000)
    assert ours.dtype == torch.bfloat16
    theirs = ref["a24k.spk"]
    assert float((ours.float() - theirs).norm() / theirs.norm()) < 2e-2


def test_mel_filterbank_is_slaney_normalised_and_covers_0_to_12_khz() -> None:
    basis = mel_filterbank()
    assert basis.shape == (128, 513) and basis.dtype == np.float32
    assert (basis >= 0).all() and (basis.max(axis=1) > 0).all()  # no empty band
    assert basis[:, 0].sum() == 0  # the first band starts at 0 Hz with weight 0
    area_hz = basis.astype(np.float64).sum(axis=1) * (24000 / 1024)
    assert np.allclose(area_hz, 1.0, atol=0.1)  # Slaney norm: unit area per band (up to bin sampling)
