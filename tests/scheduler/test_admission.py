"""Admission refuses, with a reason, work that would break promises; and malformed requests."""

from __future__ import annotations

import json

import pytest

from engine.ipc.messages import Layout
from engine.request import Phase, RequestState
from engine.scheduling import DEFAULT_COSTS, CostModel, Outcome, Scheduler, SchedulerConfig

from .helpers import MS, admit, make_request, make_scheduler, run, step


def _slow_costs(factor: float) -> CostModel:
    table = json.loads(DEFAULT_COSTS.read_text())
    for kind in ("talker_decode", "code_predict", "talker_prefill"):
        table[kind]["ms"] = [m * factor for m in table[kind]["ms"]]
    table["codec_chunk"]["ms"] = [[m * factor for m in row] for row in table["codec_chunk"]["ms"]]
    return CostModel(table)


def test_admits_under_light_load_with_a_prediction():
    scheduler = make_scheduler()
    admission = scheduler.admit(make_request(1), 0)
    assert admission.ok and 0 < admission.predicted_ttfa_ms < 100 and 0 < admission.utilization < 0.2


def test_refuses_when_playing_streams_could_no_longer_be_kept_real_time():
    # A GPU 4x slower than the table: a few dozen streams need all of it to stay real-time.
    scheduler = Scheduler(SchedulerConfig(length_model=True, ttfa_budget_ms=10_000), _slow_costs(4.0))
    admitted = 0
    for rid in range(1, 200):
        admission = scheduler.admit(make_request(rid, tokens=100, chars=500), 0)
        if not admission.ok:
            break
        admitted += 1
    assert 0 < admitted < 199
    assert admission.code == "overloaded" and "real-time" in admission.reason
    assert admission.utilization > scheduler.config.max_utilization
    assert scheduler.realtime_utilization(admitted) <= scheduler.config.max_utilization


def test_refuses_when_the_predicted_time_to_first_audio_breaks_the_budget():
    scheduler = make_scheduler(ttfa_budget_ms=60.0, max_utilization=1.0)
    refused = None
    for rid in range(1, 200):
        admission = scheduler.admit(make_request(rid), 0)
        if not admission.ok:
            refused = admission
            break
    assert refused is not None and "time to first audio" in refused.reason
    assert refused.predicted_ttfa_ms > 60.0


def test_refuses_while_the_oldest_newcomer_still_waits_past_the_budget():
    scheduler = make_scheduler(ttfa_budget_ms=100.0)
    admit(scheduler, make_request(1, arrival_ns=0))
    later = 150 * MS  # request 1 got no GPU time yet (no plan ran): it has waited 150 ms
    admission = scheduler.admit(make_request(2, arrival_ns=later), later)
    assert not admission.ok and admission.predicted_ttfa_ms >= 150.0


def test_refuses_when_slots_run_out_and_admits_again_once_freed():
    scheduler = make_scheduler(max_requests=2, max_codec_streams=2)
    first = admit(scheduler, make_request(1))
    admit(scheduler, make_request(2))
    refused = scheduler.admit(make_request(3), 0)
    assert not refused.ok and refused.code == "overloaded" and "KV slots" in refused.reason
    run(scheduler, 0, lambda: first.is_ended)
    assert scheduler.admit(make_request(3), 0).ok


def test_refuses_malformed_requests_with_a_clear_reason():
    scheduler = make_scheduler()
    cases = [
        (make_request(1, tokens=0, chars=0), "empty"),
        (make_request(2, ended=False, layout=Layout.NON_STREAMING, prefill_len=30), "whole text"),
        (make_request(3, prefill_len=5000), "prefill tokens"),
    ]
    for request, words in cases:
        admission = scheduler.admit(request, 0)
        assert not admission.ok and admission.code == "bad_request" and words in admission.reason
    admit(scheduler, make_request(4))
    duplicate = scheduler.admit(make_request(4), 0)
    assert not duplicate.ok and "already running" in duplicate.reason
    assert scheduler.kv_slots.free_count == scheduler.kv_slots.size - 1  # refusals hold nothing


def _run_late(scheduler: Scheduler, now_ns: int, slowdown: float) -> int:
    """Drive every request to the end with steps `slowdown` times slower than predicted (a cold GPU)."""
    while (plan := scheduler.plan(now_ns)) is not None:
        now_ns += int(plan.predicted_ms * slowdown * MS)
        scheduler.complete(plan, Outcome(), now_ns)
    scheduler.pop_finished()
    return now_ns


