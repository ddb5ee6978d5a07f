"""What the ElevenLabs and Cartesia WebSockets share: the door, contexts on the engine path, the send loop.

A compatible socket is a `CompatSocket` subclass that parses its vendor's messages and renders
its vendor's replies; everything else is here and is the native protocol's machinery reused:
contexts are gateway/context.py `Context` records (plus an encoder and a character timeline) in a
`ContextTable`, text goes through `TextStream` and gateway/synthesis.py `Synthesis` to the
engine pool, replies are queued on a byte-bounded `Outbox` (a client that does not read gets closed
as a slow reader), audio sent moves the server-side playback model that sets engine deadlines, and
drain, limits, metrics, API key and Origin checks are the same as for `vivace.speech.v1`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

from engine.ipc.messages import Done
from gateway import protocol as p
from gateway.compat.timings import CharTimeline, CharTiming
from gateway.context import Context
from gateway.encoders import FormatUnavailable, OutputFormat, StreamEncoder, make_encoder
from gateway.engines import EngineUnavailable
from gateway.http_common import HttpError, key_matches
from gateway.outbox import AudioOut, CloseOut
from gateway.resample import ENGINE_RATE
from gateway.socket_session import SocketSession
from gateway.state import GatewayState
from gateway.synthesis import Synthesis
from gateway.textstream import TextStream
from gateway.voices import Voice

log = logging.getLogger("vivace.compat")


class CompatError(Exception):
    """A client mistake or a failure, for one context (`context_id`) or the socket (`close_code`)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        context_id: str | None = None,
        close_code: int | None = None,
        status: int = 400,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.context_id = context_id
        self.close_code = close_code
        self.status = status


@dataclass(eq=False)
class CompatContext(Context):
    """A native context record plus what a compatible protocol adds: its encoder and timings."""

    encoder: StreamEncoder | None = None
    header: bytes = b""  # the encoder's header bytes, sent with the first audio
    output_rate: int = ENGINE_RATE  # the rate `encoder.samples_out` counts in
    timeline: CharTimeline = field(default_factory=CharTimeline)
    spoke: bool = False  # whether any non-space text was received (leading spaces are not spoken)


async def admit(websocket: WebSocket, state: GatewayState) -> bool:
    """The door every compatible socket passes: Origin, API key, drain. Refusals are HTTP answers."""
    from gateway.app import origin_allowed  # here, not at import: gateway.app imports this package

    settings = state.settings
    refusal: HttpError | None = None
    if not origin_allowed(
        websocket.headers.get("origin"), websocket.headers.get("host"), settings.allowed_origins
    ):
        refusal = HttpError(403, "origin_not_allowed", "this Origin may not open sockets here")
    elif not key_matches(websocket.headers, settings.api_key):
        refusal = HttpError(
            401,
            "invalid_api_key",
            "missing or wrong API key (xi-api-key, X-API-Key or Authorization: Bearer)",
            error_type="authentication_error",
        )
    elif state.draining:
        refusal = HttpError(503, "server_draining", "the server is shutting down")
    if refusal is None:
        return True
    await refuse(websocket, state, refusal)
    return False


async def refuse(websocket: WebSocket, state: GatewayState, error: HttpError) -> None:
    """Answer the handshake with an HTTP error (clients show the status and the JSON body)."""
    state.metrics.errors_total.inc(error.code)
    await websocket.send_denial_response(JSONResponse(error.body(), status_code=error.status))


