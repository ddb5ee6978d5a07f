"""A codec step's whole new state written back into the pool in one kernel: the same bytes as one `index_copy_`
per state tensor (37 for the full codec), in one launch.

At the engine's codec shapes a step is launch-bound (~400 kernels at 1 row x 1 frame, ~4.6 us each on the H200,
docs/benchmarks.md ninth session), and the write-back was 37 of them. Here a table lists, per state tensor, where
its new value lives (any strided view: the tail of a conv buffer, a fresh ring) and which pool columns take it:

    pool.flat [rows, E]      row = slot; state `s` is columns [col_s, col_s + R_s * L_s)
    table [S, 8] int64       per state s: src address, src strides (row, r, l), R_s, L_s, col_s, 0
    items [I, 2] int64       per program: (state s, first element of its chunk) -- chunks of BLOCK elements
    index [B] int64          the batch's pool rows (padding rows all point at one scratch row)

    program (item, b):  pool.flat[index[b], col_s + o] = src_s[b, o // L_s, o % L_s]   for o in the chunk

A source's non-batch dims are merged into [R, L] where their strides allow (a contiguous ring [H, W, D] becomes
[1, H*W*D]); a source that cannot be merged is copied contiguous first. Under a CUDA graph the addresses are
those of the capture's buffers, so `capture_done()` writes the table after the capture (a copy from host memory
cannot be captured); eagerly each call writes it before its launch.

The twin is the per-tensor `index_copy_`; the kernel copies, so the two agree bitwise (both leave a row indexed
twice, the scratch row, with one of its writers' values).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, use_triton

BLOCK = 1024  # elements a program copies

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from engine.fast.kernels.snake import TRITON_DTYPES

    @triton.jit
    def _state_scatter_kernel(table_ptr, items_ptr, index_ptr, dst_ptr, dst_row_stride,
                              DTYPE: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        item = tl.program_id(0)
        b = tl.program_id(1).to(tl.int64)
        s = tl.load(items_ptr + 2 * item)
        start = tl.load(items_ptr + 2 * item + 1)
        entry = table_ptr + s * 8  # table rows [S, 8]
        src = tl.load(entry).to(tl.pointer_type(DTYPE))
        stride_b, stride_r, stride_l = tl.load(entry + 1), tl.load(entry + 2), tl.load(entry + 3)
        rows, length, column = tl.load(entry + 4), tl.load(entry + 5), tl.load(entry + 6)
        o = start + tl.arange(0, BLOCK).to(tl.int64)
        mask = o < rows * length
        r = o // length
        v = tl.load(src + b * stride_b + r * stride_r + (o - r * length) * stride_l, mask=mask)
        slot = tl.load(index_ptr + b)
        tl.store(dst_ptr + slot * dst_row_stride + column + o, v, mask=mask)


def _merged(t: Tensor) -> tuple[Tensor, int, int, int, int]:
    """t [B, ...] -> (t or a contiguous copy, stride_r, stride_l, R, L): its non-batch dims as [R, L]."""
    dims = [(size, stride) for size, stride in zip(t.shape[1:], t.stride()[1:], strict=True) if size != 1]
    merged: list[tuple[int, int]] = []
    for size, stride in reversed(dims):  # innermost first: merge into the next-inner dim when contiguous with it
        if merged and stride == merged[-1][0] * merged[-1][1]:
            merged[-1] = (merged[-1][0] * size, merged[-1][1])
        else:
            merged.append((size, stride))
    if len(merged) > 2:
        t = t.contiguous()
        merged = [(math.prod(t.shape[1:]), 1)]
    (length, stride_l), (rows, stride_r) = merged + [(1, 1)] * (2 - len(merged))
    return t, stride_r, stride_l, rows, length


class StateScatter:
    """Writes a batch's new codec state into a pool's rows: `pool_tensors[name][index] = new_state[name]` for every
    name, in one kernel on the Triton path (module docstring), per tensor on the twin's."""

    def __init__(self, flat: Tensor, columns: dict[str, tuple[int, int]], tensors: dict[str, Tensor],
                 fused: bool = True):  # fmt: skip
        """flat: the pool's [rows, E] storage; columns: name -> its [start, stop) columns; tensors: name -> the
        pool's [rows, *shape] views (the twin's targets); fused: False always runs the twin."""
        self.flat, self.columns, self.tensors, self.fused = flat, columns, tensors, fused
        self._table: Tensor | None = None  # [S, 8] int64 on the pool's device
        self._items: Tensor | None = None  # [I, 2] int64
        self._pending: Tensor | None = None  # a table built during a capture, written by capture_done()
        self._keep: list[Tensor] = []  # contiguous copies the table points at (none for the engine's sources)

    def __call__(self, index: Tensor, new_state: dict[str, Tensor]) -> None:
        if not self.fused or not use_triton(self.flat):
            for name, tensor in self.tensors.items():
                tensor.index_copy_(0, index, new_state[name])
            return
        table, items = self._describe(new_state, index.shape[0])
        capturing = self.flat.is_cuda and torch.cuda.is_current_stream_capturing()
        if self._table is None or self._table.shape != table.shape or self._items.shape != items.shape:
            if capturing:
                raise RuntimeError("StateScatter: run the step once before capturing it (its tables are built then)")
            self._table, self._items = table.to(self.flat.device), items.to(self.flat.device)
        elif capturing:
            self._pending = table
        else:
            self._table.copy_(table)
        grid = (items.shape[0], index.shape[0])
        _state_scatter_kernel[grid](self._table, self._items, index, self.flat, self.flat.stride(0),
                                    DTYPE=TRITON_DTYPES[self.flat.dtype], BLOCK=BLOCK)  # fmt: skip

    def capture_done(self) -> None:
        """After a graph capture: point the captured kernel at the capture's buffers."""
        if self._pending is not None:
            assert self._table is not None
            self._table.copy_(self._pending)
            self._pending = None

    def _describe(self, new_state: dict[str, Tensor], batch: int) -> tuple[Tensor, Tensor]:
        rows, items, self._keep = [], [], []
        for s, (name, (start, stop)) in enumerate(self.columns.items()):
            source = new_state[name]
            if source.dtype != self.flat.dtype or source.shape[0] != batch or source.device != self.flat.device:
                raise ValueError(f"state {name!r}: expected [{batch}, ...] {self.flat.dtype} on {self.flat.device}, "
                                 f"got {tuple(source.shape)} {source.dtype} on {source.device}")  # fmt: skip
            source, stride_r, stride_l, r, length = _merged(source)
            if r * length != stop - start:
                raise ValueError(f"state {name!r} has {r * length} elements a row, its pool columns {stop - start}")
            if source is not new_state[name]:
                self._keep.append(source)
            rows.append([source.data_ptr(), source.stride(0), stride_r, stride_l, r, length, start, 0])
            items.extend([s, chunk] for chunk in range(0, stop - start, BLOCK))
        return torch.tensor(rows, dtype=torch.int64), torch.tensor(items, dtype=torch.int64)
