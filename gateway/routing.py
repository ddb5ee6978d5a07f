"""Which engine takes a new request: the one where it is predicted to wait least for its frames.

    cost(e) = (in_flight(e) + 1 + queued(e)) x frame_ms(e)          the lowest cost wins

- `in_flight`: the gateway's live count of e's unfinished requests. It changes at every submit and
  release, so a burst spreads over the engines between heartbeats. The `+ 1` is the new request.
- `queued`: e's last `Heartbeat.queued_requests`, the requests it accepted but has no slot for yet
  (at most `in_flight`: a heartbeat is up to a second old). They are already in `in_flight`; they
  count a second time because a newcomer would wait behind them, not share steps with them.
- `frame_ms`: how long e takes per frame cycle: the device time of one `talker_decode` plan plus one
  `code_predict` plan between two heartbeats (their cumulative `gpu.<kind>` figures: plans finished,
  device seconds; the engine loop launches without waiting, so its host step times measure launches,
  not the GPU). When a heartbeat carries no device figures for those kinds (an engine without CUDA
  events, or none of those plans finished since the last one), the mean host step times of its step
  figures stand in. Prefill and codec plans run once per request or per chunk, not per frame, and are
  left out. It is smoothed over heartbeats (the newest figure
  weighs `SMOOTHING`); a heartbeat without figures (an idle engine) keeps the last value. An engine
  never measured is assumed as fast as the fastest measured one (1 ms when none is): optimistic, so
  it gets traffic and with it a measurement.

The product is the time until the newcomer's next frame if the engine served its requests' frames
one after another. Batching makes that pessimistic in absolute terms, but the same bias applies to
every engine; what matters is the comparison. With equal frame times the rule is fewest in flight
(the rule before this one); an engine k times slower ends up with about 1/k of the other's requests.
Ties go to the engine with fewer in flight, then to the lower index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PER_FRAME_KINDS = ("talker_decode", "code_predict")  # Heartbeat.step_stats keys: (mean batch, mean ms)
SMOOTHING = 0.5  # weight of the newest heartbeat's frame time
UNMEASURED_MS = 1.0  # the frame time assumed when no engine has been measured: in-flight counts alone


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What the gateway knows of one ready engine when a request arrives."""

    in_flight: int
    queued: int = 0
    frame_ms: float | None = None  # smoothed frame time; None: never measured


def frame_ms_sample(step_stats: Mapping[str, tuple[float, float]],
                    previous: Mapping[str, tuple[float, float]] | None = None) -> float | None:
    """One heartbeat's frame time in ms: device ms per plan of each per-frame kind since `previous` (the
    engine's last heartbeat), added up; else the kinds' mean host step ms; None if it ran none."""
    device = _device_ms_per_plan(step_stats, previous) if previous is not None else None
    if device is not None:
        return device
    total = sum(step_stats[kind][1] for kind in PER_FRAME_KINDS if kind in step_stats)
    return total if total > 0 else None


def _device_ms_per_plan(now: Mapping[str, tuple[float, float]],
                        before: Mapping[str, tuple[float, float]]) -> float | None:
    """Sum over the per-frame kinds of (delta device seconds / delta plans) x 1000; None unless every kind has
    device figures in both heartbeats and finished at least one plan in between."""
    total = 0.0
    for kind in PER_FRAME_KINDS:
        key = f"gpu.{kind}"
        if key not in now or key not in before:
            return None
        plans, seconds = now[key][0] - before[key][0], now[key][1] - before[key][1]
        if plans <= 0 or seconds <= 0:
            return None
        total += seconds / plans * 1000.0
    return total


def smoothed_frame_ms(previous_ms: float | None, step_stats: Mapping[str, tuple[float, float]],
                      previous_stats: Mapping[str, tuple[float, float]] | None = None) -> float | None:
    """The engine's frame time after one more heartbeat (`previous_stats`: the heartbeat before it)."""
    sample = frame_ms_sample(step_stats, previous_stats)
    if sample is None or previous_ms is None:
        return previous_ms if sample is None else sample
    return previous_ms + SMOOTHING * (sample - previous_ms)


def cost(load: EngineLoad, frame_ms: float) -> float:
    """Predicted wait, in ms, of a new request on this engine (see the module docstring)."""
    return (load.in_flight + 1 + min(load.queued, load.in_flight)) * frame_ms


def choose(loads: Sequence[EngineLoad]) -> int:
    """Index into `loads` (at least one) of the engine that should take the new request."""
    measured = [load.frame_ms for load in loads if load.frame_ms is not None]
    assumed = min(measured, default=UNMEASURED_MS)
    return min(
        range(len(loads)),
        key=lambda i: (cost(loads[i], assumed if loads[i].frame_ms is None else loads[i].frame_ms),
                       loads[i].in_flight, i),
    )  # fmt: skip
