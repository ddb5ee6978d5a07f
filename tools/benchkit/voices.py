"""The benchmark's cloned voices: write one synthetic reference recording and save the bench voices
from it through the public API (`POST /v1/audio/voices`), one record per voice.

Two voices from the same recording: `bench-xvector` (no transcript: the speaker's x-vector only) and
`bench-in-context` (with a transcript: the x-vector plus the reference's codec codes, which every
request's prompt then carries). The recording is deterministic for a seed: 5 s of 24 kHz 16-bit mono,
a harmonic series whose pitch glides between 120 and 220 Hz under a syllable-rate envelope, with a
little noise, so the encoders see something voice-like rather than a pure tone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from engine.synthesize import write_wav

REFERENCE_RATE = 24_000
REFERENCE_S = 5.0
TRANSCRIPT = "The quick brown fox jumps over the lazy dog, and then it runs back home."


@dataclass(frozen=True, slots=True)
class BenchVoice:
    name: str
    transcript: str | None  # None: an x-vector voice; text: an in-context voice


BENCH_VOICES = (BenchVoice("bench-xvector", None), BenchVoice("bench-in-context", TRANSCRIPT))


def reference_pcm(seed: int = 0, seconds: float = REFERENCE_S, rate: int = REFERENCE_RATE) -> np.ndarray:
    """float mono samples in [-0.5, 0.5] of the synthetic reference voice (peak at -6 dBFS)."""
    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * rate)) / rate
    f0 = 170.0 - 50.0 * np.cos(2 * np.pi * t / seconds * 1.5)  # 120 .. 220 Hz and back, one and a half glides
    phase = 2 * np.pi * np.cumsum(f0) / rate
    # Harmonics falling off like a glottal source, a little emphasis near 500 and 1500 Hz (formant-ish).
    harmonics = sum(np.sin(k * phase + rng.uniform(0, 2 * np.pi)) / k
                    * (1.0 + 0.8 * np.exp(-(((k * f0 - 500) / 200) ** 2)) + 0.5 * np.exp(-(((k * f0 - 1500) / 300) ** 2)))
                    for k in range(1, 16))  # fmt: skip
    syllables = np.clip(np.sin(2 * np.pi * 3.7 * t + rng.uniform(0, 2 * np.pi)), 0.0, None) ** 0.6
    fade = np.clip(np.minimum(t, seconds - t) / 0.05, 0.0, 1.0)  # 50 ms in and out
    signal = harmonics * (0.25 + 0.75 * syllables) * fade + 0.02 * rng.standard_normal(t.size)
    return signal / np.abs(signal).max() * 0.5


def write_reference(path: Path, seed: int = 0) -> dict[str, Any]:
    """Write the reference WAV; what bench.json records of it."""
    pcm = reference_pcm(seed)
    write_wav(path, pcm, REFERENCE_RATE)  # 16-bit mono
    return {"file": path.name, "duration_s": pcm.size / REFERENCE_RATE, "sample_rate": REFERENCE_RATE,
            "bytes": path.stat().st_size, "seed": seed}  # fmt: skip


def _answer(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text[:1000]


def save_voice(url: str, voice: BenchVoice, reference: Path, timeout_s: float) -> dict[str, Any]:
    """Save one voice; its record: name, transcript, HTTP status (0: no answer), seconds, the server's
    answer. A voice of that name left by an earlier run (409) is deleted and saved again, so the voice
    is always this run's (an --out reused, or a server given with --url)."""
    form = {"name": voice.name} | ({"transcript": voice.transcript} if voice.transcript else {})
    record: dict[str, Any] = {"name": voice.name, "transcript": voice.transcript}
    started = time.monotonic()

    def post() -> httpx.Response:
        files = {"audio": (reference.name, reference.read_bytes(), "audio/wav")}
        return httpx.post(f"{url}/v1/audio/voices", data=form, files=files, timeout=timeout_s)

    try:
        response = post()
        if response.status_code == 409:
            httpx.delete(f"{url}/v1/audio/voices/{voice.name}", timeout=30.0).raise_for_status()
            record["replaced"] = True
            response = post()
    except httpx.HTTPError as error:
        return record | {"status": 0, "seconds": round(time.monotonic() - started, 1), "ok": False,
                         "error": f"{type(error).__name__}: {error}"}  # fmt: skip
    return record | {"status": response.status_code, "seconds": round(time.monotonic() - started, 1),
                     "ok": response.status_code in (200, 201), "response": _answer(response)}  # fmt: skip
