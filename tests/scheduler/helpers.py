"""Shared test drivers: build requests, and run the scheduler with the cost model as the clock."""

from __future__ import annotations

from collections.abc import Callable

from engine.ipc.messages import Layout
from engine.request import RequestState
from engine.scheduling import CostModel, Outcome, Plan, Scheduler, SchedulerConfig

MS = 1_000_000
COSTS = CostModel.load()


def make_request(request_id: int, arrival_ns: int = 0, tokens: int = 10, chars: int = 45, ended: bool = True,
                 layout: Layout = Layout.STREAMING, prefill_len: int = 10) -> RequestState:
    return RequestState(request_id, arrival_ns, layout, prefill_len, list(range(100, 100 + tokens)), chars, ended)


def make_scheduler(**overrides: object) -> Scheduler:
    """The default scheduler but for codec gathering, off unless a test asks for it: the scenes here set up codec
    rows and ask for the plan that takes them now (gathering's own tests turn it on)."""
    config = SchedulerConfig(**{"length_model": True, "codec_gather_ms": 0.0, **overrides})  # type: ignore[arg-type]
    return Scheduler(config, COSTS)


def admit(scheduler: Scheduler, request: RequestState, now_ns: int = 0) -> RequestState:
    admission = scheduler.admit(request, now_ns)
    assert admission.ok, admission.reason
    return request


def step(scheduler: Scheduler, now_ns: int, outcome: Callable[[Plan], Outcome] | None = None) -> tuple[Plan | None, int]:
    """Plan, 'run' it for its predicted time, complete it. Returns the plan and the new time."""
    plan = scheduler.plan(now_ns)
    if plan is None:
        return None, now_ns
    now_ns += int(plan.predicted_ms * MS)
    scheduler.complete(plan, outcome(plan) if outcome else Outcome(), now_ns)
    return plan, now_ns


def run(scheduler: Scheduler, now_ns: int, until: Callable[[], bool], max_steps: int = 10_000) -> tuple[list[Plan], int]:
    plans = []
    for _ in range(max_steps):
        if until():
            return plans, now_ns
        plan, now_ns = step(scheduler, now_ns)
        if plan is None:  # nothing now; something later (a paced stream, codec rows gathering): move the clock on
            wake = scheduler.next_wake_ns(now_ns)
            if wake is None or wake <= now_ns:
                return plans, now_ns
            now_ns = wake
            continue
        plans.append(plan)
    raise AssertionError("scheduler did not reach the condition")
