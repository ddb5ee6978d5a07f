"""Admission's pressure: the share of recent planned GPU time that went to rescuing playing streams.

Two decaying sums over the plans, both multiplied by `DECAY` at every plan so that the share looks back over
roughly the last 1 / (1 - DECAY) = 50 plans: all the planned milliseconds, and those of the plans that counted as
a rescue (the scheduler says which: anchored by a stream near its deadline for want of GPU time), kept apart by the
plans' work kind so that a refusal can say what the rescues were.

Planned milliseconds are the cost model's, not measured ones: the share is about what the scheduler had to choose,
and reads the same in the engine and in the simulator.
"""

from __future__ import annotations

from engine.request import WorkKind

DECAY = 0.98  # per plan


class RescuePressure:
    def __init__(self) -> None:
        self._planned_ms = 0.0
        self._rescue_ms = dict.fromkeys(WorkKind, 0.0)  # by the rescue plans' kind

    def record(self, kind: WorkKind, planned_ms: float, rescue: bool) -> None:
        """One plan of `kind`, predicted to take `planned_ms`; `rescue`: it counts toward the pressure."""
        self._planned_ms = DECAY * self._planned_ms + planned_ms
        by_kind = self._rescue_ms
        for k in by_kind:
            by_kind[k] *= DECAY
        if rescue:
            by_kind[kind] += planned_ms

    def reset(self) -> None:
        """Forget every plan so far."""
        self._planned_ms = 0.0
        self._rescue_ms = dict.fromkeys(WorkKind, 0.0)

    @property
    def share(self) -> float:
        """Rescue time over all planned time, 0 (idle, or no rescue) .. 1 (every plan a rescue)."""
        return sum(self._rescue_ms.values()) / self._planned_ms if self._planned_ms else 0.0

    def share_by_kind(self) -> dict[WorkKind, float]:
        """`share` split by the rescue plans' kind (the parts add up to it)."""
        planned = self._planned_ms
        return {k: (ms / planned if planned else 0.0) for k, ms in self._rescue_ms.items()}

    def describe(self) -> str:
        """The parts as words, largest first, e.g. 'code_predict 40%, codec_chunk 25%' ('' while none)."""
        parts = sorted(self.share_by_kind().items(), key=lambda kv: -kv[1])
        return ", ".join(f"{k.label} {share:.0%}" for k, share in parts if share >= 0.005)