def test_pressure_left_by_finished_streams_does_not_refuse_an_idle_engine():
    scheduler = make_scheduler(max_utilization=1.0, ttfa_budget_ms=10_000)
    for rid in (1, 2, 3):
        admit(scheduler, make_request(rid, chars=120, tokens=30))
    now = _run_late(scheduler, 0, slowdown=8.0)
    assert scheduler.pressure > scheduler.config.max_pressure  # the late run left its mark...
    assert scheduler.admit(make_request(4), now).ok  # ...but nothing is playing, so nothing can break


def test_pressure_refuses_while_streams_play_until_history_is_reset():
    scheduler = make_scheduler(max_utilization=1.0, ttfa_budget_ms=10_000)
    for rid in (1, 2, 3):
        admit(scheduler, make_request(rid, chars=120, tokens=30))
    now = _run_late(scheduler, 0, slowdown=8.0)
    admit(scheduler, make_request(4, arrival_ns=now, chars=400, tokens=90), now)  # a stream now playing
    refused = scheduler.admit(make_request(5, arrival_ns=now), now)
    assert not refused.ok and "near their deadlines" in refused.reason
    scheduler.reset_history()
    assert scheduler.pressure == 0.0 and scheduler.admit(make_request(5, arrival_ns=now), now).ok


def test_a_pressure_refusal_says_which_kinds_of_work_the_rescues_were():
    scheduler = make_scheduler(max_utilization=1.0, ttfa_budget_ms=10_000)
    for rid in (1, 2, 3):
        admit(scheduler, make_request(rid, chars=120, tokens=30))
    now = _run_late(scheduler, 0, slowdown=8.0)
    admit(scheduler, make_request(4, arrival_ns=now, chars=400, tokens=90), now)
    parts = scheduler.rescues.share_by_kind()
    assert sum(parts.values()) == pytest.approx(scheduler.pressure)
    counted = sorted((k for k, share in parts.items() if share >= 0.005), key=lambda k: -parts[k])
    assert counted  # the late run's rescues were of some kind
    refused = scheduler.admit(make_request(5, arrival_ns=now), now)
    named = [k.label for k in counted]
    positions = [refused.reason.index(f"{label} ") for label in named]
    assert positions == sorted(positions)  # largest share first
    scheduler.reset_history()
    assert not any(scheduler.rescues.share_by_kind().values())


def _near_its_deadline_after_first_audio(text_ended: bool) -> tuple[Scheduler, RequestState, int]:
    """One playing stream whose listener is 30 ms from running dry, generating its next frames: streamed text
    that ran out after the first audio (then more came), or a whole text."""
    scheduler = make_scheduler(max_utilization=1.0, ttfa_budget_ms=10_000)
    r = admit(scheduler, make_request(1, tokens=3 if not text_ended else 40, chars=200, ended=text_ended))
    _, now = run(scheduler, 0, lambda: r.first_audio_ns is not None and r.frames_generated >= 3)
    if not text_ended:
        _, now = run(scheduler, now, lambda: r.phase is Phase.WAITING_TEXT)
        scheduler.append_text(1, range(200, 240), 180)
    scheduler.reset_history()
    scheduler.set_deadline(1, now + 30 * MS)
    plans, now = run(scheduler, now, lambda: r.frames_generated >= 12)
    assert plans
    return scheduler, r, now


def test_pressure_counts_rescue_work_for_the_gpu_but_not_for_text_that_came_late():
    # Both streams are as near their deadlines; only the whole-text one is there for want of GPU time.
    starved, _, _ = _near_its_deadline_after_first_audio(text_ended=False)
    gpu_bound, _, _ = _near_its_deadline_after_first_audio(text_ended=True)
    assert gpu_bound.pressure > gpu_bound.config.max_pressure
    assert starved.pressure == 0.0


def test_a_stream_short_of_text_counts_again_once_its_buffer_was_healthy():
    scheduler, r, now = _near_its_deadline_after_first_audio(text_ended=False)
    assert r.text_starved
    scheduler.set_deadline(1, now + 10_000 * MS)  # its text caught up: seconds of audio ahead of the listener
    step(scheduler, now)
    assert not r.text_starved
    scheduler.reset_history()
    scheduler.set_deadline(1, now + 30 * MS)  # near its deadline again, now with all the text it needs
    run(scheduler, now, lambda: r.frames_generated >= 20)
    assert scheduler.pressure > scheduler.config.max_pressure
