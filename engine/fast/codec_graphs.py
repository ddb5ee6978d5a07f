"""`CodecGraphs`: incremental codec decoding replayed from CUDA graphs, one per (batch, new frames) shape.

Drop-in for `engine.codec.stream.decode_incremental(decoder, pool, slots, codes, ...)`: same validation, same
result ([B, N * 1920] in the output dtype), same state left in the pool. Each captured step does the whole
call on the device, gather included, so a replay is one launch:

    static codes [b, K, n] --+
    static index [b] --------+--> gather pool rows -> forward_stream -> scatter new state into the pool rows,
    static real [b] ---------+    (or all of it in one kernel, `state_kernel`), positions[index] += real,
                                  static wav [b, n * 1920]
                                  (real: n per row; a ragged runner's per-row real frames, 0..n)

A call of B rows and N frames is planned (`plan_pieces`, pure) into captured shapes, never run eagerly:
- rows: split into groups of at most the largest captured batch; each group is padded up to the smallest
  captured batch that holds it. Padding rows point at a scratch slot the runner reserves in the pool
  (`RESERVED_SLOTS`), so they read and write garbage state that no stream owns. The static index is refilled
  on every call, so a row left over from an earlier, larger call never writes a live stream's state.
- frames: split greedily into captured frame counts in order (3 -> 2 + 1); decoding a stream's frames in
  consecutive parts equals decoding them at once (the incremental-equals-full property).
One capture memory pool is shared by all graphs: replays run one at a time on one stream and each replay's
output is copied out before the next starts. On a CPU (or `mode="eager"`) the same static buffers and plan run
without graphs, which is how CPU tests cover the bookkeeping.

Capture stream: a runner whose replays may overlap other graphs' replays on another CUDA stream (the engine's
codec lane beside the generation lane) must be captured on a stream of its own (`capture_stream`). PyTorch
keys its cuBLAS/cuBLASLt workspace by the capturing stream and bakes that address into every captured GEMM;
`torch.cuda.graph` captures on one shared default stream, so graphs captured without a stream of their own
share one workspace, and two of them replaying at once on different streams run split-K GEMMs over the same
scratch memory (pytorch/pytorch#193402 describes the sharing): wrong results, or GEMMs whose cross-block
reductions wait on counters the other kernel overwrote.

Conv algorithms: each capture's eager warm-ups run with cuDNN's benchmark mode on (`_cudnn_benchmark`), so every
conv shape gets the algorithm that timed fastest, and the graph bakes that choice in.

Integration: build the pool with `RESERVED_SLOTS` more slots than streams, create `CodecGraphs` before the
first request allocates (it takes its scratch row with `CodecStatePool.reserve`, so afterwards the pool's
`slots` and `free_slots` count streams only), call `capture()` once before the engine reports ready, then call
`decode` where the executor now calls `decode_incremental` (engine/executors/codec.py does all of this).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from engine.codec.stream import (
    CodecStateError,
    CodecStatePool,
    StreamDecoder,
    check_decode_inputs,
    check_pool,
)
from engine.fast.kernels.state_scatter import StateScatter
from engine.model.host_copy import device_ids

RESERVED_SLOTS = 1  # the scratch slot padding rows read and write


@dataclass(frozen=True, slots=True)
class Piece:
    """One replay: caller rows [row_start, row_stop), frames [frame_start, frame_stop), captured shape."""

    row_start: int
    row_stop: int
    frame_start: int
    frame_stop: int
    batch: int  # captured batch size (>= rows; the rest is padding)

    @property
    def rows(self) -> int:
        return self.row_stop - self.row_start

    @property
    def frames(self) -> int:
        return self.frame_stop - self.frame_start


@contextmanager
def _cudnn_benchmark() -> Iterator[None]:
    """cuDNN picks each conv's algorithm by timing the candidates (the first time it meets a shape), not by its
    heuristics: on the H200 the heuristics chose bf16 channels-last kernels 30-100x slower than the best for
    half of the engine's shapes (B x N >= 25 frames: a server with a bf16 codec refused 72 % at 40 RPS), and
    tf32 ones ~9 % slower (docs/benchmarks.md, fourteenth session). The choice is cached per shape, so the
    graphs captured after the warm-ups replay the timed algorithms; the switch is put back after each capture."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def _sizes(values: Iterable[int], what: str) -> tuple[int, ...]:
    sizes = tuple(sorted({int(v) for v in values}))
    if not sizes or sizes[0] != 1:
        raise ValueError(
            f"captured {what} must be positive and include 1 (any call must be coverable), got {sizes}"
        )
    return sizes


