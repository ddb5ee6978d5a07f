"""Plans in flight: the loop launches work without waiting for the device, finishes a plan only when its end
event fires, and accounts device time per work kind from those events.

On a CPU the executors are synchronous, so these tests stand in a device whose events fire only when the test
says (or when the loop blocks on one): the loop must then hold a deferred plan's rows busy, publish its audio
only once it has finished, keep at most `max_in_flight` plans queued, and still produce exactly the reference
audio."""

from __future__ import annotations

import gc

import numpy as np

from engine.executors.inflight import DeviceTimeline, InFlight
from engine.model.qwen3_tts import Qwen3TTS
from engine.request import WorkKind
from engine.scheduling import Lane, Plan, PlanRow
from tests.engine.helpers import SENTENCES, make_loop, reference, run_to_completion, submit


class SlowEvent:
    """A CUDA event stand-in: fires after `polls` queries, or at once when waited on."""

    def __init__(self, polls: int = 3, ms: float = 2.0) -> None:
        self.polls, self.ms, self.waited = polls, ms, False

    def query(self) -> bool:
        self.polls -= 1
        return self.polls < 0 or self.waited

    def synchronize(self) -> None:
        self.waited = True

    def elapsed_time(self, end: SlowEvent) -> float:
        return end.ms


def _plan(kind: WorkKind, first_chunks: bool = False) -> Plan:
    return Plan(kind, (PlanRow(1, 0, 0, 0),), 1, first_chunks=first_chunks)


def _step(kind: WorkKind, polls: int, ms: float = 2.0, **kwargs: bool) -> InFlight:
    first_chunks = kwargs.pop("first_chunks", False)
    return InFlight(_plan(kind, first_chunks), lambda: None, kind is WorkKind.CODEC_CHUNK, SlowEvent(),
                    SlowEvent(polls=polls, ms=ms), **kwargs)  # fmt: skip


def test_plans_of_one_lane_finish_in_launch_order_and_device_time_is_summed_per_kind() -> None:
    timeline = DeviceTimeline()
    first = _step(WorkKind.CODE_PREDICT, polls=1, ms=5.0)
    second = _step(WorkKind.TALKER_DECODE, polls=0, ms=3.0)
    timeline.add(first)
    timeline.add(second)
    assert timeline.poll() == []  # the second has ended, but the first (older, same stream) has not
    assert timeline.poll() == [first, second]
    assert timeline.gpu_ms == {"code_predict": 5.0, "talker_decode": 3.0}
    assert timeline.plans == {"code_predict": 1, "talker_decode": 1}


def test_a_plan_on_one_lane_never_waits_for_an_older_plan_on_the_other() -> None:
    timeline = DeviceTimeline()
    codec = _step(WorkKind.CODEC_CHUNK, polls=5, ms=12.0)
    decode = _step(WorkKind.TALKER_DECODE, polls=0)
    timeline.add(codec)
    timeline.add(decode)
    assert timeline.poll() == [decode]  # the generation stream moved on while the long codec plan runs
    assert len(timeline) == 1


def test_with_one_shared_lane_every_plan_waits_for_the_oldest() -> None:
    timeline = DeviceTimeline(split_lanes=False)
    codec = _step(WorkKind.CODEC_CHUNK, polls=1)
    decode = _step(WorkKind.TALKER_DECODE, polls=0)
    timeline.add(codec)
    timeline.add(decode)
    assert timeline.poll() == []
    assert timeline.poll() == [codec, decode]


def test_each_lane_takes_plans_up_to_its_own_bound() -> None:
    timeline = DeviceTimeline(max_in_flight=2, codec_in_flight=1)
    assert timeline.open_lanes() == {Lane.GENERATION, Lane.CODEC}
    timeline.add(_step(WorkKind.CODEC_CHUNK, polls=9))
    assert timeline.open_lanes() == {Lane.GENERATION}  # one codec plan at a time
    timeline.add(_step(WorkKind.CODEC_CHUNK, polls=9, first_chunks=True))  # first chunks: the generation lane
    assert timeline.open_lanes() == {Lane.GENERATION}
    timeline.add(_step(WorkKind.CODE_PREDICT, polls=9))
    assert timeline.open_lanes() == frozenset()
    shared = DeviceTimeline(max_in_flight=2, split_lanes=False)
    shared.add(_step(WorkKind.CODEC_CHUNK, polls=9))
    assert shared.open_lanes() == {Lane.GENERATION, Lane.CODEC}
    shared.add(_step(WorkKind.CODE_PREDICT, polls=9))
    assert shared.open_lanes() == frozenset()


