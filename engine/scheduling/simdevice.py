"""The simulator's GPU: plans run on the engine's two lanes, and share the device while both are busy.

The engine queues generation plans on one CUDA stream and codec-lane plans on a second one beside it
(`engine.executors.inflight`); the two share the SMs, so a plan that overlaps the other lane's work takes
longer than it would alone. This model gives each lane one plan at a time (the host plans the next one the
moment a lane frees, as the engine loop does) and, while both lanes hold a plan, runs each at
`overlap_rate` of its standalone speed (processor sharing):

    generation lane  [ CP 3.3 ][ decode 2.2 ][ CP 3.3 ] ...
    codec lane            [ codec 8.0 ms of work ......... ]
                          |<- both busy: each at overlap_rate ->|

`overlap_rate` 0.5 is plain time slicing (together no faster than one after the other); 1.0 would be two
devices. On the H200 at 40 RPS the codec's CUDA-event time was ~1.5x its standalone table time and the
generation kinds' ~1.3x (docs/benchmarks.md, first whole-server run with and without the codec stream), which
0.65 reproduces. `split_lanes=False` is one lane for every plan, one after the other (the model before lanes).

Plain Python; time is integer nanoseconds passed in, work is standalone milliseconds (the cost model's).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.scheduling.plan import ALL_LANES, Lane, Plan

MS = 1_000_000  # ns per ms
DEFAULT_OVERLAP_RATE = 0.65
NO_LANES: frozenset[Lane] = frozenset()


@dataclass(slots=True)
class Running:
    plan: Plan
    left_ms: float  # standalone work still to do
    started_ns: int


class SimDevice:
    def __init__(self, overlap_rate: float = DEFAULT_OVERLAP_RATE, split_lanes: bool = True) -> None:
        if not 0 < overlap_rate <= 1:
            raise ValueError("overlap_rate must be in (0, 1]")
        self.overlap_rate = overlap_rate
        self.split_lanes = split_lanes
        self.running: dict[Lane, Running] = {}
        self.busy_ms = 0.0  # time with at least one plan running
        self.overlap_ms = 0.0  # time with both lanes running

    def _lane(self, plan: Plan) -> Lane:
        return plan.lane if self.split_lanes else Lane.GENERATION

    def free_lanes(self) -> frozenset[Lane]:
        """Lanes that may start a plan now (one lane: every lane while nothing runs, else none)."""
        if not self.split_lanes:
            return NO_LANES if self.running else ALL_LANES
        return frozenset(lane for lane in Lane if lane not in self.running)

    def start(self, plan: Plan, work_ms: float, now_ns: int) -> None:
        lane = self._lane(plan)
        assert lane not in self.running, f"the {lane.value} lane is busy"
        self.running[lane] = Running(plan, max(work_ms, 1e-6), now_ns)

    def _rate(self) -> float:
        return self.overlap_rate if len(self.running) > 1 else 1.0

    def next_end_ns(self, now_ns: int) -> int | None:
        """When the first running plan ends at the current sharing (None: nothing runs)."""
        if not self.running:
            return None
        rate = self._rate()
        return now_ns + max(1, round(min(r.left_ms for r in self.running.values()) / rate * MS))

    def advance(self, now_ns: int, until_ns: int) -> list[Running]:
        """Run from `now_ns` to `until_ns` (no plan starts in between); -> the plans that ended, oldest first."""
        dt_ms = (until_ns - now_ns) / MS
        if not self.running or dt_ms <= 0:
            return []
        rate = self._rate()
        self.busy_ms += dt_ms
        if len(self.running) > 1:
            self.overlap_ms += dt_ms
        ended = []
        for lane, r in list(self.running.items()):
            r.left_ms -= dt_ms * rate
            if r.left_ms <= 1e-6:
                ended.append(self.running.pop(lane))
        return sorted(ended, key=lambda r: r.started_ns)
