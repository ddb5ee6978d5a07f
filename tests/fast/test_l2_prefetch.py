"""`Prefetch`: which tensors become L2 prefetch ranges, as kernel arguments (the prefetch itself is GPU-only)."""

from __future__ import annotations

import torch

from engine.fast.kernels.l2_prefetch import RANGES, Prefetch


def test_no_ranges_means_zero_arguments_and_off() -> None:
    none = Prefetch.none()
    assert none.args() == (0, 0, 0, 0) and not none.enabled


def test_tensors_off_the_gpu_are_never_prefetched() -> None:
    assert Prefetch.of([torch.zeros(64, 64), torch.zeros(8)]).ranges == ()


def test_ranges_are_byte_spans_padded_to_two() -> None:
    ranges = Prefetch(((4096, 8192),))
    assert ranges.args() == (4096, 8192, 0, 0)
    assert len(ranges.args()) // 2 == RANGES
