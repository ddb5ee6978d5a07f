"""Plans in flight on the device: when each one's GPU work ends, what it cost, and its deferred host result.

A plan is *launched* (its kernels queued on a CUDA stream, nothing waited for) and *finished* later, when its
end event has fired. Between the two the host plans and launches the next steps, so host planning overlaps
the GPU's work and no step synchronises the device:

    launch(plan)  -> InFlight(plan, start/end events on the plan's stream, finish: () -> StepResult)
    poll()        -> the plans whose end event fired (`Event.query()`: never blocks)
    wait_oldest() -> blocks on the oldest plan's end event (every lane is full, or nothing can be planned)

Lanes (`engine.scheduling.Lane`): generation plans queue on the generation stream, codec plans on the codec
stream beside it, and each lane holds a bounded number of plans of its own:

    generation lane   [prefill][CP][decode][CP][first chunks] ...   up to max_in_flight queued, in order
    codec lane        [codec 12 ms                ][codec ...        up to codec_in_flight queued, in order

so a long codec plan never stops the host from feeding the generation stream (with one shared bound the
host waited on a codec plan at the queue's head while the generation stream ran dry). `split_lanes=False`
is that shared queue: one bound over both, plans finished in launch order.

Each finished plan adds its CUDA-event time (end - start, on its own stream) to `gpu_ms[kind]`; that is the
device time of that plan's kernels, queued gaps on its stream included, whatever the host did meanwhile.
Off CUDA there are no events: the executors run synchronously, a plan is finished as soon as it is launched,
and its host wall time is its device time (the CPU is the device).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.scheduling import Lane, Outcome, Plan


@dataclass(frozen=True, slots=True)
class StepResult:
    outcome: Outcome
    audio: dict = field(default_factory=dict)  # codec plans: request id -> int16 samples (np.ndarray)


@dataclass(slots=True)
class InFlight:
    """One launched plan. `finish()` (only once the end event fired) gives its result; `deferred` plans hold
    their rows busy until then (codec audio, sampled tokens read back), the others complete at launch."""

    plan: Plan
    finish: Callable[[], StepResult]
    deferred: bool
    start: torch.cuda.Event | None = None
    end: torch.cuda.Event | None = None
    wall_ms: float = 0.0  # host time of the launch (the device time off CUDA)
    startup_pending: bool = False  # an admitted request had no audio yet when this plan was launched
    sequence: int = 0  # launch order, set by `DeviceTimeline.add`

    def done(self) -> bool:
        return self.end is None or self.end.query()

    def gpu_ms(self) -> float:
        """Device time of the plan's kernels; call once `done()`."""
        if self.start is None or self.end is None:
            return self.wall_ms
        return self.start.elapsed_time(self.end)


class DeviceTimeline:
    """Every launched plan until its end event fires, per lane: per-kind device time, the host's waits on the GPU."""

    def __init__(self, max_in_flight: int = 2, *, codec_in_flight: int = 1, split_lanes: bool = True) -> None:
        """`max_in_flight`: generation plans queued at once (`split_lanes` False: all plans); `codec_in_flight`:
        codec-lane plans queued at once. One codec plan at a time lets the next one gather every row that
        became ready while it ran (fuller batches); the stream's gap between them costs little, the
        generation stream keeps the device busy meanwhile."""
        if max_in_flight < 1 or codec_in_flight < 1:
            raise ValueError("max_in_flight and codec_in_flight must be at least 1")
        self.max_in_flight = max_in_flight
        self.codec_in_flight = codec_in_flight
        self.split_lanes = split_lanes
        self._lanes: dict[Lane, deque[InFlight]] = {lane: deque() for lane in Lane}
        self._launched = 0
        self.gpu_ms: dict[str, float] = {}  # kind name -> CUDA-event ms of finished plans (cumulative)
        self.plans: dict[str, int] = {}  # kind name -> finished plans (cumulative)
        self.wait_ms = 0.0  # host time blocked on device events (cumulative)
        # Codec plans over `startup_codec_budget_ms` while a request awaited audio, per lane (the first-chunk
        # plans on the generation lane are what a newcomer waits for; the codec lane's run beside them).
        self.codec_over_budget: dict[Lane, int] = {lane: 0 for lane in Lane}
        self.startup_codec_budget_ms = 4.0

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._lanes.values())

    def _queue(self, step: InFlight) -> deque[InFlight]:
        return self._lanes[step.plan.lane if self.split_lanes else Lane.GENERATION]

    def add(self, step: InFlight) -> None:
        step.sequence = self._launched
        self._launched += 1
        self._queue(step).append(step)

    def open_lanes(self) -> frozenset[Lane]:
        """The lanes that may take another plan now (fewer than `max_in_flight` queued; shared: both or none)."""
        if not self.split_lanes:
            return frozenset(Lane) if len(self) < self.max_in_flight else frozenset()
        bound = {Lane.GENERATION: self.max_in_flight, Lane.CODEC: self.codec_in_flight}
        return frozenset(lane for lane, queue in self._lanes.items() if len(queue) < bound[lane])

    def poll(self) -> list[InFlight]:
        """Plans whose device work has ended, in launch order. Within a lane (one stream) plans end in order;
        a plan on one lane never waits for an older plan on the other."""
        finished = []
        for queue in self._lanes.values():
            while queue and queue[0].done():
                finished.append(self._account(queue.popleft()))
        finished.sort(key=lambda step: step.sequence)
        return finished

    def wait_oldest(self) -> list[InFlight]:
        """Block until the oldest plan's device work ends; -> every plan finished by then."""
        heads = [queue[0] for queue in self._lanes.values() if queue]
        oldest = min(heads, key=lambda step: step.sequence, default=None)
        if oldest is not None and oldest.end is not None:
            started = time.perf_counter()
            oldest.end.synchronize()
            self.wait_ms += (time.perf_counter() - started) * 1000
        return self.poll()

    def _account(self, step: InFlight) -> InFlight:
        name = step.plan.kind.label
        ms = step.gpu_ms()
        self.gpu_ms[name] = self.gpu_ms.get(name, 0.0) + ms
        self.plans[name] = self.plans.get(name, 0) + 1
        if name == "codec_chunk" and step.startup_pending and ms > self.startup_codec_budget_ms:
            self.codec_over_budget[step.plan.lane] += 1
        return step
