"""Cartesia-compatible API: the `/tts/websocket` WebSocket and `POST /tts/bytes`.

The WebSocket runs on the native engine path (gateway/compat/socket.py). A request with a new
`context_id` opens a context with its `voice` (gateway/voices.py: one of our speaker names or an OpenAI
voice name, or with a Base model a saved voice), `language` (ISO 639-1, or null for automatic) and
`output_format` (raw `pcm_s16le`, `pcm_f32le`,
`pcm_mulaw`, `pcm_alaw`, or `wav` / `mp3` containers, at any supported `sample_rate`); later
requests on it append their `transcript`; `continue: false` ends its input, `flush: true` forces
what is buffered, and `{"context_id": c, "cancel": true}` stops it at once (also after its input
ended) with nothing more sent for it. Contexts run concurrently and the socket stays open after
`done`. Replies: `chunk` (base64 audio), `timestamps` (approximate word timings in seconds from
the start of the context, when `add_timestamps` is true), `done`, `error`. The version arrives as
a `Cartesia-Version` header or a `cartesia_version` query parameter and is accepted whatever it
says; `model_id` is accepted and ignored.

`POST /tts/bytes` takes the same fields with a complete `transcript` and streams the audio bytes.
Cartesia requests have no field for a voice description, so a VoiceDesign model refuses them
(`missing_instructions`: an `error` reply for the context, or 400).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.websockets import WebSocket

from gateway.compat import cartesia_wire as wire
from gateway.compat.formats import FormatError, cartesia_format
from gateway.compat.socket import CompatContext, CompatError, CompatSocket, serve
from gateway.compat.timings import CharTiming, WordTimeline
from gateway.encoders import FormatUnavailable, OutputFormat, make_encoder
from gateway.engines import EngineUnavailable
from gateway.http_common import SEED_MAX, HttpError, check_api_key, error_response, gateway_state
from gateway.oneshot import EngineStreamingResponse, PcmStream, build_submit, open_request
from gateway.state import GatewayState
from gateway.voices import UnknownName, resolve_language

IDLE_TIMEOUT_S = 300.0  # Cartesia closes idle sockets after about 5 minutes


class CartesiaSocket(CompatSocket):
    endpoint = "cartesia_ws"

    def __init__(self, websocket: WebSocket, state: GatewayState) -> None:
        super().__init__(websocket, state, idle_timeout_s=IDLE_TIMEOUT_S)
        self.words: dict[str, WordTimeline | None] = {}  # per context: None when timestamps are off
        self.last_chunk_ns: dict[str, int] = {}

    def handle(self, text: str) -> None:
        try:
            request = wire.parse_request(text)
        except wire.WireError as exc:
            raise CompatError(exc.code, exc.message, context_id=exc.context_id) from None
        ctx = self.contexts.live.get(request.context_id)
        if isinstance(request, wire.Cancel):
            if isinstance(ctx, CompatContext):
                self.cancel(ctx)
            return
        if ctx is None:
            ctx = self._open(request)
        assert isinstance(ctx, CompatContext)
        if ctx.ended and (request.transcript.strip() or request.more):
            raise CompatError(
                "context_closed",
                f"context {ctx.context_id!r} already ended its input",
                context_id=ctx.context_id,
            )
        if request.transcript:
            self.append(ctx, request.transcript)
        if request.flush:
            self.flush(ctx)
        if not request.more:
            self.end(ctx)

    def _open(self, request: wire.Generation) -> CompatContext:
        try:
            self.voices.check_instructions("", protocol="Cartesia")  # no field for a VoiceDesign description
            voice = self.voices.pick(request.voice)
            language = (
                "auto" if request.language is None else resolve_language(request.language, self.languages)
            )
            output = cartesia_format(request.output_format if request.output_format is not None else {})
        except UnknownName as exc:
            raise CompatError(exc.code, str(exc), context_id=request.context_id) from None
        except FormatError as exc:
            raise CompatError("unsupported_output_format", str(exc), context_id=request.context_id) from None
        if request.seed is not None and not 0 <= request.seed <= SEED_MAX:
            raise CompatError("invalid_request", "seed must be an integer from 0 to 2^64 - 1",
                              context_id=request.context_id)  # fmt: skip
        ctx = self.open_context(request.context_id, voice=voice, language=language, output=output,
                                seed=request.seed)  # fmt: skip
        self.words[ctx.context_id] = WordTimeline() if request.add_timestamps else None
        self.last_chunk_ns[ctx.context_id] = ctx.created_ns
        return ctx

    def audio_messages(
        self, ctx: CompatContext, data: bytes, chars: list[CharTiming], start_s: float
    ) -> list[str]:
        messages = []
        if data:
            now_ns = time.monotonic_ns()
            step_ms = (now_ns - self.last_chunk_ns.get(ctx.context_id, now_ns)) / 1e6
            self.last_chunk_ns[ctx.context_id] = now_ns
            messages.append(wire.chunk(ctx.context_id, data, step_ms))
        words = self.words.get(ctx.context_id)
        timed = words.add(chars) if words is not None else []
        if timed:
            messages.append(wire.timestamps(ctx.context_id, timed))
        return messages

    def final_messages(
        self, ctx: CompatContext, data: bytes, chars: list[CharTiming], start_s: float
    ) -> list[str]:
        messages = self.audio_messages(ctx, data, chars, start_s)
        words = self.words.get(ctx.context_id)
        if words is not None and (last := words.finish()):
            messages.append(wire.timestamps(ctx.context_id, last))
        return [*messages, wire.done(ctx.context_id)]

    def error_message(self, error: CompatError) -> str:
        return wire.error(error.context_id, error.code, error.message, error.status)

    def context_finished(self, ctx: CompatContext) -> None:
        self.words.pop(ctx.context_id, None)
        self.last_chunk_ns.pop(ctx.context_id, None)


async def websocket(websocket: WebSocket) -> None:
    await serve(websocket, CartesiaSocket)


async def tts_bytes(request: Request) -> Response:
    state = gateway_state(request)
    started_ns = time.monotonic_ns()
    try:
        check_api_key(request, state)
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            raise HttpError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise HttpError(400, "invalid_json", "the body must be a JSON object")
        try:
            parsed = wire.parse_request(orjson.dumps({"context_id": "bytes", **body}).decode())
        except wire.WireError as exc:
            raise HttpError(400, exc.code, exc.message) from None
        assert isinstance(parsed, wire.Generation)
        if not parsed.transcript.strip():
            raise HttpError(
                400, "missing_transcript", "transcript must be non-empty text", param="transcript"
            )
        info = state.engine_info()
        try:
            served = state.voices()
            served.check_instructions("", protocol="Cartesia")  # no field for a VoiceDesign description
            voice = served.pick(parsed.voice)
            languages = (*info.languages, "auto")
            language = "auto" if parsed.language is None else resolve_language(parsed.language, languages)
        except UnknownName as exc:
            raise HttpError(
                400, exc.code, str(exc), param="language" if exc.code == "unknown_language" else "voice"
            ) from None
        try:
            output: OutputFormat = cartesia_format(
                parsed.output_format if parsed.output_format is not None else {}
            )
            encoder = make_encoder(output)
        except (FormatError, FormatUnavailable) as exc:
            raise HttpError(400, "unsupported_output_format", str(exc), param="output_format") from None
        submit = build_submit(
            state,
            parsed.transcript.strip(),
            voice=voice,
            language=language,
            seed=parsed.seed,
            arrival_ns=started_ns,
            param="transcript",
        )
        engine_request, first = await open_request(state, submit)
    except EngineUnavailable as exc:
        return error_response(HttpError(503, exc.code, str(exc)), state)
    except HttpError as error:
        return error_response(error, state)
    pcm = PcmStream(state, engine_request, first, started_ns, "cartesia_http")

    async def audio() -> AsyncIterator[bytes]:
        yield encoder.start()
        async for chunk in pcm:
            data = encoder.audio(chunk)
            if data:
                yield data
        yield encoder.finish()

    return EngineStreamingResponse(audio(), engine_request, media_type=output.media_type)
