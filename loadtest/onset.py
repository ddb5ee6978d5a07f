"""Audible onset: the first sample a listener would hear, by short-window RMS.

Definition (the one the field uses, peers.md section 2.2): scan the PCM with 20 ms windows every
10 ms; remove each window's mean, take its RMS on the [-1, 1] scale; a window is *active* at
RMS >= -45 dBFS. The onset is the start of the first window of the first run of 2 consecutive
active windows. Only whole windows are scanned, so audio shorter than two hops plus one window
has no onset.

Window layout at 24 kHz (window 480 samples, hop 240):

    samples  0        240       480       720       960
    w0       [------------------)
    w1                 [-------------------)
    w2                           [-------------------)
"""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 24_000
WINDOW_S = 0.020
HOP_S = 0.010
THRESHOLD_DBFS = -45.0
CONSECUTIVE = 2
# Most speech starts within the first second; scanning that prefix first keeps the common case cheap.
_PREFIX_S = 1.0


def pcm16_to_float(pcm: bytes | bytearray | memoryview) -> np.ndarray:
    """Little-endian PCM16 bytes -> float32 samples in [-1, 1). A trailing odd byte is ignored."""
    usable = len(pcm) - (len(pcm) % 2)
    return np.frombuffer(memoryview(pcm)[:usable], dtype="<i2").astype(np.float32) / 32768.0


def window_rms_dbfs(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Mean-removed RMS of every whole window, in dBFS. Shape: (n_windows,)."""
    window = round(WINDOW_S * sample_rate)
    hop = round(HOP_S * sample_rate)
    if samples.shape[0] < window:
        return np.empty(0, dtype=np.float64)
    frames = np.lib.stride_tricks.sliding_window_view(samples, window)[::hop]  # (n_windows, window)
    rms = frames.std(axis=1, dtype=np.float64)  # std == RMS after removing the mean
    with np.errstate(divide="ignore"):
        return 20.0 * np.log10(rms)


def audible_onset_pcm16(pcm: bytes | bytearray | memoryview, sample_rate: int = SAMPLE_RATE) -> int | None:
    """`audible_onset` of PCM16 bytes, converting only the first second unless the onset lies later."""
    prefix_bytes = 2 * round(_PREFIX_S * sample_rate)
    if len(pcm) > 2 * prefix_bytes:
        found = _first_run(
            pcm16_to_float(memoryview(pcm)[:prefix_bytes]), sample_rate, THRESHOLD_DBFS, CONSECUTIVE
        )
        if found is not None:
            return found
    return audible_onset(pcm16_to_float(pcm), sample_rate)


def audible_onset(
    samples: np.ndarray,
    sample_rate: int = SAMPLE_RATE,
    threshold_dbfs: float = THRESHOLD_DBFS,
    consecutive: int = CONSECUTIVE,
) -> int | None:
    """Sample index of the audible onset of float samples in [-1, 1], or None if nothing is audible."""
    if samples.ndim != 1:
        raise ValueError(f"expected mono samples of shape (n,), got {samples.shape}")
    prefix = round(_PREFIX_S * sample_rate)
    if samples.shape[0] > 2 * prefix:
        found = _first_run(samples[:prefix], sample_rate, threshold_dbfs, consecutive)
        if found is not None:
            return found
    return _first_run(samples, sample_rate, threshold_dbfs, consecutive)


def _first_run(samples: np.ndarray, sample_rate: int, threshold_dbfs: float, consecutive: int) -> int | None:
    active = window_rms_dbfs(samples, sample_rate) >= threshold_dbfs
    if active.shape[0] < consecutive:
        return None
    # runs[i] is True when windows i .. i+consecutive-1 are all active
    runs = np.ones(active.shape[0] - consecutive + 1, dtype=bool)
    for k in range(consecutive):
        runs &= active[k : k + runs.shape[0]]
    hits = np.flatnonzero(runs)
    if hits.shape[0] == 0:
        return None
    return int(hits[0]) * round(HOP_S * sample_rate)
