"""Exact incremental codec decoding for many streams at once, each carrying its own fixed-shape state.

A `CodecStatePool` preallocates the state of `slots` streams: one tensor per entry of `codec_state_layout`,
with the slot as leading dimension, plus an int64 frame position per slot (the valid length: it says which
KV-ring entries hold real frames). Shapes never depend on history, so requests at different positions decode
in one batch and a CUDA graph per (batch, frames) shape can later index the same storage.

    pool.flat            [rows, state elements]   model dtype, one row per slot, zeroed when a slot is allocated
    pool.tensors[name]   [rows, *layout[name]]    views of columns of `flat`, in layout order
    pool.positions       [rows] int64             frames decoded so far (device copy, used by the kernels)
    host mirror          positions + allocated flags, for validation without reading the device

One flat row per slot makes gathering a batch's state one `index_select` instead of one per state tensor
(~37): at the engine's small batches a codec step is launch-bound.

`rows` is the storage built; `slots` the streams it can hold: `rows` minus the rows `reserve()` took for good
(a runner's scratch row, e.g. `engine.fast.codec_graphs.CodecGraphs`' padding target). So `free_slots ==
slots` means no stream holds state, whatever the runner keeps for itself.

`decode_incremental(decoder, pool, slots, codes)` gathers the batch's state rows, decodes the N new frames of
each stream with `CodecDecoder.forward_stream`, and scatters the new state back. A freshly allocated slot is
all zeros, which is exactly the zero left padding of a full decode, so a stream's first chunk is a full decode
of its first frames and leaves the state behind; every later chunk is incremental. The concatenated output of
any chunk schedule equals `decoder.decode` of all frames (fp32: ~1e-7 relative).

Per-request frame counts: one call decodes N frames for every stream of the batch (the CUDA-graph shape). A
ragged call (`frames`, plain decoder only so far) says how many of each row's N frames are real: the rest are
padding, kept out of the state (`CodecDecoder.forward_stream`), and each stream advances by its own count.

Failing loudly: decoding a slot that is not allocated (never, or already freed), a slot twice in one batch, a
position other than the caller's `expected_positions`, codes of the wrong shape or range, or a pool built for
another config / dtype / device raises before any state changes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from engine.codec.config import CodecConfig
from engine.codec.state_layout import POSITION_BYTES, codec_state_layout


class CodecStateError(RuntimeError):
    """A decode asked for state that does not exist or does not match the caller's view of the stream."""


