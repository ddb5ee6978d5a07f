"""Reproducible open-loop arrival schedules: Poisson gaps and prompt order derived from SHA-256.

Every random draw is a hash of (schedule version, seed, phase, index), so a schedule depends only on
its inputs (not on the numpy or Python version) and the warm-up and measurement phases are
independent streams: changing the warm-up length does not change which prompts are measured.

    run clock  0 ──── warmup ────▶ warmup ──────── duration ────────▶ warmup + duration
    phase        "warmup" arrivals       "measure" arrivals (the only ones summarised)
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from loadtest.prompts import Prompt

SCHEDULE_VERSION = "vivace-loadtest-1"


@dataclass(frozen=True, slots=True)
class Arrival:
    index: int  # position in the whole run, warm-up first
    phase: str  # "warmup" | "measure"
    at_s: float  # ideal dispatch time, seconds after the run starts
    prompt: Prompt


def _uniform(*key: object) -> float:
    """A deterministic draw in [0, 1) from the key."""
    digest = hashlib.sha256(":".join(map(str, (SCHEDULE_VERSION, *key))).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def arrival_offsets(
    rps: float, duration_s: float, seed: int, phase: str, arrival: str = "poisson"
) -> list[float]:
    """Arrival times in [0, duration_s): exponential gaps of mean 1/rps, or a constant 1/rps grid."""
    if rps <= 0:
        raise ValueError(f"rps must be positive, got {rps}")
    if arrival not in ("poisson", "constant"):
        raise ValueError(f"arrival must be 'poisson' or 'constant', got {arrival!r}")
    offsets: list[float] = []
    t = 0.0
    for i in range(1_000_000_000):
        if arrival == "poisson":
            t += -math.log1p(-_uniform(seed, phase, "gap", i)) / rps
        else:
            t = i / rps
        if t >= duration_s:
            return offsets
        offsets.append(t)
    raise AssertionError("unreachable")


def prompt_order(prompts: list[Prompt], count: int, seed: int, phase: str) -> list[Prompt]:
    """`count` prompts: the pool shuffled by hash, reshuffled for each further pass through it."""
    chosen: list[Prompt] = []
    for cycle in range(math.ceil(count / len(prompts))):
        ranked = sorted(
            prompts,
            key=lambda p: hashlib.sha256(
                f"{SCHEDULE_VERSION}:{seed}:{phase}:{cycle}:{p.id}".encode()
            ).digest(),
        )
        chosen.extend(ranked)
    return chosen[:count]


def build_schedule(
    prompts: list[Prompt], rps: float, warmup_s: float, duration_s: float, seed: int, arrival: str = "poisson"
) -> list[Arrival]:
    """Warm-up arrivals on [0, warmup_s), then measured arrivals on [warmup_s, warmup_s + duration_s)."""
    if warmup_s < 0 or duration_s <= 0:
        raise ValueError(f"need warmup >= 0 and duration > 0, got {warmup_s} and {duration_s}")
    schedule: list[Arrival] = []
    for phase, start, length in (("warmup", 0.0, warmup_s), ("measure", warmup_s, duration_s)):
        if length == 0:
            continue
        offsets = arrival_offsets(rps, length, seed, phase, arrival)
        for offset, prompt in zip(offsets, prompt_order(prompts, len(offsets), seed, phase), strict=True):
            schedule.append(Arrival(len(schedule), phase, start + offset, prompt))
    return schedule
