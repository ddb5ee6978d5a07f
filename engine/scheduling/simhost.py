"""The simulator with the engine's host in it: plans cost host time, and lanes hold queues of launched plans.

The plain simulator (`engine.scheduling.simulate`) plans for free the moment a lane frees. On the H200 the
engine loop's host is busy most of the time under load (fifteenth session: at 100 RPS it spent 13.9 of 20 s
planning and launching and 2.7 s waiting for the GPU), and the simulator's p95 TTFA was half the server's. This variant runs the loop
the way `engine.loop.EngineLoop` does:

    host   [poll][plan ~ us x active requests][launch ~ ms by kind] [poll][plan][launch] ... [wait oldest]
    gen    ..........[ CP ][ decode ][ first chunks ][ CP ] ...      up to `max_in_flight` queued, in order
    codec  ..............[ codec (after the generation work queued before it) ] ...  `codec_in_flight` queued

- one turn at a time: deferred plans that ended are completed at the turn's poll (codec audio is published
  then, plus `finish_ms` of host time each); then one `Scheduler.plan` call over the lanes with room, which
  costs `plan_us` per active request whether or not it returns a plan; a plan then costs `launch_ms` of its
  kind and is queued on its lane when that time is over;
- generation plans are complete at launch (their results stay on the device, so the next step can be planned
  at once), unless a row may sample EOS; codec plans complete when the device has run them;
- the device runs each lane's queue in order, a codec-lane plan only after the generation work queued before
  it (the codec stream waits for the generation stream), sharing the SMs as `SimDevice` does;
- with nothing to plan and plans in flight the host blocks until the next plan ends (`wait_oldest`), so
  arrivals meanwhile wait; with nothing in flight it sleeps until the next arrival or scheduler wake.

Host costs are measured figures of one machine (`H200_HOST`), so this model predicts the effect of host
changes (a faster scheduler, cheaper launches) and of policies whose cost is per plan. Plain Python.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from engine.codec.chunking import ChunkPolicy
from engine.request import Phase, WorkKind
from engine.scheduling.costmodel import CostModel
from engine.scheduling.plan import ALL_LANES, Lane, Outcome, Plan
from engine.scheduling.scheduler import Scheduler, SchedulerConfig
from engine.scheduling.simdevice import MS

if TYPE_CHECKING:  # the workload, listeners and results live in the simulator, which imports this module
    from engine.scheduling.simulate import Listener, SimResult, Workload

NO_LANES: frozenset[Lane] = frozenset()


@dataclass(frozen=True, slots=True)
class HostCosts:
    """What the engine's host spends per loop turn, and how far it may run ahead of the device."""

    # Launching a plan (filling the static inputs, replaying its graphs, completing it when not deferred): the
    # heartbeat's per-kind launch means on the H200 at 10-100 RPS (fifteenth session, `vivace_engine_step_seconds`).
    launch_ms: dict[WorkKind, float] = field(default_factory=lambda: {
        WorkKind.TALKER_PREFILL: 2.0, WorkKind.CODE_PREDICT: 0.5, WorkKind.TALKER_DECODE: 0.55,
        WorkKind.CODEC_CHUNK: 1.0})  # fmt: skip
    # One `Scheduler.plan` call, per active request: what was left of the H200's plan-and-launch time at 20-100 RPS
    # after the launches (0.2-1.1 ms a plan at 7-76 active requests; the H200 host runs the scheduler ~3-5x slower
    # than the simulator's own measure of it on a development CPU).
    plan_us: float = 10.0
    finish_ms: float = 0.3  # a codec plan's host part once it ended (trim, int16, publish)
    max_in_flight: int = 2  # generation-lane plans queued (engine --max-in-flight)
    codec_in_flight: int = 1  # codec-lane plans queued (engine --codec-in-flight)

    def __post_init__(self) -> None:
        if self.plan_us < 0 or self.finish_ms < 0 or any(ms < 0 for ms in self.launch_ms.values()):
            raise ValueError("host costs must be >= 0")
        if self.max_in_flight < 1 or self.codec_in_flight < 1:
            raise ValueError("max_in_flight and codec_in_flight must be >= 1")


