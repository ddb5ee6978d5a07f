"""The measurements every GPU check shares: relative L2 error against a twin, CUDA-event medians, and the
per-call time of small kernels launched back to back inside one CUDA graph (launch cost as in a frame)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch


def relative_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in fp64; NaN or inf anywhere in `actual` gives inf."""
    a, e = actual.double(), expected.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - e).norm() / e.norm().clamp_min(1e-30))


def cuda_median_ms(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median of `repeats` CUDA-event-timed calls of `fn`, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graph_per_call_us(calls: Sequence[Callable[[], object]], repeats: int = 15) -> float:
    """Microseconds per call of `calls` captured one after the other in one CUDA graph (the median replay over
    len(calls)); each is run once before capture (compiles, allocator warm)."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    return cuda_median_ms(graph.replay, repeats=repeats, warmup=2) * 1e3 / len(calls)