class CompatSynthesis(Synthesis):
    """The native engine driver with the replies rendered by a compatible socket."""

    def __init__(self, socket: CompatSocket) -> None:
        super().__init__(socket.state, socket.outbox, socket.contexts, socket.slow_reader)
        self.socket = socket

    def _on_audio(self, ctx: Context, pcm: bytes) -> None:
        try:
            self._audio(ctx, pcm)
        except Exception:
            log.exception("%s socket: failed to encode audio", self.socket.endpoint)
            self.fail(
                ctx, "internal_error", "the server failed to encode this context's audio", "server_error"
            )

    def _audio(self, ctx: Context, pcm: bytes) -> None:
        assert isinstance(ctx, CompatContext) and ctx.encoder is not None
        if ctx.cancelled or ctx.finished:
            return
        samples = len(pcm) // 2
        start_s = ctx.timeline.audio_s
        before = ctx.encoder.samples_out
        data = ctx.header + ctx.encoder.audio(pcm)
        ctx.header = b""
        # Timings follow the audio as sent (a resampler delays its output a little).
        chars = ctx.timeline.audio((ctx.encoder.samples_out - before) / ctx.output_rate)
        messages = self.socket.audio_messages(ctx, data, chars, start_s) if data or chars else []
        for index, message in enumerate(messages or [""]):  # "" only carries the sample count
            if not self.outbox.put(
                AudioOut(ctx, message.encode(), samples if index == 0 else 0), len(message)
            ):
                self._on_overflow()
                return

    def _on_done(self, ctx: Context, done: Done) -> None:
        try:
            super()._on_done(ctx, done)
        except Exception:
            log.exception("%s socket: failed to complete a context", self.socket.endpoint)
            self.fail(ctx, "internal_error", "the server failed to complete this context", "server_error")

    def _complete(self, ctx: Context) -> None:
        assert isinstance(ctx, CompatContext)
        self.socket.complete(ctx)

    def _finish_cancelled(self, ctx: Context) -> None:
        """A cancelled context ends without a native `context.done` (the compatible protocol has its own)."""
        if ctx.finished:
            return
        self.contexts.finish(ctx, "cancelled")
        self.socket.context_finished(ctx)

    def fail(self, ctx: Context, code: str, message: str, error_type: str) -> None:
        if ctx.finished:
            return
        if ctx.request is not None:
            ctx.request.cancel()
        self.socket.send_error(CompatError(code, message, context_id=ctx.context_id, status=500))
        self.metrics.requests_total.inc(self.socket.endpoint, "error")
        self.contexts.finish(ctx, "error")
        self.socket.context_finished(ctx)


