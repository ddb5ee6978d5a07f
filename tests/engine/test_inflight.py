"""Plans in flight: the loop launches work without waiting for the device, finishes a plan only when its end
event fires, and accounts device time per work kind from those events.

On a CPU the executors are synchronous, so these tests stand in a device whose events fire only when the test
says (or when the loop blocks on one): the loop must then hold a deferred plan's rows busy, publish its audio
only once it has finished, keep at most `max_in_flight` plans queued, and still produce exactly the reference
audio."""

from __future__ import annotations

import numpy as np

from engine.executors.inflight import DeviceTimeline, InFlight
from engine.model.qwen3_tts import Qwen3TTS
from engine.request import WorkKind
from engine.scheduling import Plan, PlanRow
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


def _plan(kind: WorkKind) -> Plan:
    return Plan(kind, (PlanRow(1, 0, 0, 0),), 1)


def test_the_timeline_finishes_plans_in_launch_order_and_sums_device_time_per_kind() -> None:
    timeline = DeviceTimeline()
    first = InFlight(_plan(WorkKind.CODE_PREDICT), lambda: None, False, SlowEvent(), SlowEvent(polls=1, ms=5.0))
    second = InFlight(_plan(WorkKind.CODEC_CHUNK), lambda: None, True, SlowEvent(), SlowEvent(polls=0, ms=7.0),
                      startup_pending=True)  # fmt: skip
    timeline.add(first)
    timeline.add(second)
    assert timeline.poll() == []  # the second has ended, but the first (older) has not
    assert timeline.poll() == [first, second]
    assert timeline.gpu_ms == {"code_predict": 5.0, "codec_chunk": 7.0}
    assert timeline.plans == {"code_predict": 1, "codec_chunk": 1}
    assert timeline.codec_over_budget == 1  # 7 ms of codec while a request awaited its first audio


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

