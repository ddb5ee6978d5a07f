"""`python -m engine.synthesize` as a user runs it: a real subprocess writing a real WAV file."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

import numpy as np

from engine.request import length_model_frames

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine.synthesize", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_writes_a_valid_24khz_mono_16bit_wav(tmp_path):
    text = "Hello from the tiny model."
    out = tmp_path / "hello.wav"
    result = _run("--model", "tiny", "--text", text, "--out", str(out), "--seed", "7")
    assert result.returncode == 0, result.stderr
    assert "RTF" in result.stdout
    with wave.open(str(out)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 24000)
        assert wav.getnframes() == length_model_frames(len(text)) * 1920
        samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    assert samples.std() > 100  # audible signal, not silence


def test_cli_reports_bad_input_clearly(tmp_path):
    result = _run("--model", "tiny", "--text", "Hi", "--speaker", "nobody", "--out", str(tmp_path / "x.wav"))
    assert result.returncode == 2
    assert "unknown speaker 'nobody'" in result.stderr
    assert not (tmp_path / "x.wav").exists()