def test_codec_plans_over_the_startup_budget_are_counted_per_lane() -> None:
    timeline = DeviceTimeline()
    for step in (_step(WorkKind.CODEC_CHUNK, polls=0, ms=7.0, startup_pending=True),
                 _step(WorkKind.CODEC_CHUNK, polls=0, ms=5.0, startup_pending=True, first_chunks=True),
                 _step(WorkKind.CODEC_CHUNK, polls=0, ms=3.0, startup_pending=True, first_chunks=True),
                 _step(WorkKind.CODEC_CHUNK, polls=0, ms=9.0)):  # nobody waited for first audio
        timeline.add(step)
    assert len(timeline.poll()) == 4
    assert timeline.codec_over_budget == {Lane.CODEC: 1, Lane.GENERATION: 1}


def test_waiting_on_the_oldest_plan_blocks_on_its_event_and_counts_the_wait() -> None:
    timeline = DeviceTimeline()
    step = InFlight(_plan(WorkKind.TALKER_DECODE), lambda: None, False, SlowEvent(), SlowEvent(polls=100))
    timeline.add(step)
    assert timeline.poll() == []
    assert timeline.wait_oldest() == [step] and step.end.waited  # type: ignore[union-attr]
    assert len(timeline) == 0 and timeline.wait_ms >= 0.0


def test_deferred_codec_plans_publish_after_their_event_and_the_audio_equals_the_reference(
        tiny_model: Qwen3TTS) -> None:  # fmt: skip
    loop = make_loop(tiny_model, kv_slots=4, max_batch=4)
    loop.max_in_flight = 3
    launch = loop.executors.launch
    log: list[tuple[str, int, tuple[int, ...]]] = []  # (event, turn, request ids)
    busy_codec: set[int] = set()

    def slow_device(plan, inputs):  # type: ignore[no-untyped-def]
        done = launch(plan, inputs)  # the CPU already ran it: hold its results back like a busy GPU
        codec = plan.kind is WorkKind.CODEC_CHUNK
        if codec:
            assert not busy_codec & set(plan.request_ids), "a stream's next chunk launched before its last finished"
            busy_codec.update(plan.request_ids)
            log.append(("launch", loop.turns, plan.request_ids))

        def finish():  # type: ignore[no-untyped-def]
            if codec:
                busy_codec.difference_update(plan.request_ids)
                log.append(("finish", loop.turns, plan.request_ids))
            return done.finish()

        return InFlight(plan, finish, deferred=codec, start=SlowEvent(), end=SlowEvent(polls=2))

    loop.executors.launch = slow_device  # type: ignore[method-assign]
    msgs = [submit(tiny_model, i + 1, SENTENCES[i], seed=40 + i) for i in range(3)]
    results, _ = run_to_completion(loop, msgs)

    launches = [turn for event, turn, _ in log if event == "launch"]
    finishes = [turn for event, turn, _ in log if event == "finish"]
    assert len(launches) == len(finishes) > 3
    assert any(f > s for s, f in zip(launches, finishes, strict=True)), "no codec plan was ever in flight"
    for msg in msgs:
        _, expected = reference(tiny_model, msg)
        got = results[msg.request_id].samples
        assert len(got) == len(expected) and int(np.abs(got.astype(np.int32) - expected).max()) <= 1
    stats = loop.heartbeat_stats()
    for kind in WorkKind:
        plans, seconds = stats[f"gpu.{kind.label}"]
        assert plans >= 1 and seconds > 0, kind
    assert stats["host.plan"][0] == loop.turns > 0
    assert stats["host.plan"][1] > 0 and stats["host.launch"][1] > 0  # the scheduler's time and the launches', apart
    gc.collect()
    collections, paused_s = loop.heartbeat_stats()["host.gc"]
    assert collections >= 1 and paused_s > 0

