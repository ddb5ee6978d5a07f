"""How many frames each request's next codec chunk decodes (0: wait), chosen from its buffer and pace.

`SlackChunkPolicy` is the scheduler's default; any `engine.codec.chunking.ChunkPolicy` plugs in instead,
and `request_chunk_frames` feeds either one from a request's state (the scheduler inlines it for the default
policy, as it runs per request per plan call). Plain Python, no clock reads.
"""

from __future__ import annotations

from itertools import pairwise

from engine.codec.chunking import ChunkPolicy
from engine.request import Phase, RequestState, WorkKind
from engine.scheduling.costmodel import CostModel


class SlackChunkPolicy:
    """Frames to decode now (0: wait); the scheduler's default, pace-aware chunk policy. The next chunk
    is the largest size the listener can afford to wait for: waiting for the missing frames at this
    request's own pace, then decoding them, must end `margin_ms` before its buffer runs dry. A thin
    buffer gives one-frame chunks, a growing one longer chunks (cheaper per frame), so small chunks are
    paid for only when they buy latency or safety.

    Unlike the policies of `engine.codec.chunking` (which the scheduler also accepts), it knows the
    request's own generation pace, so a stream generated far faster than real time moves to long,
    cheap chunks sooner, and one generated slowly under load keeps chunks short (docs/scheduling.md
    compares them). `frames_available` counts every generated frame; `buffered_ms` is the audio the
    listener still has (0 before first audio); `flush` drains what is pending."""

    def __init__(self, costs: CostModel, sizes: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 25),
                 first_chunk_frames: int = 1, margin_ms: float = 40.0) -> None:
        self.sizes = sizes
        self.first_chunk_frames = first_chunk_frames
        self.margin_ms = margin_ms
        # Largest first, with the time to decode that chunk alone (the policy runs per request per step).
        self._largest_first = [(n, costs.ms(WorkKind.CODEC_CHUNK, 1, n)) for n in reversed(sizes)]
        # The sizes that may be worth waiting for with p frames pending (p below the largest size): every size
        # above p, or only the next one up when decoding more frames never costs less: its wait is the shortest
        # and its decode the cheapest, so if any wait is affordable, that one is. Waiting is the answer of most
        # calls (per request per plan call), so this saves a loop each time; the answers are the same.
        by_frames = sorted(self._largest_first)
        monotone = all(a[1] <= b[1] for a, b in pairwise(by_frames))
        self._waits: list[list[tuple[int, float]]] = []
        for p in range(sizes[-1]):
            above = [(n, ms) for n, ms in self._largest_first if n > p]
            self._waits.append([min(above)] if monotone else above)

    def next_chunk_frames(self, frames_decoded: int, frames_available: int, buffered_ms: float,
                          flush: bool, frame_interval_ms: float | None) -> int:
        pending = frames_available - frames_decoded
        if pending <= 0:
            return 0
        if flush:
            return min(pending, self.sizes[-1])
        if frames_decoded == 0 or frame_interval_ms is None:
            return self.first_chunk_frames if pending >= self.first_chunk_frames else 0
        budget = buffered_ms - self.margin_ms
        if pending < self.sizes[-1]:  # a larger chunk is worth waiting for: wait for its frames, then decode it
            for n, decode_ms in self._waits[pending]:
                if (n - pending) * frame_interval_ms + decode_ms <= budget:
                    return 0
        for n, decode_ms in self._largest_first:  # else the largest chunk of what is ready that is out in time
            if n <= pending and decode_ms <= budget:
                return n
        # The buffer is nearly dry: hand over what exists, in an allowed size.
        return max((n for n in self.sizes if n <= pending), default=pending)


def request_chunk_frames(r: RequestState, now_ns: int, slack: SlackChunkPolicy,
                         chunks: ChunkPolicy | None = None, paced: bool = False, deadline_ns: int | None = None) -> int:
    """Frames of `r` to decode in its next chunk at `now_ns` (0: wait), by `chunks` when given, else `slack`.
    It drains what is pending on a flush, once generation is over, while the talker waits for text, or
    while pacing holds generation back (`paced`): no frame is coming soon, so none is worth waiting for.
    `deadline_ns`: `r.effective_deadline_ns()` when the caller has it already (only read once r has audio)."""
    phase = r.phase
    starved = phase is Phase.WAITING_TEXT  # the talker waits for text: hand the listener what exists
    drain = r.flush_pending or starved or phase >= Phase.FINISHING or paced  # FINISHING or ended: generation is over
    buffered: float | None = None  # unknown before first audio
    if r.first_audio_ns is not None:
        deadline = r.effective_deadline_ns() if deadline_ns is None else deadline_ns
        buffered = 0.0 if deadline is None or deadline <= now_ns else (deadline - now_ns) / 1e6
    if chunks is not None:
        return chunks.next_chunk_frames(r.frames_decoded, r.frames_pending, buffered, r.text_ended, drain)
    return slack.next_chunk_frames(r.frames_decoded, r.frames_generated, buffered or 0.0, drain, r.frame_interval_ms)
