"""One WebSocket session of `vivace.speech.v1`: contexts, text in, audio out, errors and closes.

Three kinds of task per session, all ending with it:
- the receive loop parses client events (gateway/protocol.py) and applies them to contexts;
- one pump per context reads its engine request's replies (Audio/Done/Error) and queues frames
  (gateway/synthesis.py);
- the send loop drains the session's `Outbox` (gateway/outbox.py) to the socket, in order, one item at a time.
The outbox is bounded in bytes: a client that does not read fills it, gets `slow_reader`, and its
engine work is cancelled, so memory never grows with a stalled client. Cancelled contexts' queued
audio is dropped by the send loop, so no audio of a context follows its `context.cancelled`.
Client mistakes become `error` events; the ones that end the session also close it with the code
chosen in gateway/protocol.py (`_close` is the one place that happens).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable

from starlette.websockets import WebSocket

from gateway import protocol as p
from gateway.audio import OpusPacketizer, OpusUnavailable, opus_available
from gateway.clock import ClockOffset, PlaybackClock
from gateway.compat.timings import CharTimeline, WordTimeline
from gateway.context import Context
from gateway.outbox import AudioOut, CloseOut, LazyText
from gateway.resample import Resampler
from gateway.session_defaults import SessionDefaults
from gateway.socket_session import SocketSession
from gateway.state import GatewayState
from gateway.synthesis import Synthesis
from gateway.textstream import TextStream

log = logging.getLogger("vivace.session")


class Session(SocketSession):
    """A `vivace.speech.v1` session; run, drain and the send loop are gateway/socket_session.py's."""

    subprotocol = p.PROTOCOL

    def __init__(self, websocket: WebSocket, state: GatewayState) -> None:
        super().__init__(websocket, state)
        self.session_id = "sess_" + secrets.token_hex(8)
        info = state.engine_info()
        self.defaults = SessionDefaults(state, state.voices(), tuple(sorted({*info.languages, "auto"})))
        self.model_id = info.model_id
        self.random_weights = info.random_weights
        self.synthesis = Synthesis(state, self.outbox, self.contexts, self._slow_reader)
        self.clock_offset = ClockOffset()

    # ------------------------------------------------------------ life cycle

    def _greet(self) -> None:
        self._queue_event(self._created_event())

    def _close_drained(self) -> None:
        """Each live context ends with its own `server_draining` error, then the socket closes 1001."""
        for ctx in list(self.contexts.live.values()):
            self.synthesis.fail(ctx, "server_draining", "the server is shutting down", "server_error")
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

    def _slow_reader(self) -> None:
        if self.closing.is_set():
            return
        log.warning("session %s: client is not reading; closing", self.session_id)
        for ctx in list(self.contexts.live.values()):
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
        self.defaults.update(event)
        self._queue_event({"type": "session.updated", **self.defaults.describe()})

    def _create(self, context_id: str, event: p.ContextCreate | None, *, explicit: bool) -> Context:
        event_id = event.event_id if event is not None else None
        self.contexts.check_unused(context_id, event_id, explicit=explicit)
        if self.draining:
            raise p.ProtocolError(
                "server_draining",
                "the server is shutting down; no new contexts",
                error_type="server_error",
                event_id=event_id,
                context_id=context_id,
            )
        self.contexts.check_room(context_id, event_id)
        chosen, language, audio_format = self.defaults.resolve(
            event.voice if event else None,
            event.language if event else None,
            event.audio_format if event else None,
            event_id,
            context_id,
        )
        voice = self.defaults.context_voice(chosen, event_id, context_id)
        sample_rate = self.defaults.resolve_rate(
            event.sample_rate if event else None, audio_format, event_id, context_id
        )
        instructions = (
            event.instructions
            if event is not None and event.instructions is not None
            else self.defaults.instructions
        )
        instruct_ids = self.defaults.check_instructions(instructions, event_id, context_id)
        tokenizer = self.state.tokenizer
        ctx = Context(
            context_id=context_id,
            stream=self.contexts.next_stream,
            voice=voice,
            language=language,
            instructions=instructions,
            audio_format=audio_format,
            instruct_ids=instruct_ids,
            max_lead_ms=self.defaults.max_lead_ms or 0,
            text=TextStream(tokenizer, tokenizer.special_strings),
            created_ns=time.monotonic_ns(),
            sample_rate=sample_rate,
            resampler=Resampler(sample_rate) if sample_rate != p.SAMPLE_RATE else None,
            clock=PlaybackClock(sample_rate=sample_rate),
        )
        word_timings = event.word_timings if event is not None and event.word_timings is not None else None
        if self.defaults.word_timings if word_timings is None else word_timings:
            ctx.words, ctx.char_times = WordTimeline(), CharTimeline()
        self.contexts.next_stream += 1
        if audio_format == "opus":
            try:
                ctx.opus = OpusPacketizer()
            except OpusUnavailable as exc:
                raise p.ProtocolError(
                    "opus_unavailable", str(exc), event_id=event_id, context_id=context_id
                ) from None
        self.contexts.add(ctx)
        self._queue_event(p.context_created(context_id, ctx.stream, ctx.audio_description()))
        return ctx

    def _open(self, ctx: Context, event_id: str | None) -> None:
        if ctx.ended or ctx.cancelled:
            raise p.ProtocolError(
                "context_closed",
                f"context {ctx.context_id!r} takes no more text",
                event_id=event_id,
                context_id=ctx.context_id,
            )

    def _append(self, event: p.InputTextAppend) -> None:
        ctx = self.contexts.live.get(event.context_id) or self._create(event.context_id, None, explicit=False)
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
        if ctx.char_times is not None:
            ctx.char_times.add_text(event.text)
        if piece is not None:
            self.synthesis.send_text(ctx, piece, ended=False)

    def _flush(self, event: p.InputTextFlush) -> None:
        ctx = self.contexts.get_live(event.context_id, event.event_id)
        self._open(ctx, event.event_id)
        self.synthesis.flush(ctx)
        self._queue_event(p.context_flushed(ctx.context_id))

    def _end(self, event: p.InputTextEnd) -> None:
        ctx = self.contexts.get_live(event.context_id, event.event_id)
        self._open(ctx, event.event_id)
        if not self.synthesis.end(ctx):  # nothing was ever said: done at once, nothing to synthesize
            self._queue_event(p.context_done(ctx.context_id, "completed", 0))
            self.contexts.finish(ctx, "completed")

    def _cancel(self, event: p.ContextCancel) -> None:
        ctx = self.contexts.get_live(event.context_id, event.event_id)
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
            self.contexts.finish(ctx, "cancelled")
        else:
            ctx.request.cancel()  # the pump reports context.done when the engine confirms

    def _playback_position(self, event: p.PlaybackPosition) -> None:
        now_ns = time.monotonic_ns()
        ctx = self.contexts.known(event.context_id)
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
        self.synthesis.update_deadline(ctx, now_ns, "report")

    # ------------------------------------------------------------ sending

    def _queue_event(self, event: dict[str, object]) -> None:
        self.outbox.put_control(p.dumps(event))

    def _queue_lazy(self, render: Callable[[], str]) -> None:
        self.outbox.put_control(LazyText(render))

    def _send_error(self, error: p.ProtocolError) -> None:
        self.metrics.errors_total.inc(error.code)
        self.outbox.put_control(p.dumps(p.error_event(error)))

    async def _send_audio(self, item: AudioOut) -> None:
        await self.ws.send_bytes(item.frame)  # native audio frames are binary
        self._audio_sent(item.context, item.samples)

    def _audio_sent(self, ctx: Context, samples: int) -> None:
        now_ns = time.monotonic_ns()
        if ctx.samples_sent == 0 and samples > 0:
            self.metrics.ttfa_seconds.observe((now_ns - (ctx.first_text_ns or ctx.created_ns)) / 1e9, "ws")
        ctx.samples_sent += samples
        self.metrics.audio_seconds_total.inc("ws", amount=samples / ctx.sample_rate)
        ctx.clock.on_audio_sent(samples, now_ns)
        self.synthesis.update_deadline(
            ctx, now_ns, "report" if ctx.clock.report_ns is not None else "server_model"
        )

    # ------------------------------------------------------------ shapes

    def _created_event(self) -> dict[str, object]:
        return {
            "type": "session.created",
            "session_id": self.session_id,
            "protocol": p.PROTOCOL,
            "audio": p.audio_description(
                self.defaults.audio_format,
                samples_per_packet=None,
                pre_skip=None,
                sample_rate=self.defaults.sample_rate,
            ),
            "audio_formats": ["pcm16", "opus"] if opus_available() else ["pcm16"],
            "sample_rates": list(p.SAMPLE_RATES),
            "model": {"id": self.model_id, "random_weights": self.random_weights},
            "voices": self.defaults.voices.names(),
            "voice_kind": self.defaults.voices.voice_kind,
            "languages": list(self.defaults.languages),
            "limits": self.limits.public(),
            "defaults": self.defaults.describe(),
        }