H200_HOST = HostCosts()


@dataclass(slots=True)
class Queued:
    plan: Plan
    left_ms: float  # standalone work still to do
    sequence: int
    after: int  # the generation-lane plan (sequence) it waits for; -1 none
    started_ns: int | None = None
    ended_ns: int = 0


class QueuedDevice:
    """Per-lane FIFO queues of launched plans; the heads that may run share the SMs (`overlap_rate`)."""

    def __init__(self, overlap_rate: float, split_lanes: bool = True) -> None:
        self.overlap_rate = overlap_rate
        self.split_lanes = split_lanes
        self.queues: dict[Lane, deque[Queued]] = {lane: deque() for lane in Lane}
        self._launched = 0
        self._last_generation = -1  # sequence of the newest generation-lane plan
        self._generation_done = -1  # every generation-lane plan up to this sequence has ended
        self.busy_ms = self.overlap_ms = 0.0

    def lane(self, plan: Plan) -> Lane:
        return plan.lane if self.split_lanes else Lane.GENERATION

    def __len__(self) -> int:
        return sum(len(queue) for queue in self.queues.values())

    def launch(self, plan: Plan, work_ms: float) -> None:
        lane = self.lane(plan)
        after = self._last_generation if lane is Lane.CODEC else -1
        self.queues[lane].append(Queued(plan, max(work_ms, 1e-6), self._launched, after))
        if lane is Lane.GENERATION:
            self._last_generation = self._launched
        self._launched += 1

    def _running(self) -> list[Queued]:
        return [q[0] for q in self.queues.values() if q and q[0].after <= self._generation_done]

    def _rate(self, running: list[Queued]) -> float:
        return self.overlap_rate if len(running) > 1 else 1.0

    def next_end_ns(self, now_ns: int) -> int | None:
        running = self._running()
        if not running:
            return None
        return now_ns + max(1, round(min(q.left_ms for q in running) / self._rate(running) * MS))

    def advance(self, now_ns: int, until_ns: int) -> list[Queued]:
        """Run the device from `now_ns` to `until_ns`; -> the plans that ended, in order."""
        ended: list[Queued] = []
        while now_ns < until_ns:
            running = self._running()
            if not running:
                return ended
            rate = self._rate(running)
            step_ns = min(until_ns - now_ns, max(1, round(min(q.left_ms for q in running) / rate * MS)))
            dt_ms = step_ns / MS
            self.busy_ms += dt_ms
            if len(running) > 1:
                self.overlap_ms += dt_ms
            for q in running:
                if q.started_ns is None:
                    q.started_ns = now_ns
                q.left_ms -= dt_ms * rate
            now_ns += step_ns
            for lane, queue in self.queues.items():
                if queue and queue[0].left_ms <= 1e-6:
                    done = queue.popleft()
                    done.ended_ns = now_ns
                    if lane is Lane.GENERATION:
                        self._generation_done = done.sequence
                    ended.append(done)
        return ended

    def open_lanes(self, host: HostCosts) -> frozenset[Lane]:
        if not self.split_lanes:
            return ALL_LANES if len(self) < host.max_in_flight else NO_LANES
        bound = {Lane.GENERATION: host.max_in_flight, Lane.CODEC: host.codec_in_flight}
        return frozenset(lane for lane, queue in self.queues.items() if len(queue) < bound[lane])


def _deferred(plan: Plan) -> bool:
    return plan.kind is WorkKind.CODEC_CHUNK or plan.eos_possible


