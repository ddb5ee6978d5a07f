"""One WebSocket session of `vivace.speech.v1`: contexts, text in, audio out, errors and closes.

Three kinds of task per session, all ending with it:
- the receive loop parses client events (gateway/protocol.py) and applies them to contexts;
- one pump per context reads its engine request's replies (Audio/Done/Error) and queues frames;
- the send loop drains the session's `Outbox` to the socket, in order, one item at a time.
The outbox is bounded in bytes: a client that does not read fills it, gets `slow_reader`, and its
engine work is cancelled, so memory never grows with a stalled client. Cancelled contexts' queued
audio is dropped by the send loop, so no audio of a context follows its `context.cancelled`.
Client mistakes become `error` events; the ones that end the session also close it with the code
chosen in gateway/protocol.py (`_close` is the one place that happens).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.websockets import WebSocket, WebSocketDisconnect

from engine.ipc.messages import AppendText as EngineAppendText
from engine.ipc.messages import Audio, Deadline, Done, DoneReason, EndText, Error, Flush, Layout, Submit
from gateway import protocol as p
from gateway.audio import OPUS_PACKET_SAMPLES, OpusPacketizer, OpusUnavailable, opus_available
from gateway.clock import NS_PER_MS, ClockOffset, PlaybackClock
from gateway.engines import EngineRequest, EngineUnavailable
from gateway.limits import TokenBucket
from gateway.metrics import Gauge
from gateway.state import GatewayState
from gateway.textstream import Piece, TextStream
from gateway.voices import UnknownName, default_voice, resolve_language, resolve_voice

log = logging.getLogger("vivace.session")

RECENT_CONTEXTS = 64  # finished contexts remembered so late playback reports are not errors
DEADLINE_EARLIER_NS = 1 * NS_PER_MS  # an earlier deadline is always worth telling the engine
DEADLINE_LATER_NS = 200 * NS_PER_MS  # a later one only once it moved this much (bounds messages per stream)


@dataclass(slots=True)
class AudioOut:
    context: Context
    frame: bytes
    samples: int  # real (non-padding) samples this frame carries


@dataclass(slots=True)
class LazyText:
    """An event rendered when it is sent, so counts in it (samples_sent) are final."""

    render: Callable[[], str]


@dataclass(slots=True)
class CloseOut:
    code: int
    reason: str


OutItem = str | AudioOut | LazyText | CloseOut


class Outbox:
    """FIFO of outgoing items with a byte budget (the slow-reader guard); `gauge` sums all sessions."""

    def __init__(self, max_bytes: int, gauge: Gauge) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._gauge = gauge
        self._items: deque[tuple[OutItem, int]] = deque()
        self._wake = asyncio.Event()

    def put(self, item: OutItem, size: int) -> bool:
        if self.bytes + size > self.max_bytes and self._items:
            return False
        self._items.append((item, size))
        self._account(size)
        self._wake.set()
        return True

    def put_control(self, item: OutItem) -> None:
        """Control items (errors, close) always fit: they are small and bounded in number."""
        self._items.append((item, 0))
        self._wake.set()

    async def get(self) -> OutItem:
        while not self._items:
            self._wake.clear()
            await self._wake.wait()
        item, size = self._items.popleft()
        self._account(-size)
        return item

    def drop_audio(self) -> None:
        self._items = deque((item, size) for item, size in self._items if not isinstance(item, AudioOut))
        self._account(sum(size for _, size in self._items) - self.bytes)

    def _account(self, delta: int) -> None:
        self.bytes += delta
        self._gauge.inc(amount=delta)


@dataclass(eq=False)
class Context:
    context_id: str
    stream: int
    voice: str
    language: str
    instructions: str
    audio_format: str
    text: TextStream
    created_ns: int
    instruct_ids: tuple[int, ...] = ()
    request: EngineRequest | None = None
    pump: asyncio.Task[None] | None = None
    opus: OpusPacketizer | None = None
    clock: PlaybackClock = field(default_factory=PlaybackClock)
    ended: bool = False
    cancelled: bool = False
    finished: bool = False
    first_text_ns: int | None = None
    sequence: int = 0
    samples_queued: int = 0  # PCM samples turned into frames (timeline position of the next frame)
    samples_sent: int = 0  # real samples actually written to the socket
    heard_samples: int | None = None
    last_deadline_ns: int | None = None
    underruns_reported: int = 0


class Session:
    def __init__(self, websocket: WebSocket, state: GatewayState) -> None:
        self.ws = websocket
        self.state = state
        self.limits = state.settings.limits
        self.metrics = state.metrics
        self.session_id = "sess_" + secrets.token_hex(8)
        info = state.engine_info()
        self.speakers = info.speakers
        self.languages = tuple(sorted({*info.languages, "auto"}))
        self.model_id = info.model_id
        self.random_weights = info.random_weights
        self.voice = default_voice(self.speakers)
        self.language = "auto"
        self.instructions = ""
        self.audio_format = "pcm16"
        self.max_lead_ms: int | None = None
        self.contexts: dict[str, Context] = {}
        self.recent: OrderedDict[str, Context] = OrderedDict()
        self.next_stream = 1
        self.outbox = Outbox(self.limits.max_outbound_bytes, state.metrics.outbound_bytes)
        self.clock_offset = ClockOffset()
        self.appends = TokenBucket(self.limits.appends_per_second, self.limits.append_burst, time.monotonic())
        self.closing = asyncio.Event()
        self.draining = False
        self.contexts_changed = asyncio.Event()

    # ------------------------------------------------------------ life cycle

    async def run(self) -> None:
        await self.ws.accept(subprotocol=p.PROTOCOL)
        self.state.sessions.add(self)
        self.metrics.sessions_active.inc()
        self._queue_event(self._created_event())
        sender = asyncio.create_task(self._send_loop())
        receiver = asyncio.create_task(self._receive_loop())
        closing = asyncio.create_task(self.closing.wait())
        try:
            await asyncio.wait({sender, receiver, closing}, return_when=asyncio.FIRST_COMPLETED)
            if self.closing.is_set() and not sender.done():
                await asyncio.wait({sender}, timeout=self.limits.slow_reader_grace_s)
        finally:
            for task in (sender, receiver, closing):
                task.cancel()
            self._abandon_contexts()
            await asyncio.gather(sender, receiver, closing, return_exceptions=True)
            self.state.sessions.discard(self)
            self.metrics.sessions_active.dec()

    def _abandon_contexts(self) -> None:
        """Disconnect or close: cancel every engine request at once and free everything."""
        for ctx in list(self.contexts.values()):
            if ctx.request is not None:
                ctx.request.cancel()
                ctx.request.release()
            if ctx.pump is not None:
                ctx.pump.cancel()
            self._finish(ctx, "abandoned")
        self.outbox.drop_audio()

    async def drain(self, deadline: float) -> None:
        """SIGTERM: no new contexts; live ones may finish until `deadline` (monotonic s); then close 1001."""
        self.draining = True
        while self.contexts and time.monotonic() < deadline and not self.closing.is_set():
            self.contexts_changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.contexts_changed.wait(), deadline - time.monotonic())
        for ctx in list(self.contexts.values()):
            self._fail_context(ctx, "server_draining", "the server is shutting down", "server_error")
        self._close(
            p.ProtocolError(
                "server_draining",
                "the server is shutting down",
                error_type="server_error",
                close_code=p.CLOSE_GOING_AWAY,
            )
        )

    def _close(self, error: p.ProtocolError) -> None:
        """Send `error` and close the socket with its close code; the session then ends."""
        if self.closing.is_set():
            return
        assert error.close_code is not None
        self.metrics.errors_total.inc(error.code)
        self.outbox.put_control(p.dumps(p.error_event(error)))
        self.outbox.put_control(CloseOut(error.close_code, error.code))
        self.closing.set()

    # ------------------------------------------------------------ receiving

    async def _receive_loop(self) -> None:
        while not self.closing.is_set():
            try:
                message = await asyncio.wait_for(self.ws.receive(), self.limits.idle_timeout_s)
            except TimeoutError:
                if not self._producing():
                    self._close(
                        p.ProtocolError(
                            "idle_timeout",
                            f"no event for {self.limits.idle_timeout_s:g} s",
                            close_code=p.CLOSE_POLICY,
                        )
                    )
                continue
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                self._close(
                    p.ProtocolError(
                        "binary_not_allowed",
                        "clients send JSON text frames only",
                        close_code=p.CLOSE_UNSUPPORTED_DATA,
                    )
                )
                continue
            text = message.get("text") or ""
            if (
                len(text) > self.limits.max_message_bytes // 4
                and len(text.encode()) > self.limits.max_message_bytes
            ):
                self._close(
                    p.ProtocolError(
                        "message_too_large",
                        f"messages are limited to {self.limits.max_message_bytes} bytes",
                        close_code=p.CLOSE_TOO_BIG,
                    )
                )
                continue
            try:
                self._handle(p.parse_client_event(text))
            except p.ProtocolError as error:
                self._send_error(error)

    def _producing(self) -> bool:
        """Whether some context is still producing or sending audio (then the session is not idle)."""
        return any(ctx.ended and not ctx.finished for ctx in self.contexts.values()) or self.outbox.bytes > 0

    def _handle(self, event: p.ClientEvent) -> None:
        if isinstance(event, p.InputTextAppend):
            self._append(event)
        elif isinstance(event, p.PlaybackPosition):
            self._playback_position(event)
        elif isinstance(event, p.InputTextFlush):
            self._flush(event)
        elif isinstance(event, p.InputTextEnd):
            self._end(event)
        elif isinstance(event, p.ContextCancel):
            self._cancel(event)
        elif isinstance(event, p.ContextCreate):
            self._create(event.context_id, event, explicit=True)
        elif isinstance(event, p.SessionUpdate):
            self._session_update(event)
        elif isinstance(event, p.Ping):
            now_ns = time.monotonic_ns()
            if event.client_time_ms is not None:
                self.clock_offset.observe(event.client_time_ms, now_ns)
            self._queue_event(p.pong(event.id, event.client_time_ms, time.time() * 1000.0))

    def _session_update(self, event: p.SessionUpdate) -> None:
        voice, language, audio_format = self._resolve(
            event.voice, event.language, event.audio_format, event.event_id
        )
        self.voice, self.language, self.audio_format = voice, language, audio_format
        if event.instructions is not None:
            self._check_instructions(event.instructions, event.event_id, None)
            self.instructions = event.instructions
        if event.max_lead_ms is not None:
            self.max_lead_ms = event.max_lead_ms
        self._queue_event({"type": "session.updated", **self._defaults()})

    def _resolve(
        self,
        voice: str | None,
        language: str | None,
        audio_format: str | None,
        event_id: str | None,
        context_id: str | None = None,
    ) -> tuple[str, str, str]:
        try:
            voice = self.voice if voice is None else resolve_voice(voice, self.speakers)
            language = self.language if language is None else resolve_language(language, self.languages)
        except UnknownName as exc:
            raise p.ProtocolError(exc.code, str(exc), event_id=event_id, context_id=context_id) from None
        audio_format = audio_format or self.audio_format
        if audio_format == "opus" and not opus_available():
            raise p.ProtocolError(
                "opus_unavailable",
                "Opus is not available on this server (libopus missing); use pcm16",
                event_id=event_id,
                context_id=context_id,
            )
        return voice, language, audio_format

    def _check_instructions(
        self, instructions: str, event_id: str | None, context_id: str | None
    ) -> tuple[int, ...]:
        try:
            return tuple(self.state.tokenizer.instruct_ids(instructions))
        except ValueError as exc:
            raise p.ProtocolError(
                "invalid_text", str(exc), event_id=event_id, context_id=context_id
            ) from None

    def _create(self, context_id: str, event: p.ContextCreate | None, *, explicit: bool) -> Context:
        event_id = event.event_id if event is not None else None
        if context_id in self.contexts or (explicit and context_id in self.recent):
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
        if self.draining:
            raise p.ProtocolError(
                "server_draining",
                "the server is shutting down; no new contexts",
                error_type="server_error",
                event_id=event_id,
                context_id=context_id,
            )
        if len(self.contexts) >= self.limits.max_contexts:
            raise p.ProtocolError(
                "too_many_contexts",
                f"at most {self.limits.max_contexts} live contexts per socket",
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
        voice, language, audio_format = self._resolve(
            event.voice if event else None,
            event.language if event else None,
            event.audio_format if event else None,
            event_id,
            context_id,
        )
        instructions = (
            event.instructions if event is not None and event.instructions is not None else self.instructions
        )
        instruct_ids = self._check_instructions(instructions, event_id, context_id) if instructions else ()
        tokenizer = self.state.tokenizer
        ctx = Context(
            context_id=context_id,
            stream=self.next_stream,
            voice=voice,
            language=language,
            instructions=instructions,
            audio_format=audio_format,
            instruct_ids=instruct_ids,
            text=TextStream(tokenizer, tokenizer.special_strings),
            created_ns=time.monotonic_ns(),
        )
        self.next_stream += 1
        pre_skip = None
        if audio_format == "opus":
            try:
                ctx.opus = OpusPacketizer()
            except OpusUnavailable as exc:
                raise p.ProtocolError(
                    "opus_unavailable", str(exc), event_id=event_id, context_id=context_id
                ) from None
            pre_skip = ctx.opus.pre_skip
        self.contexts[context_id] = ctx
        self.metrics.contexts_active.inc()
        audio = p.audio_description(
            audio_format, samples_per_packet=OPUS_PACKET_SAMPLES if ctx.opus else None, pre_skip=pre_skip
        )
        self._queue_event(p.context_created(context_id, ctx.stream, audio))
        return ctx

    def _live(self, context_id: str, event_id: str | None) -> Context:
        ctx = self.contexts.get(context_id)
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

    def _open(self, ctx: Context, event_id: str | None) -> None:
        if ctx.ended or ctx.cancelled:
            raise p.ProtocolError(
                "context_closed",
                f"context {ctx.context_id!r} takes no more text",
                event_id=event_id,
                context_id=ctx.context_id,
            )

    def _append(self, event: p.InputTextAppend) -> None:
        ctx = self.contexts.get(event.context_id) or self._create(event.context_id, None, explicit=False)
        self._open(ctx, event.event_id)
        if not self.appends.take(time.monotonic()):
            raise p.ProtocolError(
                "rate_limited",
                f"more than {self.limits.appends_per_second:g} appends per second",
                error_type="rate_limit_error",
                event_id=event.event_id,
                context_id=ctx.context_id,
            )
        if ctx.text.chars_received + len(event.text) > self.limits.max_text_chars:
            raise p.ProtocolError(
                "text_too_long",
                f"a context takes at most {self.limits.max_text_chars} characters",
                event_id=event.event_id,
                context_id=ctx.context_id,
            )
        try:
            piece = ctx.text.append(event.text)
        except ValueError as exc:
            raise p.ProtocolError(
                "invalid_text", str(exc), event_id=event.event_id, context_id=ctx.context_id
            ) from None
        if ctx.first_text_ns is None and event.text:
            ctx.first_text_ns = time.monotonic_ns()
        if piece is not None:
            self._send_text(ctx, piece, ended=False)

    def _flush(self, event: p.InputTextFlush) -> None:
        ctx = self._live(event.context_id, event.event_id)
        self._open(ctx, event.event_id)
        piece = ctx.text.flush()
        if piece is not None:
            self._send_text(ctx, piece, ended=False)
        if ctx.request is not None and not ctx.finished:
            self._engine_send(ctx, Flush(ctx.request.request_id))
        self._queue_event(p.context_flushed(ctx.context_id))

    def _end(self, event: p.InputTextEnd) -> None:
        ctx = self._live(event.context_id, event.event_id)
        self._open(ctx, event.event_id)
        ctx.ended = True
        piece = ctx.text.flush()
        if ctx.request is None:
            if piece is None:  # nothing was ever said: done at once, nothing to synthesize
                self._queue_event(p.context_done(ctx.context_id, "completed", 0))
                self._finish(ctx, "completed")
                return
            self._send_text(ctx, piece, ended=True)
            return
        if piece is not None:
            self._send_text(ctx, piece, ended=False)
        if not ctx.finished:
            self._engine_send(ctx, EndText(ctx.request.request_id))

    def _cancel(self, event: p.ContextCancel) -> None:
        ctx = self._live(event.context_id, event.event_id)
        if ctx.cancelled:
            raise p.ProtocolError(
                "context_closed",
                f"context {ctx.context_id!r} is already cancelled",
                event_id=event.event_id,
                context_id=ctx.context_id,
            )
        ctx.cancelled = True
        if event.heard_samples is not None:
            ctx.heard_samples = event.heard_samples
        self.metrics.requests_total.inc("ws", "cancelled")
        self._queue_lazy(
            lambda: p.dumps(p.context_cancelled(ctx.context_id, ctx.samples_sent, ctx.heard_samples))
        )
        if ctx.request is None or ctx.request.finished:
            self._queue_lazy(lambda: p.dumps(p.context_done(ctx.context_id, "cancelled", ctx.samples_sent)))
            self._finish(ctx, "cancelled")
        else:
            ctx.request.cancel()  # the pump reports context.done when the engine confirms

    def _playback_position(self, event: p.PlaybackPosition) -> None:
        now_ns = time.monotonic_ns()
        ctx = self.contexts.get(event.context_id) or self.recent.get(event.context_id)
        if ctx is None:
            raise p.ProtocolError(
                "unknown_context",
                f"no context {event.context_id!r}",
                event_id=event.event_id,
                context_id=event.context_id,
            )
        self.metrics.playback_reports_total.inc()
        if event.client_time_ms is not None:
            self.clock_offset.observe(event.client_time_ms, now_ns)
        if event.underruns is not None and event.underruns > ctx.underruns_reported:
            self.metrics.client_underruns_total.inc(amount=event.underruns - ctx.underruns_reported)
            ctx.underruns_reported = event.underruns
        report_ns = self.clock_offset.to_server_ns(event.client_time_ms, now_ns)
        ctx.clock.on_report(event.played_samples, report_ns, event.buffered_samples)
        ctx.heard_samples = event.played_samples
        self._update_deadline(ctx, now_ns, "report")

    # ------------------------------------------------------------ engine side

    def _send_text(self, ctx: Context, piece: Piece, *, ended: bool) -> None:
        if ctx.request is not None:
            self._engine_send(ctx, EngineAppendText(ctx.request.request_id, piece.ids, piece.chars))
            return
        submit = Submit(
            request_id=0,
            speaker=ctx.voice,
            language=ctx.language,
            text_ids=piece.ids,
            text_chars=piece.chars,
            text_ended=ended,
            instruct_ids=ctx.instruct_ids,
            layout=Layout.STREAMING,
            seed=secrets.randbits(31),
            arrival_ns=ctx.first_text_ns or ctx.created_ns,
        )
        try:
            ctx.request = self.state.pool.submit(submit)
        except EngineUnavailable as exc:
            self._fail_context(ctx, exc.code, str(exc), "server_error")
            return
        ctx.pump = asyncio.create_task(self._pump(ctx, ctx.request))

    def _engine_send(self, ctx: Context, msg: EngineAppendText | Flush | EndText | Deadline) -> None:
        assert ctx.request is not None
        try:
            ctx.request.send(msg)
        except EngineUnavailable as exc:
            ctx.request.cancel()
            self._fail_context(ctx, exc.code, str(exc), "server_error")

    def _update_deadline(self, ctx: Context, now_ns: int, source: str) -> None:
        if ctx.request is None or ctx.finished or ctx.cancelled:
            return
        deadline = ctx.clock.deadline_ns(now_ns)
        if deadline is None:
            return
        last = ctx.last_deadline_ns
        if last is not None and last - DEADLINE_EARLIER_NS < deadline < last + DEADLINE_LATER_NS:
            return
        ctx.last_deadline_ns = deadline
        self.metrics.deadlines_total.inc(source)
        self.metrics.deadline_lead_seconds.observe((deadline - now_ns) / 1e9, source)
        self._engine_send(ctx, Deadline(ctx.request.request_id, deadline))

    async def _pump(self, ctx: Context, request: EngineRequest) -> None:
        try:
            while True:
                msg = await request.events.get()
                if isinstance(msg, Audio):
                    self._on_audio(ctx, msg.pcm)
                elif isinstance(msg, Done):
                    self._on_done(ctx, msg)
                    return
                elif isinstance(msg, Error):
                    self._fail_context(ctx, msg.code, msg.message, "server_error")
                    return
        finally:
            request.release()

    def _on_audio(self, ctx: Context, pcm: bytes) -> None:
        if ctx.cancelled or ctx.finished:
            return
        samples = len(pcm) // 2
        if ctx.opus is None:
            self._queue_frame(ctx, pcm, samples, last=False)
            return
        for packet in ctx.opus.encode(pcm):
            self._queue_frame(ctx, packet, OPUS_PACKET_SAMPLES, last=False, advance=OPUS_PACKET_SAMPLES)

    def _on_done(self, ctx: Context, done: Done) -> None:
        if ctx.finished:
            return
        if ctx.cancelled or done.reason == DoneReason.CANCELLED:
            self._queue_lazy(lambda: p.dumps(p.context_done(ctx.context_id, "cancelled", ctx.samples_sent)))
            self._finish(ctx, "cancelled")
            return
        if done.reason == DoneReason.ERROR:
            self._fail_context(
                ctx, "engine_error", "the engine could not finish this context", "server_error"
            )
            return
        if ctx.opus is None:
            self._queue_frame(ctx, b"", 0, last=True)
        else:
            packets = ctx.opus.finish()
            real_left = ctx.opus.samples_in - ctx.samples_queued
            for i, packet in enumerate(packets):
                real = max(0, min(OPUS_PACKET_SAMPLES, real_left))
                real_left -= real
                self._queue_frame(ctx, packet, real, last=i == len(packets) - 1, advance=OPUS_PACKET_SAMPLES)
        self._queue_lazy(lambda: p.dumps(p.context_done(ctx.context_id, "completed", ctx.samples_sent)))
        self.metrics.requests_total.inc("ws", "completed")
        self._finish(ctx, "completed")

    def _fail_context(self, ctx: Context, code: str, message: str, error_type: str) -> None:
        if ctx.finished:
            return
        if ctx.request is not None:
            ctx.request.cancel()
        self._send_error(p.ProtocolError(code, message, error_type=error_type, context_id=ctx.context_id))
        self._queue_lazy(lambda: p.dumps(p.context_done(ctx.context_id, "error", ctx.samples_sent)))
        self.metrics.requests_total.inc("ws", "error")
        self._finish(ctx, "error")

    def _finish(self, ctx: Context, reason: str) -> None:
        if ctx.finished:
            return
        ctx.finished = True
        self.contexts.pop(ctx.context_id, None)
        self.recent[ctx.context_id] = ctx
        while len(self.recent) > RECENT_CONTEXTS:
            self.recent.popitem(last=False)
        self.metrics.contexts_active.dec()
        self.contexts_changed.set()

    # ------------------------------------------------------------ sending

    def _queue_frame(
        self, ctx: Context, payload: bytes, samples: int, *, last: bool, advance: int | None = None
    ) -> None:
        flags = (p.FLAG_FIRST if ctx.sequence == 0 else 0) | (p.FLAG_LAST if last else 0)
        frame = p.audio_frame(flags, ctx.stream, ctx.sequence, ctx.samples_queued, payload)
        ctx.sequence += 1
        ctx.samples_queued += samples if advance is None else advance
        if not self.outbox.put(AudioOut(ctx, frame, samples), len(frame)):
            self._slow_reader()

    def _slow_reader(self) -> None:
        if self.closing.is_set():
            return
        log.warning("session %s: client is not reading; closing", self.session_id)
        for ctx in list(self.contexts.values()):
            if ctx.request is not None:
                ctx.request.cancel()
            ctx.cancelled = True
        self.outbox.drop_audio()
        self._close(
            p.ProtocolError(
                "slow_reader",
                f"the client did not read its audio (over {self.limits.max_outbound_bytes} bytes queued)",
                close_code=p.CLOSE_POLICY,
            )
        )

    def _queue_event(self, event: dict[str, object]) -> None:
        self.outbox.put_control(p.dumps(event))

    def _queue_lazy(self, render: Callable[[], str]) -> None:
        self.outbox.put_control(LazyText(render))

    def _send_error(self, error: p.ProtocolError) -> None:
        self.metrics.errors_total.inc(error.code)
        self.outbox.put_control(p.dumps(p.error_event(error)))

    async def _send_loop(self) -> None:
        try:
            while True:
                item = await self.outbox.get()
                if isinstance(item, AudioOut):
                    if item.context.cancelled:
                        continue  # barge-in: queued audio of a cancelled context is dropped
                    await self.ws.send_bytes(item.frame)
                    self._audio_sent(item.context, item.samples)
                elif isinstance(item, str):
                    await self.ws.send_text(item)
                elif isinstance(item, LazyText):
                    await self.ws.send_text(item.render())
                else:
                    await self.ws.close(item.code, item.reason)
                    return
        except (WebSocketDisconnect, RuntimeError, OSError):
            return  # the client went away; run() cleans up

    def _audio_sent(self, ctx: Context, samples: int) -> None:
        now_ns = time.monotonic_ns()
        if ctx.samples_sent == 0 and samples > 0:
            self.metrics.ttfa_seconds.observe((now_ns - (ctx.first_text_ns or ctx.created_ns)) / 1e9, "ws")
        ctx.samples_sent += samples
        self.metrics.audio_seconds_total.inc("ws", amount=samples / p.SAMPLE_RATE)
        ctx.clock.on_audio_sent(samples, now_ns)
        self._update_deadline(ctx, now_ns, "report" if ctx.clock.report_ns is not None else "server_model")

    # ------------------------------------------------------------ shapes

    def _defaults(self) -> dict[str, object]:
        return {
            "voice": self.voice,
            "language": self.language,
            "instructions": self.instructions,
            "audio": p.audio_description(self.audio_format, samples_per_packet=None, pre_skip=None),
            "max_lead_ms": self.max_lead_ms,
        }

    def _created_event(self) -> dict[str, object]:
        return {
            "type": "session.created",
            "session_id": self.session_id,
            "protocol": p.PROTOCOL,
            "audio": p.audio_description(self.audio_format, samples_per_packet=None, pre_skip=None),
            "audio_formats": ["pcm16", "opus"] if opus_available() else ["pcm16"],
            "model": {"id": self.model_id, "random_weights": self.random_weights},
            "voices": list(self.speakers),
            "languages": list(self.languages),
            "limits": self.limits.public(),
            "defaults": self._defaults(),
        }
