"""The audible-onset detector on synthetic signals with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadtest.onset import audible_onset, audible_onset_pcm16, pcm16_to_float

RATE = 24_000
HOP = 240


def tone(seconds: float, dbfs: float, hz: float = 220.0) -> np.ndarray:
    """A sine whose RMS is `dbfs`."""
    t = np.arange(round(seconds * RATE)) / RATE
    return (10 ** (dbfs / 20) * math.sqrt(2) * np.sin(2 * math.pi * hz * t)).astype(np.float32)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * RATE), dtype=np.float32)


def test_leading_silence_onset_is_first_window_touching_the_sound() -> None:
    # Tone starts at 300 ms = sample 7200. The window starting at 6960 (290 ms) holds 240 tone samples,
    # RMS about -23 dBFS: active, and so is the next one. The window at 6720 holds none.
    signal = np.concatenate([silence(0.300), tone(1.0, -20.0)])
    assert audible_onset(signal) == 6960


def test_sound_from_the_first_sample_has_onset_zero() -> None:
    assert audible_onset(tone(0.5, -20.0)) == 0


def test_a_short_burst_covered_by_two_windows_is_an_onset() -> None:
    # 240 loud samples at [4800, 5040) lie wholly inside the windows starting at 4560 and 4800.
    signal = silence(2.0)
    signal[4800:5040] = tone(0.010, -20.0)
    assert audible_onset(signal) == 4560


def test_two_windows_rule_rejects_an_isolated_active_window() -> None:
    # Threshold tuned so only a window holding the *whole* 480-sample burst is active: a burst of exactly
    # one window length aligned to a window start (sample 9600) is full in window 9600 only; its
    # neighbours (9360, 9840) hold half of it, 3 dB quieter. Set the burst level 1.5 dB above threshold.
    signal = silence(2.0)
    signal[9600:10080] = tone(0.020, -43.5, hz=1000.0)
    assert audible_onset(signal, threshold_dbfs=-45.0) is None  # one active window only
    assert audible_onset(signal, threshold_dbfs=-45.0, consecutive=1) == 9600


def test_threshold_is_minus_45_dbfs_rms() -> None:
    assert audible_onset(tone(0.5, -44.0)) == 0
    assert audible_onset(tone(0.5, -46.0)) is None


def test_mean_is_removed_before_rms() -> None:
    dc = np.full(RATE, 0.5, dtype=np.float32)
    assert audible_onset(dc) is None
    assert audible_onset(dc + tone(1.0, -30.0)) == 0


def test_all_silence_and_too_short_audio_have_no_onset() -> None:
    assert audible_onset(silence(2.0)) is None
    assert audible_onset(tone(0.015, -10.0)) is None  # shorter than one 20 ms window


def test_late_onset_past_the_scanned_prefix_is_found() -> None:
    signal = np.concatenate([silence(2.5), tone(1.0, -20.0)])
    assert audible_onset(signal) == round(2.5 * RATE) - HOP


def test_pcm16_bytes_give_the_same_onset_as_floats() -> None:
    signal = np.concatenate([silence(1.2), tone(2.0, -20.0)])
    pcm = (signal * 32768).astype("<i2").tobytes()
    assert audible_onset_pcm16(pcm) == audible_onset(pcm16_to_float(pcm)) == round(1.2 * RATE) - HOP
    assert audible_onset_pcm16(pcm + b"\x01") == round(1.2 * RATE) - HOP  # a dangling half sample is ignored


def test_stereo_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="mono"):
        audible_onset(np.zeros((2, 4800), dtype=np.float32))