def plan_pieces(
    rows: int, frames: int, batch_sizes: Sequence[int], frame_sizes: Sequence[int]
) -> list[Piece]:
    """Cover a call of `rows` streams x `frames` new frames with captured shapes, in the order to replay them.

    Frame parts are outermost: every stream's part k runs before its part k+1 (its state carries over).
    """
    if rows < 1 or frames < 1:
        raise ValueError(f"a codec call needs at least one row and one frame, got {rows} x {frames}")
    batch_sizes, frame_sizes = _sizes(batch_sizes, "batch sizes"), _sizes(frame_sizes, "frame counts")
    largest = batch_sizes[-1]
    groups = [(start, min(start + largest, rows)) for start in range(0, rows, largest)]
    pieces, done = [], 0
    while done < frames:
        part = frame_sizes[bisect.bisect_right(frame_sizes, frames - done) - 1]
        for start, stop in groups:
            batch = batch_sizes[bisect.bisect_left(batch_sizes, stop - start)]
            pieces.append(Piece(start, stop, done, done + part, batch))
        done += part
    return pieces


class _Step:
    """One captured shape: static inputs, the device step (graph or eager), the static output. A ragged step
    also reads `real` [batch]: how many of each row's frames are real (its stream advances by that many)."""

    def __init__(self, decoder: StreamDecoder, pool: CodecStatePool, batch: int, frames: int, scratch: int,
                 ragged: bool = False, state_kernel: bool = False):  # fmt: skip
        self.decoder, self.pool, self.batch, self.frames, self.scratch = decoder, pool, batch, frames, scratch
        self.ragged = ragged
        device = pool.device
        self.codes = torch.zeros(
            batch, decoder.config.num_quantizers, frames, dtype=torch.int64, device=device
        )
        self.index = torch.full((batch,), scratch, dtype=torch.int64, device=device)
        self.real = torch.full((batch,), frames, dtype=torch.int64, device=device)  # frames each row advances
        self.wav: Tensor | None = None  # [batch, frames * 1920], model dtype; valid after run()
        self.graph: torch.cuda.CUDAGraph | None = None
        # new state -> pool rows: one index_copy_ per state tensor, or (state_kernel) all in one kernel
        self.scatter = StateScatter(pool.flat, pool.columns, pool.tensors, fused=state_kernel)

    @torch.no_grad()
    def _body(self) -> Tensor:
        positions, state = self.pool.gather(self.index)
        wav, new_state = self.decoder.forward_stream(self.codes, positions, state,
                                                     self.real if self.ragged else None)  # fmt: skip
        self.scatter(self.index, new_state)
        self.pool.positions.index_add_(0, self.index, self.real)
        return wav.squeeze(1)

    def capture(self, memory_pool: object, capture_stream: torch.cuda.Stream | None = None, warmups: int = 2) -> None:
        """Warm up (autotuning, Triton compiles) on a side stream, then capture (on `capture_stream`, None: PyTorch's
        shared default capture stream). Only the scratch slot is touched."""
        self.index.fill_(self.scratch)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with _cudnn_benchmark(), torch.cuda.stream(side):
            for _ in range(warmups):
                self._body()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with _cudnn_benchmark(), torch.cuda.graph(self.graph, pool=memory_pool, stream=capture_stream):
            self.wav = self._body()  # every conv shape was timed in the warm-ups: the cached choice is captured
        self.scatter.capture_done()

    def run(self) -> Tensor:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.wav = self._body()
        assert self.wav is not None
        return self.wav


