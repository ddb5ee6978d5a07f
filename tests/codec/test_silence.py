"""Leading-silence trimming on synthetic signals: onset within one window, nothing after it ever trimmed."""

from __future__ import annotations

import numpy as np
import pytest

from engine.codec.silence import (
    LeadingSilenceTrimmer,
    SilenceConfig,
    first_frame_skip_applies,
    leading_silence_onset,
)

RATE = 24000
WINDOW = 240  # 10 ms


def tone(ms: float, dbfs: float, freq: float = 220.0, phase: float = 0.0) -> np.ndarray:
    """A sine whose RMS is `dbfs` (amplitude = rms * sqrt(2))."""
    n = round(RATE * ms / 1000)
    amplitude = 10 ** (dbfs / 20) * np.sqrt(2)
    return (amplitude * np.sin(2 * np.pi * freq * np.arange(n) / RATE + phase)).astype(np.float32)


def noise(ms: float, dbfs: float, seed: int = 0) -> np.ndarray:
    n = round(RATE * ms / 1000)
    return (np.random.default_rng(seed).standard_normal(n) * 10 ** (dbfs / 20)).astype(np.float32)


def speech_like(ms: float) -> np.ndarray:
    """Syllables: 120 ms tones with an attack ramp, separated by 60 ms gaps of room noise at -70 dBFS."""
    pieces = []
    while sum(len(p) for p in pieces) < RATE * ms / 1000:
        syllable = tone(120, -18, freq=180 + 40 * len(pieces) % 200)
        syllable[:240] *= np.linspace(0, 1, 240, dtype=np.float32)
        pieces += [syllable, noise(60, -70, seed=len(pieces))]
    return np.concatenate(pieces)[: round(RATE * ms / 1000)]


@pytest.mark.parametrize("silence_ms", [0, 5, 10, 37, 80, 333, 1000])
def test_onset_is_found_within_one_window_after_leading_silence_of_any_length(silence_ms):
    lead = noise(silence_ms, -75) if silence_ms else np.zeros(0, np.float32)
    signal = np.concatenate([lead, speech_like(500)])
    true_onset = len(lead)
    onset = leading_silence_onset(signal, threshold_dbfs=-50, window_ms=10)
    assert onset is not None and true_onset - WINDOW < onset <= true_onset


@pytest.mark.parametrize("onset_dbfs", [-45.0, -40.0, -30.0])
def test_quiet_onsets_above_the_threshold_are_kept(onset_dbfs):
    """A soft start (a long quiet lead-in above the threshold) counts as sound from its first window."""
    lead = np.zeros(round(RATE * 0.2), np.float32)
    soft = tone(300, onset_dbfs)
    signal = np.concatenate([lead, soft, speech_like(300)])
    onset = leading_silence_onset(signal, threshold_dbfs=-50)
    assert len(lead) - WINDOW < onset <= len(lead)


def test_sound_below_the_threshold_is_silence_and_all_silence_has_no_onset():
    assert leading_silence_onset(tone(500, -60), threshold_dbfs=-50) is None
    assert leading_silence_onset(np.zeros(RATE, np.float32)) is None
    assert leading_silence_onset(tone(500, -60), threshold_dbfs=-65) == 0


def test_int16_input_is_scaled_and_window_and_threshold_are_configurable():
    signal = np.concatenate([np.zeros(1000, np.float32), tone(100, -20)])
    pcm16 = (signal * 32767).astype(np.int16)
    assert leading_silence_onset(pcm16) == leading_silence_onset(signal) == 960
    assert leading_silence_onset(signal, window_ms=5) == 960
    assert leading_silence_onset(signal, window_ms=20) == 960
    assert leading_silence_onset(signal, window_ms=3) == 936  # 72-sample windows: 13 * 72 <= 1000 < 14 * 72
    with pytest.raises(ValueError):
        leading_silence_onset(signal[:, None])


def stream_through(trimmer: LeadingSilenceTrimmer, signal: np.ndarray, chunk: int) -> np.ndarray:
    out = [trimmer.push(signal[i : i + chunk]) for i in range(0, len(signal), chunk)]
    return np.concatenate(out + [trimmer.finish()])


@pytest.mark.parametrize("chunk", [1920, 480, 100, 7777])
@pytest.mark.parametrize("silence_ms", [0, 15, 250])
def test_streamed_trim_drops_only_leading_silence_and_keeps_a_pause_inside_speech(chunk, silence_ms):
    lead = noise(silence_ms, -80) if silence_ms else np.zeros(0, np.float32)
    speech = np.concatenate(
        [speech_like(300), np.zeros(RATE // 2, np.float32), speech_like(300)]
    )  # 500 ms pause
    signal = np.concatenate([lead, speech])
    trimmer = LeadingSilenceTrimmer(SilenceConfig(threshold_dbfs=-50, window_ms=10))
    out = stream_through(trimmer, signal, chunk)
    dropped = len(signal) - len(out)
    assert dropped == trimmer.trimmed_samples
    assert len(lead) - WINDOW < dropped <= len(lead)  # onset within one window, never late
    np.testing.assert_array_equal(out, signal[dropped:])  # everything after the cut, pause included, intact


def test_trimming_never_exceeds_its_budget_and_can_be_disabled():
    signal = np.concatenate([np.zeros(RATE * 3, np.float32), tone(100, -20)])
    capped = LeadingSilenceTrimmer(SilenceConfig(max_trim_ms=500))
    out = stream_through(capped, signal, 1920)
    assert capped.trimmed_samples == RATE // 2 and len(out) == len(signal) - RATE // 2
    off = LeadingSilenceTrimmer(SilenceConfig(trim_leading=False))
    assert len(stream_through(off, signal, 1920)) == len(signal)


def test_a_stream_that_ends_before_a_full_window_loses_nothing():
    trimmer = LeadingSilenceTrimmer()
    assert len(trimmer.push(np.zeros(100, np.float32))) == 0
    assert len(trimmer.finish()) == 100


def test_silent_first_frame_skip_applies_only_to_real_weights_default_sampling_no_instruct_first_frame():
    base = dict(enabled=True, random_weights=False, default_sampling=True, instruct=False, frames_decoded=0)
    assert first_frame_skip_applies(**base)
    for change in (
        {"enabled": False},
        {"random_weights": True},
        {"default_sampling": False},
        {"instruct": True},
        {"frames_decoded": 1},
    ):
        assert not first_frame_skip_applies(**{**base, **change})
