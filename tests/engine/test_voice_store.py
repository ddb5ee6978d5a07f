"""The voice store: a saved voice is wholly there or wholly gone, survives a new store on the same root,
keeps its tensors exactly, and every refusal (name, built-in, existing, limits, another save's tensors)
says why; `compute_voice` derives the x-vector (and codes with a transcript) from decoded PCM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.model.qwen3_tts import Qwen3TTS
from engine.model.reference_audio import resample
from engine.model.speaker_encoder import speaker_embedding
from engine.voice_store import ComputedVoice, VoiceLimits, VoiceStore, VoiceStoreError, compute_voice

REPO = Path(__file__).resolve().parents[2]
H = 64


def _voice(seed: int = 0, frames: int | None = None) -> ComputedVoice:
    g = torch.Generator().manual_seed(seed)
    codes = None if frames is None else torch.randint(0, 2048, (frames, 16), generator=g)
    return ComputedVoice(torch.randn(H, generator=g), codes, duration_s=2.0, sample_rate=16000)


def _code(call) -> str:
    with pytest.raises(VoiceStoreError) as caught:
        call()
    return caught.value.code


def test_a_saved_voice_reads_back_exactly_from_a_new_store_and_is_gone_after_delete(tmp_path: Path) -> None:
    voice = _voice(1, frames=25)
    info = VoiceStore(tmp_path).save("my-voice_1", model_id="tiny-base", audio=b"RIFFdata", audio_ext="wav",
                                     voice=voice, transcript="Hello there.")
    again = VoiceStore(tmp_path)  # another process / a restart
    assert again.names() == ["my-voice_1"] and again.info("my-voice_1") == info
    read, embedding, codes = again.tensors("my-voice_1")
    assert torch.equal(embedding, voice.embedding) and torch.equal(codes, voice.ref_codes)
    assert read.transcript == "Hello there." and read.ref_frames == 25 and read.embedding_dim == H
    assert (tmp_path / "my-voice_1" / "reference.wav").read_bytes() == b"RIFFdata"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-voice_1"]  # no staging or temp files left
    again.delete("my-voice_1")
    assert again.names() == [] and list(tmp_path.iterdir()) == []
    assert _code(lambda: again.info("my-voice_1")) == "not_found"
    assert _code(lambda: again.delete("my-voice_1")) == "not_found"


def test_names_built_ins_and_existing_voices_are_refused(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    store.save("alloy", model_id="m", audio=b"a", audio_ext="wav", voice=_voice())
    def save(name: str, **kw: object) -> None:
        store.save(name, model_id="m", audio=b"a", audio_ext="wav", voice=_voice(), **kw)  # type: ignore[arg-type]

    for bad in ("", "Alloy", "../x", ".hidden", "a/b", "x" * 65, "-lead", "sp ace"):
        assert _code(lambda bad=bad: save(bad)) == "bad_name", bad
    assert _code(lambda: save("ryan", reserved=("ryan", "vivian"))) == "reserved"
    assert _code(lambda: save("alloy")) == "exists"
    assert _code(lambda: store.save("ok", model_id="m", audio=b"a", audio_ext="w.v", voice=_voice())) == "bad_audio"
    (tmp_path / ".staging-leftover").mkdir()  # a crashed save: never listed
    assert store.names() == ["alloy"]


def test_limits_on_duration_size_count_and_total_bytes_are_enforced(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path, VoiceLimits(max_voices=2, max_audio_bytes=100, max_total_bytes=2000,
                                              min_seconds=1.0, max_seconds=10.0))  # fmt: skip

    def save(name: str, audio: bytes = b"a", voice: ComputedVoice | None = None) -> None:
        store.save(name, model_id="m", audio=audio, audio_ext="wav", voice=voice or _voice())

    assert _code(lambda: save("big", audio=b"x" * 101)) == "too_large"
    short, long = ComputedVoice(torch.zeros(H), None, 0.5, 16000), ComputedVoice(torch.zeros(H), None, 11.0, 16000)
    assert _code(lambda: save("short", voice=short)) == "too_short"
    assert _code(lambda: save("long", voice=long)) == "too_long"
    save("one")
    store.limits = VoiceLimits(max_voices=2, max_total_bytes=store.total_bytes() + 4 * H + 99)
    assert _code(lambda: save("two", audio=b"x" * 100)) == "full"  # audio + x-vector: 1 byte too many
    save("two", audio=b"x" * 99)
    assert _code(lambda: save("three")) == "too_many"


def test_a_tensor_file_from_another_save_is_refused_as_corrupt(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    store.save("a", model_id="m", audio=b"a", audio_ext="wav", voice=_voice(1))
    store.save("b", model_id="m", audio=b"a", audio_ext="wav", voice=_voice(2))
    (tmp_path / "a" / "embedding.safetensors").write_bytes((tmp_path / "b" / "embedding.safetensors").read_bytes())
    assert _code(lambda: store.tensors("a")) == "corrupt"
    (tmp_path / "b" / "voice.json").write_text(json.dumps({"name": "b"}))
    assert _code(lambda: store.info("b")) == "corrupt"


def test_metadata_operations_import_neither_torch_nor_numpy(tmp_path: Path) -> None:
    VoiceStore(tmp_path).save("a", model_id="m", audio=b"a", audio_ext="wav", voice=_voice())
    code = ("import sys\nfrom engine.voice_store import VoiceStore\n"
            f"s = VoiceStore({str(tmp_path)!r})\nassert s.names() == ['a'] and s.info('a').model_id == 'm'\n"
            "s.delete('a')\nheavy = sorted(m for m in ('torch', 'numpy') if m in sys.modules)\nassert not heavy, heavy\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_compute_voice_gives_the_speaker_encoder_x_vector_and_with_a_transcript_the_codes(
        base_model: Qwen3TTS, tiny_model: Qwen3TTS) -> None:
    rate = 16000
    t = np.arange(int(1.3 * rate)) / rate
    pcm = (0.4 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
    plain = compute_voice(base_model, pcm, rate)
    assert plain.ref_codes is None and plain.sample_rate == rate and plain.duration_s == pytest.approx(1.3)
    assert torch.equal(plain.embedding, speaker_embedding(base_model.speaker_encoder, pcm, rate).float())
    cloned = compute_voice(base_model, pcm, rate, transcript="A sine.")
    pcm24 = resample(pcm, rate, 24000)
    assert torch.equal(cloned.ref_codes, base_model.codec_encoder.encode(torch.from_numpy(pcm24)))
    assert cloned.ref_codes.shape == (-(-pcm24.shape[0] // 1920), 16)
    assert _code(lambda: compute_voice(tiny_model, pcm, rate)) == "wrong_model"  # CustomVoice: no encoder
    assert _code(lambda: compute_voice(base_model, pcm[: rate // 2], rate)) == "too_short"
    assert _code(lambda: compute_voice(base_model, np.full(rate * 2, np.nan, np.float32), rate)) == "bad_audio"