class CodecGraphs:
    """Replays captured incremental-decode steps over a `CodecStatePool` (see the module docstring)."""

    def __init__(
        self,
        decoder: StreamDecoder,
        pool: CodecStatePool,
        batch_sizes: Sequence[int],
        frame_sizes: Sequence[int],
        *,
        mode: str | None = None,
        ragged: bool = False,
        own_capture_stream: bool = False,
        state_kernel: bool = False,
    ):
        """`ragged`: steps take per-row real frame counts (`decode(frames=...)`), at the price of a few more
        kernels per step (masks and gathers), so it is chosen when the runner is built. `own_capture_stream`:
        capture on a CUDA stream of this runner's own, so its GEMMs get a cuBLAS workspace no other graph uses
        (required when its replays may overlap other graphs' on another stream; module docstring). `state_kernel`:
        write each step's new state back in one kernel (kernels/state_scatter.py) instead of 37 `index_copy_`s
        (the engine's `--codec-kernels fused`, its default)."""
        if mode is None:
            mode = "graph" if pool.device.type == "cuda" else "eager"
        if mode not in ("graph", "eager"):
            raise ValueError(f"CodecGraphs mode must be 'graph' or 'eager', got {mode!r}")
        if mode == "graph" and pool.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device; use mode='eager' on a CPU")
        check_pool(decoder, pool)
        self.decoder, self.pool, self.mode, self.ragged, self.state_kernel = decoder, pool, mode, ragged, state_kernel
        self.batch_sizes = _sizes(batch_sizes, "batch sizes")
        self.frame_sizes = _sizes(frame_sizes, "frame counts")
        if pool.free_slots < RESERVED_SLOTS:
            raise CodecStateError(
                f"CodecGraphs reserves {RESERVED_SLOTS} scratch slot(s) but the pool has none free: build it "
                f"with streams + {RESERVED_SLOTS} slots"
            )
        self.scratch = pool.reserve()
        self._steps: dict[tuple[int, int], _Step] = {}
        self._memory_pool = torch.cuda.graph_pool_handle() if mode == "graph" else None
        self.capture_stream = torch.cuda.Stream(pool.device) if mode == "graph" and own_capture_stream else None
        self.replays = 0  # steps run so far (graph replays, or eager steps in eager mode)

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """Every (batch, frames) shape this runner can replay."""
        return [(b, n) for b in self.batch_sizes for n in self.frame_sizes]

    @property
    def captured(self) -> list[tuple[int, int]]:
        return sorted(self._steps)

    def capture(self, shapes: Iterable[tuple[int, int]] | None = None) -> None:
        """Build (and in graph mode capture) the steps for `shapes` (default: all), largest first so smaller
        captures reuse the shared pool's memory. Must run before `decode` in graph mode."""
        wanted = sorted(self.shapes if shapes is None else shapes, key=lambda s: s[0] * s[1], reverse=True)
        for batch, frames in wanted:
            if batch not in self.batch_sizes or frames not in self.frame_sizes:
                raise ValueError(f"shape ({batch}, {frames}) is not one of this runner's sizes")
            if (batch, frames) in self._steps:
                continue
            step = _Step(self.decoder, self.pool, batch, frames, self.scratch, self.ragged, self.state_kernel)
            if self.mode == "graph":
                step.capture(self._memory_pool, self.capture_stream)
            self._steps[(batch, frames)] = step
        if self.mode == "graph":
            torch.cuda.synchronize()

    def _step(self, batch: int, frames: int) -> _Step:
        step = self._steps.get((batch, frames))
        if step is None:
            if self.mode == "graph":
                raise RuntimeError(
                    f"codec graph ({batch} rows, {frames} frames) was not captured: call capture() first "
                    "(a codec step never runs eagerly on the GPU)"
                )
            step = self._steps[(batch, frames)] = _Step(self.decoder, self.pool, batch, frames, self.scratch,
                                                        self.ragged, self.state_kernel)
        return step

    @torch.no_grad()
    def decode(
        self,
        slots: Sequence[int],
        codes: Tensor,
        *,
        expected_positions: Sequence[int] | None = None,
        check_code_values: bool = True,
        frames: Sequence[int] | None = None,
    ) -> Tensor:
        """codes [B, K, N] continuing the streams in `slots` -> wav [B, N * 1920] (output dtype); as
        `decode_incremental`, on captured steps (`frames`: a ragged call's real frames per row, ragged runners
        only)."""
        slots = check_decode_inputs(self.decoder, self.pool, slots, codes, expected_positions, check_code_values)
        n = codes.shape[-1]
        if frames is not None:
            frames = [int(f) for f in frames]
            if not self.ragged:
                raise ValueError("this codec runner was built for whole batches; build it with ragged=True")
            if len(frames) != len(slots) or not all(1 <= f <= n for f in frames):
                raise ValueError(f"frames must give one count in 1..{n} per slot, got {frames}")
        if self.scratch in slots:
            raise CodecStateError(f"slot {self.scratch} is the codec graphs' scratch slot, not a stream's")
        pieces = plan_pieces(len(slots), n, self.batch_sizes, self.frame_sizes)
        device = self.pool.device
        codes = codes.to(device, torch.int64)
        index = device_ids(slots, device)  # queued, not waited for
        per_frame = self.decoder.config.samples_per_frame
        out = torch.empty(len(slots), n * per_frame, device=device, dtype=self.decoder.output_dtype)
        for piece in pieces:
            step = self._step(piece.batch, piece.frames)
            rows = slice(piece.row_start, piece.row_stop)
            step.codes[: piece.rows].copy_(codes[rows, :, piece.frame_start : piece.frame_stop])
            step.index[: piece.rows].copy_(index[rows])
            # padding rows -> scratch: rows left over from an earlier, larger call must not write their streams
            step.index[piece.rows :].fill_(self.scratch)
            if frames is not None:  # this piece's real frames per row: 0 once a row's real frames are done
                real = [min(max(f - piece.frame_start, 0), piece.frames) for f in frames[rows]]
                step.real[: piece.rows].copy_(device_ids(real, device))
                step.real[piece.rows :].fill_(piece.frames)
            elif self.ragged:
                step.real.fill_(piece.frames)
            wav = step.run()
            out[rows, piece.frame_start * per_frame : piece.frame_stop * per_frame].copy_(wav[: piece.rows])
            self.replays += 1
        self.pool.advance(slots, n if frames is None else frames)  # device positions advanced in the steps
        return out
