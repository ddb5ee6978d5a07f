"""ElevenLabs-compatible API: stream-input and multi-stream-input WebSockets, HTTP stream endpoints.

WebSockets `/v1/text-to-speech/{voice_id}/stream-input` (one context) and `.../multi-stream-input`
(several concurrent contexts, `context_id` on every message) run on the native engine path
(gateway/compat/socket.py). The voice id is one of our speaker names (or an OpenAI voice name), or with
a Base model a saved voice (gateway/voices.py resolves it); ElevenLabs requests have no field for a voice
description, so a VoiceDesign model refuses them (400 `missing_instructions`);
query `output_format`, `language_code` (ISO 639-1), `inactivity_timeout` and `seed` are honoured,
`model_id`, `auto_mode`, `sync_alignment` and the other switches are accepted and ignored; a bad
voice, language or format is refused at the handshake with an HTTP 400 and a JSON error.

Text rules as Pipecat and LiveKit use them: a context's first message (`" "`) opens it; text is
appended; `flush: true` forces what is buffered; on stream-input `{"text": ""}` ends the stream,
and the socket closes after `isFinal`; on multi-stream-input `{"text": ""}` is a keepalive (with
`flush: true` it flushes), `close_context` finishes what was received and then sends `isFinal` (it
does not abort; a second one, or one for a finished context, is ignored), and `close_socket` ends
every context and closes the socket once they are final.

HTTP: `POST /v1/text-to-speech/{voice_id}` and `.../stream` answer audio bytes, streamed;
`.../stream/with-timestamps` answers JSON lines with `audio_base64` and character alignment, and
`.../with-timestamps` one JSON object. Alignment is approximate (gateway/compat/timings.py).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.websockets import WebSocket

from gateway import protocol as p
from gateway.compat import elevenlabs_wire as wire
from gateway.compat.formats import FormatError, elevenlabs_format
from gateway.compat.socket import CompatContext, CompatError, CompatSocket, serve
from gateway.compat.timings import CharTimeline, CharTiming
from gateway.encoders import FormatUnavailable, OutputFormat, make_encoder
from gateway.engines import EngineUnavailable
from gateway.http_common import SEED_MAX, HttpError, check_api_key, error_response, gateway_state
from gateway.oneshot import EngineFailed, EngineStreamingResponse, PcmStream, build_submit, open_request
from gateway.state import GatewayState
from gateway.voices import UnknownName, Voice, resolve_language

SINGLE_CONTEXT = "0"  # stream-input's one context (its replies carry no contextId)
INACTIVITY_DEFAULT_S = 20
INACTIVITY_MAX_S = 3600


def _voice_and_language(state: GatewayState, voice_id: str, language_code: str | None) -> tuple[Voice, str]:
    info = state.engine_info()
    try:
        served = state.voices()
        served.check_instructions("", protocol="ElevenLabs")  # no field for a VoiceDesign description
        voice = served.resolve(voice_id)
        language = resolve_language(language_code, (*info.languages, "auto")) if language_code else "auto"
    except UnknownName as exc:
        raise HttpError(
            400, exc.code, str(exc), param="language_code" if exc.code == "unknown_language" else "voice_id"
        ) from None
    return voice, language


def _output(name: str | None) -> OutputFormat:
    try:
        return elevenlabs_format(name)
    except FormatError as exc:
        raise HttpError(400, "unsupported_output_format", str(exc), param="output_format") from None


def _int_param(query: Any, name: str, default: int | None, low: int, high: int) -> int | None:
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HttpError(400, "invalid_value", f"{name} must be an integer", param=name) from None
    if not low <= value <= high:
        raise HttpError(400, "invalid_value", f"{name} must be between {low} and {high}", param=name)
    return value


class ElevenLabsSocket(CompatSocket):
    def __init__(self, websocket: WebSocket, state: GatewayState, multi: bool) -> None:
        query = websocket.query_params
        self.voice, self.language = _voice_and_language(
            state, websocket.path_params["voice_id"], query.get("language_code")
        )
        self.output = _output(query.get("output_format"))
        timeout = _int_param(query, "inactivity_timeout", INACTIVITY_DEFAULT_S, 1, INACTIVITY_MAX_S)
        self.seed = _int_param(query, "seed", None, 0, SEED_MAX)  # every context of the socket samples with it
        super().__init__(websocket, state, idle_timeout_s=float(timeout or INACTIVITY_DEFAULT_S))
        self.multi = multi
        self.errors_name_contexts = multi  # stream-input's errors name no context: one error says it all
        self.endpoint = "elevenlabs_ws"
        self.closing_socket = False  # close_socket (multi) or the end of the stream (single) was asked

    # ------------------------------------------------------------ messages in

    def handle(self, text: str) -> None:
        try:
            msg = wire.parse_message(text)
        except wire.WireError as exc:
            raise CompatError(exc.code, exc.message, context_id=exc.context_id) from None
        if self.multi:
            self._handle_multi(msg)
        else:
            self._handle_single(msg)

    def _handle_single(self, msg: wire.Message) -> None:
        ctx = self.contexts.live.get(SINGLE_CONTEXT)
        if ctx is None and self.closing_socket:
            return  # the stream ended; nothing more is taken
        if ctx is None:
            ctx = self._open(SINGLE_CONTEXT)
        if msg.text == "" or msg.close_socket:
            self.closing_socket = True
            self.end(ctx)
            return
        if msg.text:
            self.append(ctx, msg.text)
        if msg.flush:
            self.flush(ctx)

    def _handle_multi(self, msg: wire.Message) -> None:
        if msg.close_socket:
            self.closing_socket = True
            for live in list(self.contexts.live.values()):
                self.end(live)  # type: ignore[arg-type]
            self._close_if_done()
            return
        if msg.context_id is None:
            if msg.text:
                raise CompatError(
                    "missing_context_id", "multi-stream-input messages with text need a context_id"
                )
            return  # {"text": ""}: a keepalive
        ctx = self.contexts.live.get(msg.context_id)
        if msg.close_context:
            if isinstance(ctx, CompatContext):
                self.end(ctx)  # finish what was received, then isFinal; a repeat is ignored
            return
        if ctx is None:
            if not msg.text and not msg.flush:
                return  # a keepalive for a context that is gone (or never was)
            if self.closing_socket:
                raise CompatError(
                    "socket_closing", "close_socket was sent; no new contexts", context_id=msg.context_id
                )
            ctx = self._open(msg.context_id)
        assert isinstance(ctx, CompatContext)
        if ctx.ended:
            if msg.text and msg.text.strip():
                raise CompatError(
                    "context_closed", f"context {msg.context_id!r} was closed", context_id=msg.context_id
                )
            return
        if msg.text:
            self.append(ctx, msg.text)
        if msg.flush:
            self.flush(ctx)

    def _open(self, context_id: str) -> CompatContext:
        return self.open_context(context_id, voice=self.voice, language=self.language, output=self.output,
                                 seed=self.seed)  # fmt: skip

    # ------------------------------------------------------------ replies out

    def _reply_id(self, ctx: CompatContext) -> str | None:
        return ctx.context_id if self.multi else None

    def audio_messages(
        self, ctx: CompatContext, data: bytes, chars: list[CharTiming], start_s: float
    ) -> list[str]:
        return [wire.audio_reply(self._reply_id(ctx), data, chars, start_s)]

    def final_messages(
        self, ctx: CompatContext, data: bytes, chars: list[CharTiming], start_s: float
    ) -> list[str]:
        replies = [wire.audio_reply(self._reply_id(ctx), data, chars, start_s)] if data or chars else []
        return [*replies, wire.final_reply(self._reply_id(ctx))]

    def error_message(self, error: CompatError) -> str:
        context_id = error.context_id if self.multi else None
        return wire.error_reply(error.code, error.message, context_id)

    def context_finished(self, ctx: CompatContext) -> None:
        self._close_if_done()

    def _close_if_done(self) -> None:
        if self.closing_socket and not self.contexts.live:
            self.close(code=p.CLOSE_NORMAL)


async def stream_input(websocket: WebSocket) -> None:
    await serve(websocket, ElevenLabsSocket, False)


async def multi_stream_input(websocket: WebSocket) -> None:
    await serve(websocket, ElevenLabsSocket, True)


# ---------------------------------------------------------------- HTTP


async def _start(request: Request) -> tuple[GatewayState, PcmStream, OutputFormat, str]:
    """Parse, submit and wait for the engine's first reply; raises HttpError."""
    state = gateway_state(request)
    started_ns = time.monotonic_ns()
    check_api_key(request, state)
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise HttpError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("text"), str) or not body["text"].strip():
        raise HttpError(400, "missing_text", "'text' must be non-empty text", param="text")
    language_code = body.get("language_code")
    if language_code is not None and not isinstance(language_code, str):
        raise HttpError(400, "invalid_value", "language_code must be a string", param="language_code")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise HttpError(400, "invalid_value", "seed must be an integer", param="seed")
    voice, language = _voice_and_language(state, request.path_params["voice_id"], language_code)
    output = _output(request.query_params.get("output_format"))
    text = body["text"].strip()
    submit = build_submit(
        state, text, voice=voice, language=language, seed=seed, arrival_ns=started_ns, param="text"
    )
    engine_request, first = await open_request(state, submit)
    return state, PcmStream(state, engine_request, first, started_ns, "elevenlabs_http"), output, text


