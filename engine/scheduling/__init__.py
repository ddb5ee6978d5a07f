"""Scheduling policy: which batch of work the engine runs next, whom it admits, and what that will cost.

The promise: plain Python, no torch and no clock reads (`now_ns` is always passed in), so the same code
drives the GPU loop and the CPU simulator, and a policy change can be tried in seconds without a GPU.
Request state itself (`engine.request`) stays outside: the loop and the executors share it too.

Modules:
    scheduler       the deadline-aware `Scheduler` (docs/scheduling.md)
    plan            the records it hands out and takes back: `Plan`, `PlanRow`, `Outcome`, `Admission`, `Lane`
    config          `SchedulerConfig`, `Policy` and the padded batch shapes they allow
    chunk_sizing    each request's next codec chunk (`SlackChunkPolicy`)
    capacity        a batch's time, real-time GPU share, predicted time to first audio
    costmodel       `CostModel`: milliseconds per batch shape, from the tables in `costs/*.json` (one per card)
    pacing          how freely a paced request (`max_lead_ms`) may generate
    simulate        the scheduler under a cost model: `python -m engine.scheduling.simulate --help`

The names below are the package's public surface; `simulate` is not imported here (it is a command,
and `python -m` should find it unloaded).
"""

from engine.scheduling.chunk_sizing import SlackChunkPolicy
from engine.scheduling.config import Policy, SchedulerConfig
from engine.scheduling.costmodel import COSTS_DIR, DEFAULT_COSTS, CostModel, fast_costs_for, gpu_family
from engine.scheduling.plan import Admission, Lane, Outcome, Plan, PlanRow
from engine.scheduling.scheduler import Scheduler

__all__ = [
    "COSTS_DIR",
    "DEFAULT_COSTS",
    "Admission",
    "CostModel",
    "Lane",
    "Outcome",
    "Plan",
    "PlanRow",
    "Policy",
    "Scheduler",
    "SchedulerConfig",
    "SlackChunkPolicy",
    "fast_costs_for",
    "gpu_family",
]
