"""What a session knows about its contexts: each one's record and wire shapes, and which are live or recent.

A `Context` is one stream of a session: its text, its engine request, its playback clock and the
counters its audio frames and events carry. `ContextTable` holds a session's live contexts by id
and remembers the last `RECENT_CONTEXTS` finished ones, so late playback reports about them are not
errors; it also hands out stream numbers and refuses ids and counts the protocol does not allow.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from engine.ipc.messages import Layout, Submit
from gateway import protocol as p
from gateway.audio import OPUS_PACKET_SAMPLES, OpusPacketizer
from gateway.clock import NS_PER_MS, SAMPLE_RATE, PlaybackClock, samples_to_ns
from gateway.compat.timings import CharTimeline, WordTimeline
from gateway.engines import EngineRequest
from gateway.metrics import Gauge
from gateway.resample import Resampler
from gateway.textstream import Piece, TextStream
from gateway.voices import Voice

RECENT_CONTEXTS = 64  # finished contexts remembered so late playback reports are not errors
# The engine moves the last deadline it was told later by the audio it publishes after it (`Deadline.samples`), so
# the gateway tells it a new one only where the listener drifts from that reckoning:
DEADLINE_EARLIER_NS = 1 * NS_PER_MS  # earlier is always worth telling the engine
DEADLINE_LATER_NS = 200 * NS_PER_MS  # later only once it drifted this much (bounds messages per stream)


@dataclass(eq=False)
class Context:
    context_id: str
    stream: int
    voice: Voice
    language: str
    instructions: str
    audio_format: str
    text: TextStream
    created_ns: int
    instruct_ids: tuple[int, ...] = ()
    max_lead_ms: int = 0  # pacing (session.update max_lead_ms): audio the engine may run ahead; 0 = unpaced
    seed: int | None = None  # the sampling seed a client chose (compatible protocols); None: a random one
    request: EngineRequest | None = None
    pump: asyncio.Task[None] | None = None
    opus: OpusPacketizer | None = None
    sample_rate: int = p.SAMPLE_RATE  # output rate: every sample count of this context is in its samples
    resampler: Resampler | None = None  # pcm16 at another rate than the engine's 24 kHz
    clock: PlaybackClock = field(default_factory=PlaybackClock)
    words: WordTimeline | None = None  # word.timing events asked for: the words, and their characters' times
    char_times: CharTimeline | None = None
    ended: bool = False
    cancelled: bool = False
    finished: bool = False
    first_text_ns: int | None = None
    sequence: int = 0
    samples_queued: int = 0  # PCM samples turned into frames (timeline position of the next frame)
    samples_sent: int = 0  # real samples actually written to the socket
    heard_samples: int | None = None
    last_deadline: tuple[int, int] | None = None  # the last (deadline_ns, engine samples) told to the engine
    underruns_reported: int = 0

    def audio_description(self) -> dict[str, Any]:
        """The `audio` shape of `context.created` (Opus adds its packet size and pre-skip)."""
        pre_skip = self.opus.pre_skip if self.opus is not None else None
        return p.audio_description(
            self.audio_format,
            samples_per_packet=OPUS_PACKET_SAMPLES if self.opus else None,
            pre_skip=pre_skip,
            sample_rate=self.sample_rate,
        )

    def submit(self, piece: Piece, *, ended: bool) -> Submit:
        """The engine request this context opens with its first piece of text."""
        return Submit(
            request_id=0,
            speaker=self.voice.speaker,
            voice=self.voice.saved,
            language=self.language,
            text_ids=piece.ids,
            text_chars=piece.chars,
            text_ended=ended,
            instruct_ids=self.instruct_ids,
            layout=Layout.STREAMING,
            seed=secrets.randbits(31) if self.seed is None else self.seed,
            arrival_ns=self.first_text_ns or self.created_ns,
            max_lead_ms=self.max_lead_ms,
        )

    def frame(self, payload: bytes, samples: int, *, last: bool, advance: int | None = None) -> bytes:
        """The next binary audio frame; moves the timeline on by `advance` (default: `samples`)."""
        flags = (p.FLAG_FIRST if self.sequence == 0 else 0) | (p.FLAG_LAST if last else 0)
        frame = p.audio_frame(flags, self.stream, self.sequence, self.samples_queued, payload)
        self.sequence += 1
        self.samples_queued += samples if advance is None else advance
        return frame

    def deadline_due(self, now_ns: int) -> tuple[int, int] | None:
        """A new playback deadline worth telling the engine, with the audio it counts as sent in the engine's
        samples (24 kHz), then remembered as told; None while the engine's own reckoning from the last one told
        (later by the audio sent since) is within the bounds above."""
        deadline = self.clock.deadline_ns(now_ns)
        if deadline is None:
            return None
        samples = self.clock.samples_sent * SAMPLE_RATE // self.clock.sample_rate
        if self.last_deadline is not None:
            last_ns, last_samples = self.last_deadline
            reckoned = last_ns + samples_to_ns(samples - last_samples, SAMPLE_RATE)
            if reckoned - DEADLINE_EARLIER_NS < deadline < reckoned + DEADLINE_LATER_NS:
                return None
        self.last_deadline = (deadline, samples)
        return deadline, samples


class ContextTable:
    """A session's live contexts by id and its recently finished ones; `active` sums all sessions."""

    def __init__(self, max_live: int, active: Gauge) -> None:
        self.live: dict[str, Context] = {}
        self.recent: OrderedDict[str, Context] = OrderedDict()
        self.next_stream = 1
        self.changed = asyncio.Event()  # set whenever a context finishes
        self._max_live = max_live
        self._active = active

    def check_unused(self, context_id: str, event_id: str | None, *, explicit: bool) -> None:
        """A new context may not reuse a live id, nor (explicitly created) a recently finished one."""
        if context_id in self.live or (explicit and context_id in self.recent):
            raise p.ProtocolError(
                "context_exists",
                f"context {context_id!r} already exists",
                event_id=event_id,
                context_id=context_id,
            )
        if context_id in self.recent:
            raise p.ProtocolError(
                "context_closed",
                f"context {context_id!r} has finished",
                event_id=event_id,
                context_id=context_id,
            )

    def check_room(self, context_id: str, event_id: str | None) -> None:
        """A new context needs a free live slot and a stream number left."""
        if len(self.live) >= self._max_live:
            raise p.ProtocolError(
                "too_many_contexts",
                f"at most {self._max_live} live contexts per socket",
                event_id=event_id,
                context_id=context_id,
            )
        if self.next_stream > 0xFFFF:
            raise p.ProtocolError(
                "too_many_contexts",
                "this socket used all 65535 stream numbers; open a new one",
                event_id=event_id,
                context_id=context_id,
            )

    def add(self, ctx: Context) -> None:
        self.live[ctx.context_id] = ctx
        self._active.inc()

    def get_live(self, context_id: str, event_id: str | None) -> Context:
        """The live context `context_id`, or the error for a finished or unknown one."""
        ctx = self.live.get(context_id)
        if ctx is not None:
            return ctx
        if context_id in self.recent:
            raise p.ProtocolError(
                "context_closed",
                f"context {context_id!r} has finished",
                event_id=event_id,
                context_id=context_id,
            )
        raise p.ProtocolError(
            "unknown_context", f"no context {context_id!r}", event_id=event_id, context_id=context_id
        )

    def known(self, context_id: str) -> Context | None:
        """The context `context_id`, live or recently finished."""
        return self.live.get(context_id) or self.recent.get(context_id)

    def finish(self, ctx: Context, reason: str) -> None:
        if ctx.finished:
            return
        ctx.finished = True
        self.live.pop(ctx.context_id, None)
        self.recent[ctx.context_id] = ctx
        while len(self.recent) > RECENT_CONTEXTS:
            self.recent.popitem(last=False)
        self._active.dec()
        self.changed.set()
