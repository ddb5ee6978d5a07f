"""Arrival schedules, prompt pools, per-request metrics and summary statistics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from loadtest.metrics import RequestRecord, fill_record
from loadtest.prompts import DEFAULT_POOL, Prompt, load_prompts
from loadtest.runner import ClientStats
from loadtest.schedule import arrival_offsets, build_schedule, prompt_order
from loadtest.summary import distribution, nearest_rank, summarize
from loadtest.trace import RequestFailed, StreamTrace

POOL = [Prompt(f"p{i}", f"prompt number {i}.") for i in range(10)]


def test_the_shipped_pool_is_the_seed_tts_english_set() -> None:
    prompts = load_prompts()
    assert DEFAULT_POOL.name == "seed-tts-eval-en.jsonl"
    assert len(prompts) == 1088
    assert len({p.id for p in prompts}) == 1088


def test_bad_pools_get_clear_errors(tmp_path: Path) -> None:
    cases = {
        "not_json.jsonl": ('{"id": "a", "text": "ok"}\nnope\n', "2: not JSON"),
        "no_text.jsonl": ('{"id": "a"}\n', "non-empty string 'text'"),
        "dup.jsonl": ('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', "duplicate id"),
        "empty.jsonl": ("\n", "no prompts"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_text(content)
        with pytest.raises(ValueError, match=message):
            load_prompts(path)


def test_schedule_is_reproducible_and_seed_dependent() -> None:
    a = build_schedule(POOL, 5.0, 2.0, 20.0, seed=0)
    b = build_schedule(POOL, 5.0, 2.0, 20.0, seed=0)
    c = build_schedule(POOL, 5.0, 2.0, 20.0, seed=1)
    assert a == b
    assert [x.at_s for x in a] != [x.at_s for x in c]


def test_warmup_and_measurement_phases_are_independent_streams() -> None:
    short = [x for x in build_schedule(POOL, 5.0, 1.0, 20.0, seed=3) if x.phase == "measure"]
    long = [x for x in build_schedule(POOL, 5.0, 7.0, 20.0, seed=3) if x.phase == "measure"]
    assert [x.prompt for x in short] == [x.prompt for x in long]
    assert [x.at_s - 1.0 for x in short] == pytest.approx([x.at_s - 7.0 for x in long])
    assert all(x.phase == "warmup" and x.at_s < 7.0 for x in build_schedule(POOL, 5.0, 7.0, 20.0, 3)[:5])


def test_poisson_gaps_have_the_requested_rate_and_exponential_spread() -> None:
    offsets = arrival_offsets(50.0, 400.0, seed=0, phase="measure")
    gaps = np.diff(offsets)
    assert len(offsets) / 400.0 == pytest.approx(50.0, rel=0.03)
    assert gaps.mean() == pytest.approx(0.02, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV = 1
    assert all(0 <= t < 400.0 for t in offsets)


def test_constant_arrivals_are_an_exact_grid() -> None:
    assert arrival_offsets(4.0, 1.0, seed=0, phase="measure", arrival="constant") == [0.0, 0.25, 0.5, 0.75]


def test_prompt_order_cycles_through_the_whole_pool_before_repeating() -> None:
    order = prompt_order(POOL, 25, seed=0, phase="measure")
    assert len(order) == 25
    assert set(order[:10]) == set(POOL) and set(order[10:20]) == set(POOL)
    assert order[:10] != order[10:20]  # each pass is reshuffled


def test_invalid_schedule_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="rps"):
        arrival_offsets(0.0, 1.0, 0, "measure")
    with pytest.raises(ValueError, match="arrival"):
        arrival_offsets(1.0, 1.0, 0, "measure", arrival="bursty")
    with pytest.raises(ValueError, match="duration"):
        build_schedule(POOL, 1.0, 0.0, 0.0, 0)


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert nearest_rank(values, 50) == 50.0
    assert nearest_rank(values, 95) == 95.0
    assert nearest_rank(values, 99) == 99.0
    assert nearest_rank([7.0], 99) == 7.0
    assert nearest_rank([1.0, 2.0, 3.0], 50) == 2.0  # ceil(1.5) = 2nd value
    dist = distribution([3.0, None, 1.0, 2.0])
    assert (dist["count"], dist["missing"], dist["p50"], dist["max"], dist["mean"]) == (3, 1, 2.0, 3.0, 2.0)


def _trace_with_tone(dispatch: float, lead_s: float, arrivals: list[tuple[float, float]]) -> StreamTrace:
    """Audio = lead_s of silence then a -20 dBFS tone, delivered as (arrival, seconds) chunks."""
    rate = 24_000
    total = sum(seconds for _, seconds in arrivals)
    t = np.arange(round(total * rate)) / rate
    signal = np.where(t >= lead_s, 0.1 * np.sin(2 * math.pi * 220 * t), 0.0)
    pcm = (signal * 32767).astype("<i2").tobytes()
    trace = StreamTrace(rate)
    trace.started, trace.dispatch = dispatch - 0.002, dispatch
    offset = 0
    for arrival, seconds in arrivals:
        size = 2 * round(seconds * rate)
        trace.audio(pcm[offset : offset + size], now=arrival)
        offset += size
    trace.end = arrivals[-1][0] + 0.01
    return trace


def test_request_metrics_place_the_onset_on_the_playback_timeline() -> None:
    # dispatch at 10.0; first audio at 10.1 (100 ms playable); 200 ms leading silence but only 150 ms
    # arrive before a gap: playback dries at 10.25, resumes at 10.4, so the onset (at media 190 ms,
    # the first window touching the tone) plays at 10.4 + 0.04 = 10.44 -> TTFA 440 ms.
    trace = _trace_with_tone(10.0, 0.2, [(10.1, 0.15), (10.4, 1.0)])
    record = RequestRecord(0, "measure", "p0", 20, scheduled_s=0.995)
    fill_record(record, trace, run_start=9.0, error=None)
    assert record.ok and record.error_kind is None
    assert record.first_playable_ms == pytest.approx(100.0)
    assert record.ttfb_ms == pytest.approx(100.0)
    assert record.leading_silence_ms == pytest.approx(190.0)
    assert record.ttfa_ms == pytest.approx(440.0)
    assert (record.underruns, record.stall_total_ms) == (1, pytest.approx(150.0))
    assert record.scheduling_lag_ms == pytest.approx(3.0)  # started at 9.998 for an ideal 9.995
    assert record.connect_ms == pytest.approx(2.0)
    assert record.audio_s == pytest.approx(1.15)
    assert record.rtf == pytest.approx(0.41 / 1.15)
    assert not record.stall_failure


def test_long_stalls_mark_a_stall_failure_and_silence_is_an_error() -> None:
    record = RequestRecord(0, "measure", "p0", 20, scheduled_s=0.0)
    fill_record(record, _trace_with_tone(1.0, 0.0, [(1.1, 0.1), (1.8, 0.5)]), 1.0, None)
    assert record.ok and record.stall_failure and record.stall_max_ms == pytest.approx(600.0)

    silent = RequestRecord(1, "measure", "p1", 20, scheduled_s=0.0)
    fill_record(silent, _trace_with_tone(1.0, 5.0, [(1.1, 1.0)]), 1.0, None)
    assert (silent.ok, silent.error_kind) == (False, "silent_audio")

    empty = RequestRecord(2, "measure", "p2", 20, scheduled_s=0.0)
    trace = StreamTrace(24_000)
    trace.dispatch = trace.started
    fill_record(empty, trace, 0.0, None)
    assert (empty.ok, empty.error_kind) == (False, "empty_audio")

    failed = RequestRecord(3, "measure", "p3", 20, scheduled_s=0.0)
    fill_record(failed, trace, 0.0, RequestFailed("http_503", "busy"))
    assert (failed.ok, failed.error_kind, failed.error_message) == (False, "http_503", "busy")


def test_summary_counts_only_measured_requests_and_prices_characters() -> None:
    records = []
    for i in range(4):
        record = RequestRecord(i, "measure", f"p{i}", 100, scheduled_s=float(i))
        fill_record(record, _trace_with_tone(5.0, 0.0, [(5.05 + 0.01 * i, 1.0)]), 0.0, None)
        records.append(record)
    warm = RequestRecord(9, "warmup", "w", 1000, scheduled_s=0.0)
    fill_record(warm, _trace_with_tone(5.0, 0.0, [(6.0, 1.0)]), 0.0, None)
    bad = RequestRecord(10, "measure", "p5", 100, scheduled_s=5.0, error_kind="timeout", error_message="slow")
    summary = summarize([warm, *records, bad], ClientStats(wall_s=1.0, cpu_s=0.25), {"rps": 1}, 10.0, 3.6)
    assert summary["requests"] == {"scheduled": 5, "ok": 4, "failed": 1, "warmup": 1}
    assert summary["offered_rps"] == pytest.approx(0.5)
    assert summary["achieved_rps"] == pytest.approx(0.4)
    assert summary["latency_ms"]["first_playable"]["p50"] == pytest.approx(60.0)
    assert summary["latency_ms"]["first_playable"]["p99"] == pytest.approx(80.0)
    assert summary["errors"]["by_kind"] == {"timeout": 1}
    assert summary["errors"]["examples"] == {"timeout": "slow"}
    assert summary["throughput"]["chars_per_s"] == pytest.approx(40.0)
    # $3.6/h = $0.001/s; 40 chars/s -> 1e6 chars take 25,000 s -> $25
    assert summary["cost"]["usd_per_million_chars"] == pytest.approx(25.0)
    assert summary["client"]["cpu_utilization"] == pytest.approx(0.25)
    json.dumps(summary)  # serialisable as is