class CompatSocket(SocketSession):
    """One compatible WebSocket: subclasses implement `handle`, the renderers and the finish hook.

    Its life cycle (run, drain, the send loop) is gateway/socket_session.py's, as for a native session."""

    endpoint = "compat_ws"  # the metrics label

    def __init__(
        self, websocket: WebSocket, state: GatewayState, idle_timeout_s: float | None = None
    ) -> None:
        super().__init__(websocket, state)
        info = state.engine_info()  # raises EngineUnavailable before the socket is accepted
        self.voices = state.voices()  # the served model's voices (gateway/voices.py)
        self.languages = tuple(sorted({*info.languages, "auto"}))
        self.idle_timeout_s = idle_timeout_s or self.limits.idle_timeout_s
        self.synthesis = CompatSynthesis(self)

    # ------------------------------------------------------------ what a protocol supplies

    def handle(self, text: str) -> None:
        raise NotImplementedError

    def audio_messages(
        self, ctx: CompatContext, data: bytes, chars: list[CharTiming], start_s: float
    ) -> list[str]:
        """The replies for one chunk of audio: `data` in the context's format, `chars` timed in context seconds, the
        message's audio starting at `start_s` in the context."""
        raise NotImplementedError

    def final_messages(
        self, ctx: CompatContext, data: bytes, chars: list[CharTiming], start_s: float
    ) -> list[str]:
        """The replies that complete a context: the encoder's tail, the last timings, the end marker."""
        raise NotImplementedError

    def error_message(self, error: CompatError) -> str:
        raise NotImplementedError

    def context_finished(self, ctx: CompatContext) -> None:
        """Called once a context has finished for any reason (a protocol may close the socket then)."""

    # ------------------------------------------------------------ life cycle

    def _close_drained(self) -> None:
        """Close 1001 with `server_draining`: each live context ends with it first (see `close`)."""
        self.close(
            CompatError(
                "server_draining", "the server is shutting down", close_code=p.CLOSE_GOING_AWAY, status=503
            )
        )

    # Whether each context gets its own error when the socket closes on one (a protocol whose errors
    # name no context, ElevenLabs' single stream, says it once for the socket).
    errors_name_contexts = True

    def close(self, error: CompatError | None = None, code: int = p.CLOSE_NORMAL) -> None:
        """Close the socket after what is queued: with an error message first when `error` is given.

        On an error every live context ends first with its own error, so no context's last message
        is a chunk of audio (a client waiting for its `done` would never know it was lost)."""
        if self.closing.is_set():
            return
        self.closing.set()  # first: a context ended below must not close the socket a second time
        if error is not None:
            self._end_contexts_with(error)
            self.metrics.errors_total.inc(error.code)
            self.outbox.put_control(self.error_message(error))
            code = error.close_code or p.CLOSE_POLICY
        self.outbox.put_control(CloseOut(code, error.code if error is not None else "done"))

    def _end_contexts_with(self, error: CompatError) -> None:
        """Stop every live context; each gets its own copy of `error` where the protocol names contexts."""
        for ctx in list(self.contexts.live.values()):
            if ctx.request is not None:
                ctx.request.cancel()
            if ctx.cancelled:  # the client stopped it: it may end silently, as when the socket stays open
                continue
            if self.errors_name_contexts and ctx.context_id != error.context_id:
                self.send_error(
                    CompatError(error.code, error.message, context_id=ctx.context_id, status=error.status)
                )
            self.metrics.requests_total.inc(self.endpoint, "error")
            self.contexts.finish(ctx, "error")
            self.context_finished(ctx)

    def slow_reader(self) -> None:
        if self.closing.is_set():
            return
        log.warning("%s socket: client is not reading; closing", self.endpoint)
        self.outbox.drop_audio()  # each live context then ends with the slow_reader error (close)
        self.close(
            CompatError(
                "slow_reader",
                f"the client did not read its audio (over {self.limits.max_outbound_bytes} bytes queued)",
                close_code=p.CLOSE_POLICY,
            )
        )

    def send_error(self, error: CompatError) -> None:
        self.metrics.errors_total.inc(error.code)
        self.outbox.put_control(self.error_message(error))

    # ------------------------------------------------------------ receiving

    async def _receive_loop(self) -> None:
        while not self.closing.is_set():
            try:
                message = await asyncio.wait_for(self.ws.receive(), self.idle_timeout_s)
            except TimeoutError:
                if not self._producing():
                    self.close(
                        CompatError(
                            "idle_timeout",
                            f"no message for {self.idle_timeout_s:g} s",
                            close_code=p.CLOSE_POLICY,
                        )
                    )
                continue
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                self.close(
                    CompatError(
                        "binary_not_allowed",
                        "send JSON text messages only",
                        close_code=p.CLOSE_UNSUPPORTED_DATA,
                    )
                )
                continue
            text = message.get("text") or ""
            if len(text.encode()) > self.limits.max_message_bytes:
                self.close(
                    CompatError(
                        "message_too_large",
                        f"messages are limited to {self.limits.max_message_bytes} bytes",
                        close_code=p.CLOSE_TOO_BIG,
                    )
                )
                continue
            try:
                self.handle(text)
            except CompatError as error:
                if error.close_code is not None:
                    self.close(error)
                else:
                    self.send_error(error)
            except Exception:
                log.exception("%s socket: failed to handle a message", self.endpoint)
                self.close(CompatError("internal_error", "the server failed", close_code=1011, status=500))

    # ------------------------------------------------------------ contexts

    def open_context(
        self, context_id: str, *, voice: Voice, language: str, output: OutputFormat, instructions: str = "",
        seed: int | None = None,
    ) -> CompatContext:
        if self.draining:
            raise CompatError(
                "server_draining",
                "the server is shutting down; no new contexts",
                context_id=context_id,
                status=503,
            )
        self.contexts.recent.pop(context_id, None)  # a finished id may be used again, as a new context
        try:
            self.contexts.check_room(context_id, None)
        except p.ProtocolError as exc:
            raise CompatError(exc.code, exc.message, context_id=context_id, status=429) from None
        try:
            encoder = make_encoder(output)
        except FormatUnavailable as exc:
            raise CompatError("format_unavailable", str(exc), context_id=context_id) from None
        tokenizer = self.state.tokenizer
        ctx = CompatContext(
            context_id=context_id,
            stream=self.contexts.next_stream,
            voice=voice,
            language=language,
            instructions=instructions,
            audio_format=output.codec,
            text=TextStream(tokenizer, tokenizer.special_strings),
            created_ns=time.monotonic_ns(),
            max_lead_ms=self.state.settings.max_lead_ms,
            encoder=encoder,
            output_rate=output.sample_rate,
            seed=seed,
        )
        self.contexts.next_stream += 1
        self.contexts.add(ctx)
        ctx.header = encoder.start()
        return ctx

    def append(self, ctx: CompatContext, text: str) -> None:
        if ctx.ended or ctx.cancelled:
            raise CompatError(
                "context_closed", f"context {ctx.context_id!r} takes no more text", context_id=ctx.context_id
            )
        if not self.appends.take(time.monotonic()):
            raise CompatError(
                "rate_limited",
                f"more than {self.limits.appends_per_second:g} text messages per second",
                context_id=ctx.context_id,
                status=429,
            )
        if not ctx.spoke:
            text = text.lstrip()  # a context's leading spaces (ElevenLabs opens with " ") are not spoken
            ctx.spoke = bool(text)
        if not text:
            return
        if ctx.text.chars_received + len(text) > self.limits.max_text_chars:
            raise CompatError(
                "text_too_long",
                f"a context takes at most {self.limits.max_text_chars} characters",
                context_id=ctx.context_id,
            )
        try:
            piece = ctx.text.append(text)
        except ValueError as exc:
            raise CompatError("invalid_text", str(exc), context_id=ctx.context_id) from None
        ctx.timeline.add_text(text)
        if ctx.first_text_ns is None:
            ctx.first_text_ns = time.monotonic_ns()
        if piece is not None:
            self.synthesis.send_text(ctx, piece, ended=False)

    def flush(self, ctx: CompatContext) -> None:
        if ctx.ended or ctx.cancelled:
            return
        self.synthesis.flush(ctx)

    def end(self, ctx: CompatContext) -> None:
        """No more text: finish what was received, then the protocol's final message."""
        if ctx.ended or ctx.cancelled:
            return
        if not self.synthesis.end(ctx):  # nothing was ever said: done at once
            self.complete(ctx)

    def cancel(self, ctx: CompatContext) -> None:
        """Stop a context now; its queued audio is dropped and nothing more is sent for it."""
        if ctx.cancelled or ctx.finished:
            return
        ctx.cancelled = True
        self.metrics.requests_total.inc(self.endpoint, "cancelled")
        if ctx.request is None or ctx.request.finished:
            self.contexts.finish(ctx, "cancelled")
            self.context_finished(ctx)
        else:
            ctx.request.cancel()  # the pump finishes the context when the engine confirms

    def complete(self, ctx: CompatContext) -> None:
        """The engine finished the context: the encoder's tail, the last timings, the final message(s)."""
        assert ctx.encoder is not None
        start_s = ctx.timeline.audio_s
        before = ctx.encoder.samples_out
        tail = ctx.header + ctx.encoder.finish()
        ctx.header = b""
        chars = ctx.timeline.audio((ctx.encoder.samples_out - before) / ctx.output_rate)
        for message in self.final_messages(ctx, tail, chars + ctx.timeline.finish(), start_s):
            self._queue_audio(ctx, message, 0)
        self.metrics.requests_total.inc(self.endpoint, "completed")
        self.contexts.finish(ctx, "completed")
        self.context_finished(ctx)

    def _queue_audio(self, ctx: CompatContext, message: str, samples: int) -> None:
        if not self.outbox.put(AudioOut(ctx, message.encode(), samples), len(message)):
            self.slow_reader()

    # ------------------------------------------------------------ sending

    async def _send_audio(self, item: AudioOut) -> None:
        if item.frame:  # a compatible protocol's audio is a JSON text message; "" only carries samples
            await self.ws.send_text(item.frame.decode())
        self._audio_sent(item.context, item.samples)

    def _audio_sent(self, ctx: Context, samples: int) -> None:
        if samples <= 0:
            return
        now_ns = time.monotonic_ns()
        if ctx.samples_sent == 0:
            self.metrics.ttfa_seconds.observe(
                (now_ns - (ctx.first_text_ns or ctx.created_ns)) / 1e9, self.endpoint
            )
        ctx.samples_sent += samples
        self.metrics.audio_seconds_total.inc(self.endpoint, amount=samples / ENGINE_RATE)
        ctx.clock.on_audio_sent(samples, now_ns)
        self.synthesis.update_deadline(ctx, now_ns, "server_model")


async def serve(websocket: WebSocket, make: type[CompatSocket], *args: object) -> None:
    """Admit, build the protocol's socket (a refusal it raises is answered at the handshake), run it."""
    state: GatewayState = websocket.app.state.gateway
    if not await admit(websocket, state):
        return
    try:
        socket = make(websocket, state, *args)
    except EngineUnavailable as exc:
        await refuse(websocket, state, HttpError(503, exc.code, str(exc)))
        return
    except HttpError as error:
        await refuse(websocket, state, error)
        return
    await socket.run()