async def _respond(request: Request, with_timestamps: bool, streamed: bool) -> Response:
    state = gateway_state(request)
    try:
        state, pcm, output, text = await _start(request)
        try:
            encoder = make_encoder(output)
        except FormatUnavailable as exc:
            pcm.engine_request.cancel()
            pcm.engine_request.release()
            raise HttpError(400, "format_unavailable", str(exc), param="output_format") from None
    except EngineUnavailable as exc:
        return error_response(HttpError(503, exc.code, str(exc)), state)
    except HttpError as error:
        return error_response(error, state)
    timeline = CharTimeline()
    timeline.add_text(text)

    async def chunks() -> AsyncIterator[tuple[bytes, list[CharTiming]]]:
        header = encoder.start()
        async for chunk in pcm:
            before = encoder.samples_out
            data = header + encoder.audio(chunk)
            header = b""
            yield data, timeline.audio((encoder.samples_out - before) / output.sample_rate)
        before = encoder.samples_out
        data = header + encoder.finish()
        yield data, timeline.audio((encoder.samples_out - before) / output.sample_rate) + timeline.finish()

    if not with_timestamps:

        async def audio() -> AsyncIterator[bytes]:
            async for data, _ in chunks():
                if data:
                    yield data

        return EngineStreamingResponse(audio(), pcm.engine_request, media_type=output.media_type)
    if streamed:

        async def lines() -> AsyncIterator[bytes]:
            try:
                async for data, chars in chunks():
                    if data or chars:
                        yield orjson.dumps(wire.http_chunk(data, chars)) + b"\n"
            except EngineFailed as exc:
                yield orjson.dumps({"error": exc.code, "message": exc.message}) + b"\n"

        return EngineStreamingResponse(lines(), pcm.engine_request, media_type="application/x-ndjson")
    audio_parts: list[bytes] = []
    timed: list[CharTiming] = []
    try:
        async for data, chars in chunks():
            audio_parts.append(data)
            timed += chars
    except EngineFailed as exc:
        return error_response(HttpError(500, exc.code, exc.message), state)
    return JSONResponse(wire.http_chunk(b"".join(audio_parts), timed))


async def convert(request: Request) -> Response:
    return await _respond(request, with_timestamps=False, streamed=True)


async def stream_with_timestamps(request: Request) -> Response:
    return await _respond(request, with_timestamps=True, streamed=True)


async def convert_with_timestamps(request: Request) -> Response:
    return await _respond(request, with_timestamps=True, streamed=False)
