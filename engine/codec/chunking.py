"""How many generated frames to decode next for one stream: a policy the scheduler asks every turn (torch-free).

Trade-off: a codec call costs a fixed launch/graph overhead plus a per-frame cost, so big chunks are cheap per
frame (measured on an H200, bf16 graphs, one stream: N=1 costs 2.0 ms, N=12 costs 2.5 ms) but every frame
waiting for its chunk to fill is audio the listener does not have yet. So: decode the first audio as soon as
one frame exists (time to first audio), then let chunks grow only while the listener's remaining playback
buffer can pay for the wait, and shrink them again when it runs low.

    next_chunk_frames(frames_decoded, frames_available, buffered_ms, text_ended, flush) -> frames (0 = wait)

- frames_decoded: frames of this stream already decoded (0 before its first audio).
- frames_available: frames generated and not yet decoded (ready now).
- buffered_ms: audio the listener still has queued, from its playback reports or the gateway's model of
  playback; None when unknown (e.g. before the first audio was sent).
- text_ended: no more text will arrive. Both built-in policies ignore it: the buffer already reflects a
  talker that is waiting for text, and a stalled stream is decoded as soon as its buffer runs low.
- flush: decode what is ready now (end of generation or a client `flush`), at most one maximum chunk per
  call; the caller asks again for the rest.

Results never exceed frames_available; outside a flush they are one of the policy's chunk sizes, which are
meant to be the captured CUDA-graph shapes.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

FRAME_MS = 80.0  # one 12.5 Hz codec frame


@runtime_checkable
class ChunkPolicy(Protocol):
    def next_chunk_frames(
        self,
        frames_decoded: int,
        frames_available: int,
        buffered_ms: float | None,
        text_ended: bool,
        flush: bool,
    ) -> int: ...


def _check_sizes(sizes: Sequence[int], what: str) -> tuple[int, ...]:
    sizes = tuple(int(s) for s in sizes)
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"{what} must be a non-empty list of positive frame counts, got {list(sizes)}")
    return sizes


def _check_inputs(frames_decoded: int, frames_available: int) -> None:
    if frames_decoded < 0 or frames_available < 0:
        raise ValueError(
            f"frame counts must be >= 0, got decoded={frames_decoded} available={frames_available}"
        )


@dataclass(frozen=True)
class FixedSchedule:
    """Chunk k has size schedule[k]; the last entry repeats (e.g. [1, 2, 4, 8, 12] -> 1, 2, 4, 8, 12, 12, ...).

    The chunk index comes from `frames_decoded` (the schedule's cumulative boundaries); after an off-schedule
    chunk (a flush) the stream continues with the size of the chunk it is in. Waits until a whole chunk is
    available, except on flush.
    """

    schedule: tuple[int, ...] = (1, 2, 4, 8, 12)
    _boundaries: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        schedule = _check_sizes(self.schedule, "a chunk schedule")
        object.__setattr__(self, "schedule", schedule)
        object.__setattr__(self, "_boundaries", tuple(itertools.accumulate(schedule[:-1], initial=0)))

    def chunk_size(self, frames_decoded: int) -> int:
        index = bisect.bisect_right(self._boundaries, frames_decoded) - 1
        return self.schedule[index]

    def next_chunk_frames(
        self,
        frames_decoded: int,
        frames_available: int,
        buffered_ms: float | None,
        text_ended: bool,
        flush: bool,
    ) -> int:
        _check_inputs(frames_decoded, frames_available)
        size = self.chunk_size(frames_decoded)
        if flush:
            return min(size, frames_available)
        return size if frames_available >= size else 0


@dataclass(frozen=True)
class AdaptivePolicy:
    """Chunk sizes driven by the listener's remaining playback buffer.

    - First chunk: `first_chunk_frames` (1; use 2 when the silent first frame is skipped, so the first chunk
      carries audible audio), as soon as it is available.
    - Later, with B ms buffered: waiting for a chunk of n frames costs at most n * 80 ms when the talker runs
      at least at realtime (slower than that the stream underruns whatever the codec does), so the target is
      the largest size n with n * 80 ms * headroom <= B. headroom = 2 leaves the other half for the talker
      running slower than realtime under load, the codec call itself, and the network.
    - If at least the target is ready, decode as much as is ready (up to the largest size): it costs about
      the same per call and fills the buffer faster. Otherwise wait, unless the buffer is at or below
      `low_water_ms`: then decode whatever is ready at once (the chunk shrinks as the buffer runs low).
    - buffered_ms unknown after the first chunk: follow `fallback` (a fixed ramp).
    - Sizes are snapped down to `sizes` (the captured shapes); the largest is the cap. Stateless, so one
      policy object serves every stream.
    """

    sizes: tuple[int, ...] = (1, 2, 4, 8, 12)
    first_chunk_frames: int = 1
    headroom: float = 2.0
    low_water_ms: float = 2 * FRAME_MS
    frame_ms: float = FRAME_MS
    fallback: FixedSchedule = field(default_factory=FixedSchedule)

    def __post_init__(self) -> None:
        sizes = tuple(sorted(set(_check_sizes(self.sizes, "chunk sizes"))))
        if sizes[0] != 1:
            raise ValueError("chunk sizes must include 1 so a low buffer can always be served at once")
        if self.first_chunk_frames not in sizes:
            raise ValueError(f"first_chunk_frames {self.first_chunk_frames} must be one of the sizes {sizes}")
        if self.headroom < 1.0 or self.low_water_ms < 0 or self.frame_ms <= 0:
            raise ValueError("headroom must be >= 1, low_water_ms >= 0 and frame_ms > 0")
        object.__setattr__(self, "sizes", sizes)

    @property
    def max_chunk_frames(self) -> int:
        return self.sizes[-1]

    def _largest_size_at_most(self, frames: int) -> int:
        return self.sizes[bisect.bisect_right(self.sizes, frames) - 1] if frames >= 1 else 0

    def target_frames(self, buffered_ms: float) -> int:
        """The chunk the buffer can afford to wait for."""
        return max(1, self._largest_size_at_most(int(buffered_ms // (self.frame_ms * self.headroom))))

    def next_chunk_frames(
        self,
        frames_decoded: int,
        frames_available: int,
        buffered_ms: float | None,
        text_ended: bool,
        flush: bool,
    ) -> int:
        _check_inputs(frames_decoded, frames_available)
        if frames_available == 0:
            return 0
        if flush:
            return min(frames_available, self.max_chunk_frames)
        if frames_decoded == 0:
            return self.first_chunk_frames if frames_available >= self.first_chunk_frames else 0
        if buffered_ms is None:
            return self.fallback.next_chunk_frames(frames_decoded, frames_available, None, text_ended, flush)
        if buffered_ms <= self.low_water_ms or frames_available >= self.target_frames(buffered_ms):
            return self._largest_size_at_most(min(frames_available, self.max_chunk_frames))
        return 0