def simulate_with_host(load: Workload, config: SchedulerConfig, costs: CostModel, prompts: list[str],
                       chunks: ChunkPolicy | None, host: HostCosts) -> SimResult:
    """`engine.scheduling.simulate.simulate` with the host in the loop (module docstring)."""
    from engine.scheduling.simulate import SimResult, _apply, _arrivals

    started = time.perf_counter()
    config = replace(config, length_model=True)
    scheduler = Scheduler(config, costs, chunks)
    device = QueuedDevice(load.overlap_rate, split_lanes=load.lanes)
    rng = random.Random(load.seed + 1)
    result = SimResult(load.rps)
    events = _arrivals(load, prompts)
    heapq.heapify(events)
    listeners: dict[int, Listener] = {}
    ended: list[Queued] = []
    now = host_ns = 0

    def run_device(until: int) -> None:
        nonlocal now
        ended.extend(device.advance(now, until))
        now = until

    while True:
        while events and events[0][0] <= now:  # 1. drain
            _apply(heapq.heappop(events), scheduler, listeners, result, load)
        finished, ended[:] = list(ended), []  # poll: deferred plans whose device work ended
        for q in finished:
            if _deferred(q.plan):
                if q.plan.kind is WorkKind.CODEC_CHUNK:  # trim, int16, publish
                    host_ns += int(host.finish_ms * MS)
                    run_device(now + int(host.finish_ms * MS))
                _complete(q, now, scheduler, listeners, result, load)
        lanes = device.open_lanes(host)
        wake = None
        if lanes:  # 2. plan
            scan_ns = int(host.plan_us * scheduler.active_count * 1000)
            plan = scheduler.plan(now, lanes)
            wake = None if plan is not None else scheduler.next_wake_ns(now)  # before the scan's time passes
            host_ns += scan_ns
            run_device(now + scan_ns)
            if plan is not None:  # 3. launch
                launch_ns = int(host.launch_ms.get(plan.kind, 0.0) * MS)
                host_ns += launch_ns
                run_device(now + launch_ns)
                step_ms = plan.predicted_ms * (1 + load.jitter * (2 * rng.random() - 1))
                device.launch(plan, step_ms)
                result.busy_by_kind[plan.kind] += step_ms
                result.rows[plan.kind].append(len(plan.rows))
                if not _deferred(plan):
                    scheduler.complete(plan, Outcome(), now)
                    _after_completion(scheduler, listeners, result, load, now)
                continue
        if ended:
            continue  # plans ended while the host planned: poll them first
        # Nothing launched: block on the device while plans are in flight (arrivals wait), else sleep.
        wakes = [device.next_end_ns(now)]
        if not len(device):
            wakes += [events[0][0] if events else None, wake, scheduler.next_wake_ns(now)]
        wakes = [t for t in wakes if t is not None]
        if not wakes:
            assert scheduler.active_count == 0, "simulation stuck: requests wait for input that never comes"
            break
        run_device(max(now + 1, min(wakes)))
    result.sim_ms = now / MS
    result.busy_ms = device.busy_ms
    result.host_ms = host_ns / MS
    result.requests_with_underruns = sum(1 for li in listeners.values() if li.underruns)
    result.wall_s = time.perf_counter() - started
    return result


def _complete(q: Queued, now: int, scheduler: Scheduler, listeners: dict[int, Listener], result: SimResult,
              load: Workload) -> None:  # fmt: skip
    """A deferred plan's end, seen by the host at `now`: apply it and deliver its audio."""
    from engine.scheduling.simulate import _play

    plan = q.plan
    scheduler.complete(plan, Outcome(), now)
    if plan.kind is WorkKind.CODEC_CHUNK:
        result.codec_frames.append(plan.codec_frames)
        result.frames_decoded += sum(row.codec_frames for row in plan.rows)
        assert q.started_ns is not None
        result.codec_event_ms += (q.ended_ns - q.started_ns) / MS  # its lane time, as the CUDA events see it
        for row in plan.rows:
            _play(listeners[row.request_id], row.codec_frames, now, load, scheduler, row.request_id, result)
    _after_completion(scheduler, listeners, result, load, now)


def _after_completion(scheduler: Scheduler, listeners: dict[int, Listener], result: SimResult, load: Workload,
                      now: int) -> None:  # fmt: skip
    """Streamed text: note who waits for it (an underrun right after is the text's fault); count the finished."""
    if load.text_mode == "words":
        for r in scheduler.requests:
            if r.phase is Phase.WAITING_TEXT:
                listeners[r.request_id].starved_ns = now
    result.completed += len(scheduler.pop_finished())
