"""Weights of the next products requested into L2 while the current kernel runs (Hopper and later).

The code predictor's step is a chain of short kernels, each streaming 4-12 MB of weights: a kernel that only
reads that much takes 2.5-5 us in a graph, against 1-3 us of pure bandwidth (docs/benchmarks.md, eighth
session), because each one starts from cold HBM. Between and inside those ramps the HBM is idle. Here a
kernel also asks for the weights of the products that come after it, with a bulk L2 prefetch
(`cp.async.bulk.prefetch.L2`, fire and forget: nothing waits for it, nothing reads its result), so when the
next product starts its weights are in L2 or on their way:

    kernel i:      [prefetch W[i+1], W[i+2]] [its own work, reading W[i] from L2 ...]
    kernel i+1:                                 [prefetch W[i+2], W[i+3]] [reads W[i+1] ...]

A prefetch never changes a value: the same kernels with and without it compute bitwise the same results.
Every program of the grid issues its own contiguous share of each range, in pieces of at most CHUNK bytes,
from its first thread only. Off in Triton's interpreter (no PTX) and before Hopper; with `Prefetch.none()`.

    ranges:  [ptr0, ptr0 + bytes0)  [ptr1, ptr1 + bytes1)     (byte addresses, 16-byte aligned, bytes % 16 == 0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import torch
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, INTERPRET

CHUNK = 16384  # bytes per prefetch instruction (a multiple of 16)
RANGES = 2  # ranges a kernel can prefetch

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _prefetch_range(address, nbytes, CHUNK_BYTES: tl.constexpr):
        """This program's share of [address, address + nbytes) requested into L2 by its thread 0."""
        pid = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0) + (
            tl.program_id(2) * tl.num_programs(0) * tl.num_programs(1)
        )
        programs = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
        nbytes = nbytes.to(tl.int64)
        share = ((nbytes + programs - 1) // programs + 15) // 16 * 16
        lo = pid.to(tl.int64) * share
        hi = tl.minimum(lo + share, nbytes)
        for offset in range(lo, hi, CHUNK_BYTES):
            size = tl.minimum(hi - offset, CHUNK_BYTES).to(tl.int32)
            tl.inline_asm_elementwise(
                "{\n .reg .pred p;\n .reg .b32 t;\n mov.u32 t, %tid.x;\n setp.eq.u32 p, t, 0;\n"
                " @p cp.async.bulk.prefetch.L2.global [$1], $2;\n mov.u32 $0, 0;\n}",
                "=r,l,r", [address.to(tl.int64) + offset, size], dtype=tl.int32, is_pure=False, pack=1,
            )  # fmt: skip

    @triton.jit
    def prefetch_l2(address0, nbytes0, address1, nbytes1, ENABLED: tl.constexpr):
        """Both ranges (address: int64 byte address; nbytes 0 skips one), shared over the grid's programs."""
        if ENABLED:
            _prefetch_range(address0, nbytes0, CHUNK)
            _prefetch_range(address1, nbytes1, CHUNK)


@cache
def _device_has_it() -> bool:
    """Compute capability 9.0 or later (cp.async.bulk is sm_90+)."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@dataclass(frozen=True, slots=True)
class Prefetch:
    """Up to RANGES byte ranges a kernel requests into L2, as its kernel arguments."""

    ranges: tuple[tuple[int, int], ...] = ()

    @classmethod
    def none(cls) -> Prefetch:
        return cls()

    @classmethod
    def of(cls, tensors: Sequence[Tensor]) -> Prefetch:
        """The storage of up to RANGES contiguous CUDA tensors (others, and anything off the GPU, are skipped)."""
        ranges = []
        for t in tensors[:RANGES]:
            nbytes = t.numel() * t.element_size()
            if t.is_cuda and t.is_contiguous() and t.data_ptr() % 16 == 0 and nbytes % 16 == 0 and nbytes:
                ranges.append((t.data_ptr(), nbytes))
        return cls(tuple(ranges))

    @property
    def enabled(self) -> bool:
        return bool(self.ranges) and not INTERPRET and _device_has_it()

    def args(self) -> tuple[int, int, int, int]:
        """(address0, nbytes0, address1, nbytes1); absent ranges are (0, 0)."""
        padded = list(self.ranges) + [(0, 0)] * (RANGES - len(self.ranges))
        return (padded[0][0], padded[0][1], padded[1][0], padded[1][1])
