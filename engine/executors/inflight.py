"""Plans in flight on the device: when each one's GPU work ends, what it cost, and its deferred host result.

A plan is *launched* (its kernels queued on a CUDA stream, nothing waited for) and *finished* later, when its
end event has fired. Between the two the host plans and launches the next steps, so host planning overlaps
the GPU's work and no step synchronises the device:

    launch(plan)  -> InFlight(kind, start/end events on the plan's stream, finish: () -> StepResult)
    poll()        -> the plans whose end event fired, oldest first (`Event.query()`: never blocks)
    wait_oldest() -> blocks on the oldest plan's end event (the host is too far ahead, or has nothing to do)

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

from engine.scheduling import Outcome, Plan


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

    def done(self) -> bool:
        return self.end is None or self.end.query()

    def gpu_ms(self) -> float:
        """Device time of the plan's kernels; call once `done()`."""
        if self.start is None or self.end is None:
            return self.wall_ms
        return self.start.elapsed_time(self.end)


class DeviceTimeline:
    """Every launched plan until its end event fires: per-kind device time, and the host's waits on the GPU."""

    def __init__(self) -> None:
        self._queue: deque[InFlight] = deque()
        self.gpu_ms: dict[str, float] = {}  # kind name -> CUDA-event ms of finished plans (cumulative)
        self.plans: dict[str, int] = {}  # kind name -> finished plans (cumulative)
        self.wait_ms = 0.0  # host time blocked on device events (cumulative)
        self.codec_over_budget = 0  # codec plans over `startup_codec_budget_ms` while a request awaited audio
        self.startup_codec_budget_ms = 4.0

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, step: InFlight) -> None:
        self._queue.append(step)

    def poll(self) -> list[InFlight]:
        """Plans whose device work has ended, oldest first (stream order on one stream; across the codec and
        generation streams a later plan may end first, and waits here for the older one)."""
        finished = []
        while self._queue and self._queue[0].done():
            finished.append(self._account(self._queue.popleft()))
        return finished

    def wait_oldest(self) -> list[InFlight]:
        """Block until the oldest plan's device work ends; -> every plan finished by then."""
        if self._queue and self._queue[0].end is not None:
            started = time.perf_counter()
            self._queue[0].end.synchronize()
            self.wait_ms += (time.perf_counter() - started) * 1000
        return self.poll()

    def _account(self, step: InFlight) -> InFlight:
        name = step.plan.kind.label
        ms = step.gpu_ms()
        self.gpu_ms[name] = self.gpu_ms.get(name, 0.0) + ms
        self.plans[name] = self.plans.get(name, 0) + 1
        if name == "codec_chunk" and step.startup_pending and ms > self.startup_codec_budget_ms:
            self.codec_over_budget += 1
        return step
