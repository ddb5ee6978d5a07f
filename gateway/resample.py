"""Streaming sample-rate conversion of the engine's 24 kHz PCM16 to any output rate, through soxr.

One `Resampler` per stream: it keeps soxr's filter state between chunks, so feeding a stream in
pieces gives the same samples as converting it in one call (a test checks this), and
`process(..., last=True)` drains the filter's delay line at the end of the stream.
At 24 kHz it is a pass-through.
"""

from __future__ import annotations

import numpy as np

ENGINE_RATE = 24000
OUTPUT_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)


class Resampler:
    """PCM16 bytes at 24 kHz in, int16 samples at `rate` out."""

    def __init__(self, rate: int, quality: str = "HQ") -> None:
        if rate not in OUTPUT_RATES:
            raise ValueError(
                f"unsupported sample rate {rate}; supported: {', '.join(map(str, OUTPUT_RATES))}"
            )
        self.rate = rate
        self._stream = None
        if rate != ENGINE_RATE:
            import soxr  # small wheel; imported here so 24 kHz-only servers never load it

            # float32 inside, rounded here: soxr's own int16 output is dithered (random), and a
            # stream must give the same samples however it is cut into chunks.
            self._stream = soxr.ResampleStream(ENGINE_RATE, rate, 1, dtype="float32", quality=quality)

    def process(self, pcm: bytes, *, last: bool = False) -> np.ndarray:
        samples = np.frombuffer(pcm, dtype="<i2")
        if self._stream is None:
            return samples
        out = self._stream.resample_chunk(samples.astype(np.float32) / 32768.0, last=last)
        return np.clip(np.rint(out * 32768.0), -32768, 32767).astype(np.int16)
