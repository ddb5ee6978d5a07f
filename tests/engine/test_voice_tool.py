"""`python -m engine.voice_tool`: a recording in a common container becomes a saved voice equal to
`compute_voice` on its decoded, channel-averaged PCM; refusals come back as one JSON line with a code;
from a checkpoint it reads only the encoders (the talker's shard may be absent, the talker never built)."""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.model.qwen3_tts import Qwen3TTS
from engine.voice_store import VoiceStore, compute_voice
from engine.voice_tool import decode_audio, main
from tests.engine.base_checkpoint import forbid_building_the_generation_modules, sharded_without_the_talker

RATE = 16000


def _stereo_wav(path: Path, seconds: float = 1.4) -> np.ndarray:
    """Writes a 16-bit stereo WAV; -> the mono float PCM librosa would load from it (channel mean)."""
    t = np.arange(int(seconds * RATE)) / RATE
    left = (0.5 * np.sin(2 * np.pi * 200 * t) * 32767).astype(np.int16)
    right = (0.2 * np.sin(2 * np.pi * 330 * t) * 32767).astype(np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(np.stack([left, right], axis=1).tobytes())
    return np.stack([left, right]).astype(np.float32).__truediv__(32768.0).mean(axis=0, dtype=np.float32)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    status = main(list(args))
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1, lines
    return status, json.loads(lines[0])


def test_a_recording_becomes_the_voice_compute_voice_gives_for_its_decoded_pcm(
        base_model: Qwen3TTS, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    audio = tmp_path / "ref.wav"
    expected_pcm = _stereo_wav(audio)
    pcm, rate = decode_audio(audio, max_seconds=30)
    assert rate == RATE and np.array_equal(pcm, expected_pcm)
    voices = tmp_path / "voices"
    status, out = _run(capsys, "--model", "tiny-base", "--voices-dir", str(voices), "--transcript", "Two tones.",
                       "--reserved", "ryan", "my-voice", str(audio))
    assert status == 0 and out["ok"] and out["voice"]["name"] == "my-voice" and out["voice"]["model_id"] == "tiny-base"
    info, embedding, codes = VoiceStore(voices).tensors("my-voice")
    assert info.audio_file == "reference.wav" and info.transcript == "Two tones."
    want = compute_voice(base_model, expected_pcm, RATE, "Two tones.")
    assert torch.equal(embedding, want.embedding) and torch.equal(codes, want.ref_codes)

    refusals = {
        "exists": ("--model", "tiny-base", "--voices-dir", str(voices), "my-voice", str(audio)),
        "reserved": ("--model", "tiny-base", "--voices-dir", str(voices), "--reserved", "ryan", "ryan", str(audio)),
        "too_large": ("--model", "tiny-base", "--voices-dir", str(voices), "--max-audio-bytes", "1000", "big", str(audio)),
        "too_long": ("--model", "tiny-base", "--voices-dir", str(voices), "--max-seconds", "0.2", "long", str(audio)),
    }
    garbage = tmp_path / "noise.mp3"
    garbage.write_bytes(b"definitely not audio" * 10)
    refusals["bad_audio"] = ("--model", "tiny-base", "--voices-dir", str(voices), "junk", str(garbage))
    refusals["wrong_model"] = ("--model", "tiny", "--voices-dir", str(voices), "custom", str(audio))
    for code, args in refusals.items():
        status, out = _run(capsys, *args)
        assert status == 1 and out == {"ok": False, "code": code, "message": out["message"]}, (code, out)
    assert VoiceStore(voices).names() == ["my-voice"]


def test_from_a_checkpoint_the_tool_reads_only_the_encoders_and_never_builds_the_talker(
        base_model: Qwen3TTS, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    root = sharded_without_the_talker(tmp_path / "ckpt", base_model)  # the talker's shard is gone
    forbid_building_the_generation_modules(monkeypatch)
    audio = tmp_path / "ref.wav"
    pcm = _stereo_wav(audio)
    voices = tmp_path / "voices"
    status, out = _run(capsys, "--model", str(root), "--voices-dir", str(voices), "--transcript", "Two tones.",
                       "cloned", str(audio))
    assert status == 0 and out["ok"] and out["voice"]["model_id"] == str(root), out
    _, embedding, codes = VoiceStore(voices).tensors("cloned")
    want = compute_voice(base_model, pcm, RATE, "Two tones.")
    assert torch.equal(embedding, want.embedding) and torch.equal(codes, want.ref_codes)
