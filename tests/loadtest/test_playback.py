"""The zero-buffer playback simulator on arrival schedules with known answers."""

from __future__ import annotations

import pytest

from loadtest.playback import PlaybackSimulator

RATE = 1000  # 1 sample per ms keeps the arithmetic readable


def simulate(chunks: list[tuple[float, int]]) -> PlaybackSimulator:
    sim = PlaybackSimulator(RATE)
    for arrival, samples in chunks:
        sim.add(arrival, samples)
    return sim


def test_audio_faster_than_realtime_never_stalls() -> None:
    sim = simulate([(0.0, 100), (0.05, 100), (0.10, 100), (0.15, 100)])
    assert sim.start_time == 0.0
    assert (sim.underruns, sim.total_stall, sim.max_stall) == (0, 0.0, 0.0)
    assert sim.time_of_sample(399) == pytest.approx(0.399)


def test_a_stall_in_the_middle_is_one_underrun_and_shifts_later_samples() -> None:
    # 200 ms of audio by t=0.05; it runs dry at t=0.2; the next chunk comes at t=0.5: a 300 ms stall.
    sim = simulate([(0.0, 100), (0.05, 100), (0.5, 100), (0.55, 100)])
    assert sim.underruns == 1
    assert sim.total_stall == pytest.approx(0.3)
    assert sim.max_stall == pytest.approx(0.3)
    assert sim.time_of_sample(199) == pytest.approx(0.199)  # before the stall: on schedule
    assert sim.time_of_sample(200) == pytest.approx(0.5)  # first sample after it plays on arrival
    assert sim.time_of_sample(399) == pytest.approx(0.699)


def test_several_stalls_are_counted_and_summed() -> None:
    sim = simulate([(0.0, 50), (0.1, 50), (0.3, 50)])  # dry at .05 -> +.05; dry at .15 -> +.15
    assert sim.underruns == 2
    assert sim.stalls == pytest.approx([0.05, 0.15])
    assert sim.total_stall == pytest.approx(0.2)
    assert sim.max_stall == pytest.approx(0.15)


def test_a_chunk_arriving_exactly_when_the_buffer_runs_dry_is_not_an_underrun() -> None:
    sim = simulate([(0.0, 100), (0.1, 100)])
    assert sim.underruns == 0


def test_playback_starts_at_the_first_chunk_not_at_time_zero() -> None:
    sim = simulate([(2.0, 100), (2.05, 100)])
    assert sim.start_time == 2.0
    assert sim.time_of_sample(0) == 2.0
    assert sim.underruns == 0


def test_leading_silence_before_a_stall_puts_the_onset_after_the_stall() -> None:
    # The audible TTFA case: onset at media sample 250 (250 ms of leading silence), but only 200 ms
    # arrived before a 300 ms stall, so the onset plays at 0.5 + 0.05 = 0.55, not at 0.25.
    sim = simulate([(0.0, 200), (0.5, 300)])
    assert sim.time_of_sample(250) == pytest.approx(0.55)


def test_played_and_buffered_samples_follow_the_timeline() -> None:
    sim = simulate([(0.0, 100), (0.3, 100)])  # plays 0..0.1, stalls 0.1..0.3, plays 0.3..0.4
    assert sim.played_samples(-1.0) == 0
    assert sim.played_samples(0.05) == 50
    assert sim.played_samples(0.2) == 100  # during the stall
    assert sim.played_samples(0.35) == 150
    assert sim.played_samples(9.0) == 200
    assert sim.buffered_samples(0.35) == 50


def test_empty_chunks_change_nothing_and_out_of_order_arrivals_are_rejected() -> None:
    sim = simulate([(0.0, 0)])
    assert not sim.started and sim.start_time is None and sim.total_samples == 0
    sim.add(0.1, 10)
    with pytest.raises(ValueError, match="arrival order"):
        sim.add(0.05, 10)
    with pytest.raises(ValueError, match="outside received audio"):
        sim.time_of_sample(10)