class StreamDecoder(Protocol):
    """What streaming needs of a decoder: `CodecDecoder` and `engine.fast.codec_fast.FastCodecDecoder` qualify."""

    @property
    def config(self) -> CodecConfig: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def output_dtype(self) -> torch.dtype: ...
    def check_codes(self, codes: Tensor, *, check_values: bool = True) -> None: ...
    def forward_stream(
        self, codes: Tensor, positions: Tensor, state: dict[str, Tensor], frames: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


class CodecStatePool:
    """Fixed storage for the codec state of up to `slots` concurrent streams."""

    def __init__(self, config: CodecConfig, slots: int, device: str | torch.device, dtype: torch.dtype):
        if slots < 1:
            raise ValueError(f"a codec state pool needs at least one slot, got {slots}")
        self.config = config
        self.rows = slots  # storage rows; `slots` (streams) excludes the reserved ones
        self.device = torch.empty(0, device=device).device  # "cuda" -> "cuda:0", comparable with tensors'
        self.dtype = dtype
        self.layout = codec_state_layout(config)
        self._columns: dict[str, tuple[int, int, tuple[int, ...]]] = {}  # name -> (start, stop, shape)
        start = 0
        for name, shape in self.layout.items():
            stop = start + int(np.prod(shape, dtype=np.int64))
            self._columns[name] = (start, stop, tuple(shape))
            start = stop
        self.flat = torch.zeros(slots, start, device=self.device, dtype=dtype)
        self.tensors: dict[str, Tensor] = self._views(self.flat)
        self.positions = torch.zeros(slots, device=self.device, dtype=torch.int64)
        self._host_positions = [0] * slots
        self._allocated = [False] * slots
        self._reserved: set[int] = set()
        self._free: deque[int] = deque(range(slots))

    @property
    def columns(self) -> dict[str, tuple[int, int]]:
        """name -> its [start, stop) columns of `flat`, in layout order."""
        return {name: (a, b) for name, (a, b, _) in self._columns.items()}

    def _views(self, rows: Tensor) -> dict[str, Tensor]:
        """Per-name views [R, *shape] of flat state rows [R, state elements]."""
        return {
            name: rows[:, a:b].view(rows.shape[0], *shape) for name, (a, b, shape) in self._columns.items()
        }

    # ------------------------------------------------------------------ accounting

    @property
    def bytes_per_slot(self) -> int:
        """Device bytes one stream's state occupies (all state tensors plus its int64 position)."""
        return sum(t[0].numel() * t.element_size() for t in self.tensors.values()) + POSITION_BYTES

    @property
    def total_bytes(self) -> int:
        """Device bytes of the whole pool, reserved rows included."""
        return self.bytes_per_slot * self.rows

    @property
    def slots(self) -> int:
        """Streams the pool can hold: its rows less the reserved ones."""
        return self.rows - len(self._reserved)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def used_slots(self) -> int:
        return self.slots - len(self._free)

    # ------------------------------------------------------------------ lifecycle

    def alloc(self) -> int:
        """Claim a slot with empty state (position 0). Raises CodecStateError when every slot is taken."""
        if not self._free:
            raise CodecStateError(f"codec state pool exhausted: all {self.slots} slots are in use")
        slot = self._free.popleft()
        self.flat[slot].zero_()
        self.positions[slot : slot + 1].zero_()  # a kernel; a Python scalar written in would sync
        self._host_positions[slot] = 0
        self._allocated[slot] = True
        return slot

    def free(self, slot: int) -> None:
        """Return a slot; its state becomes unreachable until it is allocated (and zeroed) again."""
        self._check_slot(slot)
        self._allocated[slot] = False
        self._free.append(slot)

    def load(self, slot: int, row: Tensor, position: int) -> None:
        """Give the stream in `slot` a state saved from another (`flat[other].clone()` after it decoded
        `position` frames): the slot then continues that stream (a voice's reference codes decoded once)."""
        self._check_slot(slot)
        if row.shape != self.flat[slot].shape or position < 0:
            raise ValueError(f"a state row of shape {tuple(self.flat[slot].shape)} and a position >= 0 are needed, "
                             f"got {tuple(row.shape)} at {position}")
        self.flat[slot].copy_(row)
        self.positions[slot : slot + 1].fill_(position)
        self._host_positions[slot] = position

    def reserve(self) -> int:
        """Take a free slot out of stream service for the pool's lifetime (a runner's scratch row): zeroed,
        never handed out, freed or decoded as a stream, and no longer counted in `slots` or `free_slots`."""
        slot = self.alloc()
        self._reserved.add(slot)
        return slot

    def clone(self) -> CodecStatePool:
        """An independent pool with the same state, positions, streams and reservations (checks and tests
        that decode the same streams two ways)."""
        copy = CodecStatePool(self.config, self.rows, self.device, self.dtype)
        copy.flat.copy_(self.flat)
        copy.positions.copy_(self.positions)
        copy._host_positions = list(self._host_positions)
        copy._allocated = list(self._allocated)
        copy._reserved = set(self._reserved)
        copy._free = deque(self._free)
        return copy

    def position(self, slot: int) -> int:
        """Frames decoded so far by the stream in `slot`."""
        self._check_slot(slot)
        return self._host_positions[slot]

    def is_allocated(self, slot: int) -> bool:
        return 0 <= slot < self.rows and self._allocated[slot]

    def _check_slot(self, slot: int) -> None:
        if isinstance(slot, bool) or not isinstance(slot, int | np.integer):
            raise TypeError(f"codec state slot must be an int, got {type(slot).__name__}")
        if not 0 <= slot < self.rows:
            raise CodecStateError(f"codec state slot {slot} does not exist (pool has {self.rows} slots)")
        if slot in self._reserved:
            raise CodecStateError(f"codec state slot {slot} is reserved as a scratch row, not a stream's")
        if not self._allocated[slot]:
            raise CodecStateError(
                f"codec state slot {slot} is not allocated (never allocated, or already freed): "
                "it holds no stream's state"
            )

    # ------------------------------------------------------------------ batch access (used by decode_incremental)

    def check_batch(self, slots: Sequence[int], expected_positions: Sequence[int] | None) -> None:
        for slot in slots:
            self._check_slot(slot)
        if len(set(slots)) != len(slots):
            raise CodecStateError(f"a codec state slot appears twice in one batch: {list(slots)}")
        if expected_positions is not None:
            if len(expected_positions) != len(slots):
                raise ValueError("expected_positions must give one position per slot")
            for slot, expected in zip(slots, expected_positions, strict=True):
                if self._host_positions[slot] != expected:
                    raise CodecStateError(
                        f"codec state slot {slot} has decoded {self._host_positions[slot]} frames but the caller "
                        f"expects {expected}: its state does not continue the caller's stream"
                    )

    def gather(self, index: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """index [B] -> (positions [B], state per name [B, *shape]: views of one gathered copy, not the pool)."""
        return self.positions.index_select(0, index), self._views(self.flat.index_select(0, index))

    def scatter(self, index: Tensor, slots: Sequence[int], state: dict[str, Tensor],
                frames: int | Sequence[int]) -> None:  # fmt: skip
        """Write a batch's new state back; `frames`: every stream's new frames, or one count per stream."""
        for name, tensor in self.tensors.items():
            tensor.index_copy_(0, index, state[name])
        counts = torch.full_like(index, frames) if isinstance(frames, int) else \
            torch.tensor(list(frames), dtype=index.dtype, device=index.device)
        self.positions.index_add_(0, index, counts)
        self.advance(slots, frames)

    def advance(self, slots: Sequence[int], frames: int | Sequence[int]) -> None:
        """Host only: the streams in `slots` decoded `frames` more frames (one count for all, or one per slot),
        state and device positions written already (by `scatter`, or inside a runner's captured step); keep the
        host mirror in step."""
        counts = [frames] * len(slots) if isinstance(frames, int) else list(frames)
        if len(counts) != len(slots):
            raise ValueError("advance needs one frame count per slot")
        if any(count < 1 for count in counts):
            raise ValueError(f"a stream advances by at least one frame, got {counts}")
        for slot in slots:
            self._check_slot(slot)
        for slot, count in zip(slots, counts, strict=True):
            self._host_positions[slot] += count


@torch.no_grad()
def decode_incremental(
    decoder: StreamDecoder,
    pool: CodecStatePool,
    slots: Sequence[int],
    codes: Tensor,
    *,
    expected_positions: Sequence[int] | None = None,
    check_code_values: bool = True,
    frames: Sequence[int] | None = None,
) -> Tensor:
    """Decode N new frames for each stream in `slots`: codes [B, 16, N] -> wav [B, N * 1920] (float32; float64
    for a float64 decoder).

    Row b of `codes` continues the stream held in `slots[b]`; each stream may be at its own position.
    `expected_positions[b]`, when given, must equal the frames that slot has decoded (guards against a slot
    reused by another request). `check_code_values=False` skips the range check (it reads the codes back to
    the host; the GPU path checks ids where they are sampled instead). `frames` (a ragged batch): row b has
    only frames[b] real frames (1..N); its stream advances by that many and only wav[b, :frames[b] * 1920]
    is audio (padding codes must still be valid ids).
    """
    check_pool(decoder, pool)
    slots = check_decode_inputs(decoder, pool, slots, codes, expected_positions, check_code_values)
    n = codes.shape[-1]
    if frames is not None:
        frames = [int(f) for f in frames]
        if len(frames) != len(slots) or not all(1 <= f <= n for f in frames):
            raise ValueError(f"frames must give one count in 1..{n} per slot, got {frames}")
    index = torch.tensor(slots, device=pool.device, dtype=torch.int64)
    positions, state = pool.gather(index)
    counts = None if frames is None else torch.tensor(frames, device=pool.device, dtype=torch.int64)
    wav, new_state = decoder.forward_stream(codes.to(pool.device, torch.int64), positions, state, counts)
    pool.scatter(index, slots, new_state, n if frames is None else frames)
    return wav.squeeze(1).to(decoder.output_dtype)


def check_decode_inputs(
    decoder: StreamDecoder,
    pool: CodecStatePool,
    slots: Sequence[int],
    codes: Tensor,
    expected_positions: Sequence[int] | None,
    check_code_values: bool,
) -> list[int]:
    """Raise before any state changes unless `codes` [B, K, N >= 1] can continue the streams in `slots`;
    -> the slots as plain ints. Shared by every decode path (eager here, captured in `CodecGraphs`)."""
    decoder.check_codes(codes, check_values=check_code_values)
    slots = list(slots)
    if codes.shape[0] != len(slots):
        raise ValueError(f"codes has {codes.shape[0]} rows but {len(slots)} slots were given")
    if codes.shape[-1] == 0:
        raise ValueError("decoding needs at least one new frame per stream")
    pool.check_batch(slots, expected_positions)
    return [int(slot) for slot in slots]  # validated above (ints or numpy integers)


def check_pool(decoder: StreamDecoder, pool: CodecStatePool) -> None:
    """Raise unless `pool` holds state for this decoder's config, dtype and device."""
    if not isinstance(pool, CodecStatePool):
        raise TypeError(f"pool must be a CodecStatePool, got {type(pool).__name__}")
    if pool.config != decoder.config:
        raise CodecStateError("the codec state pool was built for a different codec config than this decoder")
    if pool.dtype != decoder.dtype or pool.device != decoder.device:
        raise CodecStateError(
            f"codec state pool is {pool.dtype} on {pool.device} but the decoder is {decoder.dtype} on "
            f"{decoder.device}; build the pool with the decoder's dtype and device"
        )
