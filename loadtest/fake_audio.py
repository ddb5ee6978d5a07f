"""What the fake server says and when: a known audio timeline and the pacing of its chunks.

Everything a client measures against the fake is predictable from `FakeVoice`:

    t = request (HTTP) or first append (WS)
    |-- ttfa_ms --|first chunk|chunk|chunk|...   each chunk produced at `speed` x realtime
    audio: [ leading_silence_ms of zeros ][ sine tone at level_dbfs ..................... ]
    length: chars / chars_per_second seconds; optional one-off pause of stall_ms once
    stall_at_ms of audio has been sent.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class FakeVoice:
    sample_rate: int = 24_000
    ttfa_ms: float = 20.0
    leading_silence_ms: float = 30.0
    first_chunk_ms: float = 40.0
    chunk_ms: float = 80.0
    speed: float = 5.0  # audio produced per second of wall time, in seconds
    chars_per_second: float = 14.0
    stall_at_ms: float | None = None
    stall_ms: float = 0.0
    fail_every: int = 0  # every Nth request fails (HTTP 500 / WS error event); 0 = never
    tone_hz: float = 220.0
    level_dbfs: float = -12.0
    max_audio_s: float = 60.0

    def samples_for(self, chars: int) -> int:
        seconds = min(self.max_audio_s, max(chars, 1) / self.chars_per_second)
        return max(1, round(seconds * self.sample_rate))


class ToneBank:
    """The whole audio timeline precomputed once: chunks are slices, so serving them costs no math."""

    def __init__(self, voice: FakeVoice) -> None:
        rate = voice.sample_rate
        lead = round(voice.leading_silence_ms / 1000.0 * rate)
        total = lead + round(voice.max_audio_s * rate) + 1
        t = np.arange(total - lead) / rate
        amplitude = 10 ** (voice.level_dbfs / 20.0) * math.sqrt(2.0)  # sine RMS = level
        tone = amplitude * np.sin(2 * math.pi * voice.tone_hz * t)
        pcm = np.concatenate([np.zeros(lead), tone])
        self.pcm = (np.clip(pcm, -1.0, 1.0 - 1 / 32768) * 32768).astype("<i2").tobytes()

    def slice(self, start: int, end: int) -> bytes:
        return self.pcm[2 * start : 2 * end]


class Producer:
    """Paces one stream's chunks: absolute schedule at `speed` x realtime after `ttfa_ms`, optional stall."""

    def __init__(self, voice: FakeVoice) -> None:
        self.voice = voice
        self.start = time.monotonic() + voice.ttfa_ms / 1000.0
        self.sent = 0
        self.stalled = False

    def next_size(self, available: int) -> int:
        rate = self.voice.sample_rate
        size_ms = self.voice.first_chunk_ms if self.sent == 0 else self.voice.chunk_ms
        size = min(available - self.sent, max(1, round(size_ms / 1000.0 * rate)))
        stall_at = self.voice.stall_at_ms
        if stall_at is not None and not self.stalled:
            boundary = round(stall_at / 1000.0 * rate)
            if self.sent < boundary:
                size = min(size, boundary - self.sent)
        return size

    async def wait_turn(self) -> None:
        """Sleep until the next chunk is due."""
        rate = self.voice.sample_rate
        stall_at = self.voice.stall_at_ms
        if stall_at is not None and not self.stalled and self.sent >= round(stall_at / 1000.0 * rate):
            self.stalled = True
            self.start += self.voice.stall_ms / 1000.0
        due = self.start + self.sent / rate / self.voice.speed
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
