"""Arrival counts for kernels whose last program to finish does a launch's closing work (split-K sums, split merges).

One zeroed int32 buffer per (owner, device): each launch's programs count their arrival at their own entries, and
the program that arrives last zeroes its entry again, so the buffer is all zero between launches. Launches of one
owner run one after another on one stream (a programmatic dependent counts only after waiting for the kernel before
it), so they never overlap their counts; owners keep separate buffers. A buffer is made (or grown) the first time
outside CUDA-graph capture, in a warm-up, so no graph owns its memory.
"""

from __future__ import annotations

import torch
from torch import Tensor

_BUFFERS: dict[tuple[str, torch.device], Tensor] = {}
MIN_COUNTS = 8192  # entries made at once: every launch of the engine's shapes fits the first buffer


def arrival_counts(owner: str, device: torch.device, count: int) -> Tensor:
    """At least `count` zero int32 arrival counts on `device` for `owner` (e.g. "gemv split_k"); refuses to make
    or grow them during CUDA-graph capture (the owner must run once before it is captured)."""
    counts = _BUFFERS.get((owner, device))
    if counts is None or counts.numel() < count:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{owner}: run it once before capturing it (its arrival counts)")
        counts = torch.zeros(max(count, MIN_COUNTS), dtype=torch.int32, device=device)
        _BUFFERS[(owner, device)] = counts
    return counts
