"""The one CUDA-graph helper: capture sizes, padding, cohort splitting, static inputs, one shared pool.

A fast path is a `step(key)` function over static buffers (key = padded batch size, or (size, bucket)):
it reads its per-row inputs from a `StaticInputs` table and writes its results into preallocated
tensors, so its captured graph can be replayed with new inputs. `CapturedSteps` captures one graph per
key into a memory pool shared by every graph of the process (graphs replay one at a time on one stream,
so their intermediates can share memory), and off the GPU runs the same step eagerly at the same padded
shapes, so CPU tests exercise exactly the bookkeeping the GPU replays.

Padding duplicates the last real row: a padded row computes exactly what its original computes and
writes the same values to the same places, so padding never touches another request's state.
Cohorts larger than the largest captured size are split into several replays, never run eagerly.

Static inputs (int64, F named fields, M = largest size):

    device[F, M]      read by the graphs, columns 0..n-1 valid for a replay of size n
    host[2][F, M]     pinned; filled on the host, copied with one non-blocking copy; two of them,
                      each guarded by an event, so filling step k+1 never races the copy of step k
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch
from torch import Tensor

_POOL: tuple[int, int] | None = None


def shared_pool() -> tuple[int, int]:
    """One CUDA-graph memory pool for every captured graph of this process."""
    global _POOL
    if _POOL is None:
        _POOL = torch.cuda.graph_pool_handle()
    return _POOL


def check_sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    ordered = tuple(sorted(set(sizes)))
    if not ordered or ordered[0] < 1:
        raise ValueError(f"capture sizes must be positive integers, got {tuple(sizes)}")
    return ordered


def padded_size(rows: int, sizes: Sequence[int]) -> int:
    """The smallest captured size that holds `rows` rows."""
    for size in sizes:
        if size >= rows:
            return size
    raise ValueError(f"{rows} rows exceed the largest captured size {max(sizes)}; split the cohort first")


def split_cohort(rows: int, sizes: Sequence[int]) -> list[range]:
    """Row ranges of at most the largest captured size each, in order (largest pieces first)."""
    if rows < 1:
        raise ValueError("a cohort needs at least one row")
    largest = max(sizes)
    return [range(start, min(start + largest, rows)) for start in range(0, rows, largest)]


def pad_rows(values: Sequence[int], size: int) -> list[int]:
    """Repeat the last value up to `size` entries (duplicate-row padding)."""
    if not values or len(values) > size:
        raise ValueError(f"cannot pad {len(values)} values to {size}")
    return [*values, *([values[-1]] * (size - len(values)))]


class StaticInputs:
    """Per-row int64 inputs of a captured step (layout in the module docstring)."""

    def __init__(self, fields: Sequence[str], max_rows: int, device: torch.device) -> None:
        self.fields = {name: i for i, name in enumerate(fields)}
        self.max_rows = max_rows
        self.device = device
        self.table = torch.zeros(len(fields), max_rows, dtype=torch.int64, device=device)
        pin = device.type == "cuda"
        self._host = [torch.zeros(len(fields), max_rows, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self._copied = [torch.cuda.Event() if pin else None for _ in range(2)]
        self._turn = 0

    def __getitem__(self, name: str) -> Tensor:
        """The device row of one field, [M]; a step slices [:n]."""
        return self.table[self.fields[name]]

    def load(self, rows: int, **columns: Sequence[int]) -> None:
        """Write `rows` values of every field (each padded already) and send them in one copy."""
        if rows > self.max_rows:
            raise ValueError(f"{rows} rows exceed the static buffers' {self.max_rows}")
        if set(columns) != set(self.fields):
            raise ValueError(f"static inputs need fields {sorted(self.fields)}, got {sorted(columns)}")
        host, event = self._host[self._turn], self._copied[self._turn]
        if event is not None:
            event.synchronize()  # the copy that last read this host buffer is done (normally long ago)
        for name, values in columns.items():
            if len(values) != rows:
                raise ValueError(f"field {name!r} has {len(values)} values, expected {rows}")
            host[self.fields[name], :rows] = torch.as_tensor(values, dtype=torch.int64)
        self.table[:, :rows].copy_(host[:, :rows], non_blocking=event is not None)
        if event is not None:
            event.record()
        self._turn ^= 1


Key = Hashable


class CapturedSteps:
    """One step function captured as a CUDA graph per key; eager at the same shapes when graphs are off."""

    def __init__(self, name: str, step: Callable[[Key], None], keys: Sequence[Key], *, use_graphs: bool,
                 pool: tuple[int, int] | None = None) -> None:  # fmt: skip
        self.name = name
        self.step = step
        self.keys = tuple(keys)
        self.use_graphs = use_graphs
        self.pool = pool
        self.graphs: dict[Key, torch.cuda.CUDAGraph] = {}
        self.replays = 0  # replays of captured graphs
        self.eager_runs = 0  # steps run without a graph (only when graphs are off)

    @property
    def captured(self) -> bool:
        return not self.use_graphs or len(self.graphs) == len(self.keys)

    def capture(self, warmup: int = 2) -> None:
        """Warm up every key on a side stream (kernel compilation, cuBLAS workspaces), then capture each,
        largest key first so smaller graphs reuse the pool's blocks. The steps scribble on the state they
        address (row 0 of the slot tensors): capture before any request is admitted."""
        if not self.use_graphs:
            return
        pool = self.pool if self.pool is not None else shared_pool()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for key in self.keys:
                for _ in range(warmup):
                    self.step(key)
        torch.cuda.current_stream().wait_stream(side)
        for key in sorted(self.keys, key=_order, reverse=True):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.step(key)
            self.graphs[key] = graph
        torch.cuda.synchronize()

    def replay(self, key: Key) -> None:
        if not self.use_graphs:
            self.eager_runs += 1
            self.step(key)
            return
        graph = self.graphs.get(key)
        if graph is None:
            raise RuntimeError(f"{self.name}: no graph captured for {key!r} (captured: {sorted(self.graphs, key=_order)})")
        graph.replay()
        self.replays += 1


def _order(key: Key) -> tuple:
    return key if isinstance(key, tuple) else (key,)
