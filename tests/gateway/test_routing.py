"""Routing by predicted wait: (in flight + 1 + queued) x frame time, lowest wins; and two real
(fake-engine) processes of unequal speed share requests by speed, not evenly."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter

import pytest

from engine.ipc.messages import Done, Error, Submit
from gateway.engines import EnginePool, EngineRequest
from gateway.metrics import GatewayMetrics
from gateway.routing import PER_FRAME_KINDS, EngineLoad, choose, frame_ms_sample, smoothed_frame_ms
from gateway.settings import Settings


def route(loads: list[EngineLoad], requests: int) -> list[int]:
    """How many of `requests` arrivals each engine takes, none finishing meanwhile."""
    loads = list(loads)
    for _ in range(requests):
        i = choose(loads)
        loads[i] = dataclasses.replace(loads[i], in_flight=loads[i].in_flight + 1)
    return [load.in_flight for load in loads]


def test_engines_of_equal_speed_get_the_fewest_in_flight_first() -> None:
    assert (
        choose([EngineLoad(3, frame_ms=20.0), EngineLoad(1, frame_ms=20.0), EngineLoad(2, frame_ms=20.0)])
        == 1
    )
    assert route([EngineLoad(0, frame_ms=20.0)] * 3, 9) == [3, 3, 3]


def test_a_tie_goes_to_fewer_in_flight_then_to_the_lower_index() -> None:
    assert choose([EngineLoad(3, frame_ms=5.0), EngineLoad(0, frame_ms=20.0)]) == 1  # 4 x 5 == 1 x 20
    assert choose([EngineLoad(0), EngineLoad(0)]) == 0


def test_an_engine_k_times_slower_takes_about_one_kth_of_the_others_requests() -> None:
    assert route([EngineLoad(0, frame_ms=5.0), EngineLoad(0, frame_ms=20.0)], 20) == [16, 4]
    assert route([EngineLoad(0, frame_ms=30.0), EngineLoad(0, frame_ms=10.0)], 40) == [10, 30]


def test_requests_waiting_for_a_slot_count_twice() -> None:
    # Equal speed and load, but engine 0 has 2 of its 4 requests waiting for a slot: 7 x 10 > 5 x 10.
    assert choose([EngineLoad(4, queued=2, frame_ms=10.0), EngineLoad(4, frame_ms=10.0)]) == 1
    # A heartbeat is up to a second old: an engine cannot have more waiting than it was sent.
    assert choose([EngineLoad(1, queued=9, frame_ms=10.0), EngineLoad(2, frame_ms=10.0)]) == 0


def test_an_engine_never_measured_is_assumed_as_fast_as_the_fastest() -> None:
    assert choose([EngineLoad(1, frame_ms=10.0), EngineLoad(0)]) == 1
    assert choose([EngineLoad(1, frame_ms=10.0), EngineLoad(1, frame_ms=30.0), EngineLoad(1)]) == 0
    assert route([EngineLoad(0), EngineLoad(0)], 4) == [2, 2]  # nobody measured: in-flight counts alone


def test_the_frame_time_is_a_talker_decode_plus_a_code_predict_step() -> None:
    stats = {"talker_decode": (8.0, 12.0), "code_predict": (8.0, 9.0), "talker_prefill": (2.0, 40.0),
             "codec_chunk": (4.0, 6.0), "slots.kv": (10.0, 64.0)}  # fmt: skip
    assert frame_ms_sample(stats) == 21.0
    assert frame_ms_sample({"talker_decode": (1.0, 7.5)}) == 7.5
    assert frame_ms_sample({"slots.kv": (10.0, 64.0)}) is None  # an idle engine ran no steps
    assert frame_ms_sample({"talker_decode": (1.0, 0.0)}) is None


def test_the_frame_time_is_device_time_per_plan_between_heartbeats_when_engines_report_it() -> None:
    # Host step times measure launches only (the loop never waits); cumulative gpu.<kind> figures
    # (plans, device seconds) are what the GPU spent: 10 plans of 3 ms talker, 10 of 4 ms predictor.
    before = {"gpu.talker_decode": (100.0, 0.5), "gpu.code_predict": (100.0, 0.6), "talker_decode": (8.0, 0.2)}
    now = {"gpu.talker_decode": (110.0, 0.53), "gpu.code_predict": (110.0, 0.64), "talker_decode": (8.0, 0.2),
           "code_predict": (8.0, 0.1)}  # fmt: skip
    assert frame_ms_sample(now, before) == pytest.approx(7.0)
    assert frame_ms_sample(now) == pytest.approx(0.3)  # no earlier heartbeat: host step times stand in
    idle = {"gpu.talker_decode": (110.0, 0.53), "gpu.code_predict": (110.0, 0.64)}
    assert frame_ms_sample(idle, now) is None  # no plan finished in between: nothing measured
    assert smoothed_frame_ms(9.0, now, before) == pytest.approx(8.0)


def test_the_frame_time_follows_heartbeats_smoothly_and_survives_idle_ones() -> None:
    frame_ms = smoothed_frame_ms(None, {"talker_decode": (1.0, 20.0)})
    assert frame_ms == 20.0  # the first measurement is taken as it is
    frame_ms = smoothed_frame_ms(frame_ms, {"talker_decode": (1.0, 10.0)})
    assert frame_ms == 15.0  # half way to the newest
    assert smoothed_frame_ms(frame_ms, {}) == 15.0


# ---------------------------------------------------------------- two engine processes


def fake_engines(*ms_per_frame: float) -> EnginePool:
    """A pool of fake engines, engine i generating one frame per request every ms_per_frame[i]."""
    base = Settings(fake_engine=True, engines=len(ms_per_frame), engine_start_timeout_s=30.0)
    pool = EnginePool(base, GatewayMetrics())
    for slot, ms in zip(pool.slots, ms_per_frame, strict=True):  # test-only: each its own speed
        slot.settings = dataclasses.replace(base, engine_args=(f"--ms-per-frame={ms}", "--heartbeat-s=0.05"))
    return pool


async def finish(request: EngineRequest) -> None:
    while not isinstance(await asyncio.wait_for(request.events.get(), 10), Done | Error):
        pass
    request.release()


async def test_two_engines_of_unequal_speed_share_requests_by_speed_not_evenly() -> None:
    pool = fake_engines(5.0, 20.0)
    pool.start()
    try:
        assert await pool.wait_ready(30)
        # One request on each engine: 56 characters are 50 frames, so a few heartbeats measure it.
        await asyncio.gather(*(finish(slot.submit(Submit(0, "ryan", "english", (1,), 56, True)))
                               for slot in pool.slots))  # fmt: skip
        assert [slot.load.frame_ms for slot in pool.slots] == [5.0, 20.0]
        # 20 arrivals whose text has not ended: each stays in flight, waiting for more text.
        requests = [pool.submit(Submit(0, "ryan", "english", (1,), 56, False)) for _ in range(20)]
        taken = Counter(request.slot.index for request in requests)
        assert taken == {0: 16, 1: 4}  # fewest in flight would have split them 10 / 10
        for request in requests:
            request.cancel()
        await asyncio.gather(*(finish(request) for request in requests))
        assert [slot.in_flight for slot in pool.slots] == [0, 0]
    finally:
        await pool.close()


def test_the_per_frame_kinds_are_step_figures_the_engine_reports() -> None:
    from engine.request import WorkKind  # WorkKind.label: the engine's names for Heartbeat.step_stats

    assert set(PER_FRAME_KINDS) <= {k.label for k in WorkKind}


def test_cumulative_heartbeat_totals_are_not_frame_times() -> None:
    # "gpu.*" / "host.*" / "codec.*" are totals since the engine started (gateway counters), not step means.
    totals = {
        "gpu.talker_decode": (5000.0, 40.0),
        "gpu.code_predict": (5000.0, 60.0),
        "host.plan": (9.0, 1.0),
    }
    assert frame_ms_sample(totals) is None
    assert smoothed_frame_ms(12.0, totals) == 12.0
