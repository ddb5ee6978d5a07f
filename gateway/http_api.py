"""HTTP endpoints: OpenAI-compatible `POST /v1/audio/speech`, models, voices, health, readiness, metrics.

`/v1/audio/speech` follows OpenAI's request shape (ecosystem.md 1.4) and streams audio as the
engine produces it: pcm (raw s16le 24 kHz mono), wav (streaming header), opus (Ogg pages, one per
engine chunk), raw or as SSE (`speech.audio.delta` / `speech.audio.done`). The engine's first reply
is awaited before the response starts, so failures known by then are proper OpenAI-shaped JSON
errors; a failure after audio started ends an SSE stream with an `error` event and aborts a raw
stream (the client sees a truncated body, never a silently short file).
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.ipc.messages import Audio, Done, DoneReason, Error, Layout, Outbound, Sampling, Submit
from gateway.audio import OggOpusMuxer, OpusPacketizer, OpusUnavailable, opus_available, wav_header
from gateway.engines import EngineRequest, EngineUnavailable
from gateway.state import GatewayState
from gateway.textstream import TextStream
from gateway.voices import OPENAI_VOICES, UnknownName, default_voice, resolve_language, resolve_voice

MEDIA_TYPES = {"pcm": "audio/pcm", "wav": "audio/wav", "opus": "audio/ogg"}
MODEL_ALIASES = ("tts-1", "tts-1-hd")
ENGINE_ERROR_STATUS = {"bad_request": 400, "overloaded": 503, "engine_died": 503, "engine_unavailable": 503}


class HttpError(Exception):
    def __init__(
        self, status: int, code: str, message: str, param: str | None = None, error_type: str = ""
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.error_type = error_type or ("invalid_request_error" if status < 500 else "server_error")


class StreamAborted(RuntimeError):
    """Raised inside a raw audio stream to abort the response (the only way HTTP can say 'failed')."""


def error_response(error: HttpError, state: GatewayState) -> JSONResponse:
    state.metrics.errors_total.inc(error.code)
    body = {
        "error": {
            "message": error.message,
            "type": error.error_type,
            "param": error.param,
            "code": error.code,
        }
    }
    return JSONResponse(body, status_code=error.status)


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


def check_api_key(request: Request, state: GatewayState) -> None:
    key = state.settings.api_key
    if key is None:
        return
    auth = request.headers.get("authorization", "")
    given = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
    if not secrets.compare_digest(given.encode(), key.encode()):
        raise HttpError(
            401,
            "invalid_api_key",
            "missing or wrong API key (Authorization: Bearer <key>)",
            error_type="authentication_error",
        )


# ---------------------------------------------------------------- request parsing


@dataclass(frozen=True, slots=True)
class SpeechParams:
    text: str
    voice: str
    language: str
    instructions: str
    response_format: str
    sse: bool
    layout: Layout
    seed: int


def _field(body: dict[str, Any], name: str, kinds: type | tuple[type, ...], default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    allowed = kinds if isinstance(kinds, tuple) else (kinds,)
    if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
        raise HttpError(400, "invalid_value", f"'{name}' has the wrong type", param=name)
    return value


def parse_speech(body: Any, state: GatewayState) -> SpeechParams:
    if not isinstance(body, dict):
        raise HttpError(400, "invalid_json", "the body must be a JSON object")
    info = state.engine_info()
    text = _field(body, "input", str, "")
    if not text.strip():
        raise HttpError(400, "missing_input", "'input' must be non-empty text", param="input")
    if len(text) > state.settings.limits.max_text_chars:
        raise HttpError(
            400,
            "text_too_long",
            f"'input' is limited to {state.settings.limits.max_text_chars} characters",
            param="input",
        )
    _field(body, "model", str, "")  # any model name selects the served model
    voice_field = body.get("voice")
    if isinstance(voice_field, dict):
        voice_field = voice_field.get("id")
    if voice_field is not None and not isinstance(voice_field, str):
        raise HttpError(400, "invalid_value", "'voice' must be a name or {\"id\": name}", param="voice")
    language_field = _field(body, "language", str, "auto")
    try:
        voice = (
            default_voice(info.speakers) if voice_field is None else resolve_voice(voice_field, info.speakers)
        )
        language = resolve_language(language_field, (*info.languages, "auto"))
    except UnknownName as exc:
        raise HttpError(
            400, exc.code, str(exc), param="voice" if exc.code == "unknown_voice" else "language"
        ) from None
    response_format = _field(body, "response_format", str, "wav")
    if response_format not in MEDIA_TYPES:
        raise HttpError(
            400,
            "unsupported_response_format",
            f"response_format {response_format!r} is not supported; use pcm, wav or opus",
            param="response_format",
        )
    stream_format = _field(body, "stream_format", str, "audio")
    if stream_format not in ("audio", "sse"):
        raise HttpError(400, "invalid_value", "stream_format must be 'audio' or 'sse'", param="stream_format")
    speed = _field(body, "speed", (int, float), 1.0)
    if speed != 1.0:
        raise HttpError(400, "unsupported_speed", "only speed 1.0 is supported for now", param="speed")
    seed = _field(body, "seed", int, None)
    _field(body, "stream", bool, True)  # accepted: audio is always streamed
    non_streaming = _field(body, "non_streaming_mode", bool, False)
    instructions = _field(body, "instructions", str, "")
    return SpeechParams(
        text=text,
        voice=voice,
        language=language,
        instructions=instructions,
        response_format=response_format,
        sse=stream_format == "sse",
        layout=Layout.NON_STREAMING if non_streaming else Layout.STREAMING,
        seed=secrets.randbits(31) if seed is None else seed,
    )


# ---------------------------------------------------------------- endpoints


async def speech(request: Request) -> Response:
    state = gateway_state(request)
    started_ns = time.monotonic_ns()
    try:
        check_api_key(request, state)
        if state.draining:
            raise HttpError(503, "server_draining", "the server is shutting down")
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            raise HttpError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
        params = parse_speech(body, state)
        if params.response_format == "opus" and not opus_available():
            raise HttpError(400, "opus_unavailable", "Opus is not available on this server (libopus missing); "
                            "use pcm or wav", param="response_format")  # fmt: skip
        submit = _build_submit(params, state, started_ns)
        engine_request = state.pool.submit(submit)
    except EngineUnavailable as exc:
        return error_response(HttpError(503, exc.code, str(exc)), state)
    except HttpError as error:
        return error_response(error, state)
    first = await engine_request.events.get()
    if isinstance(first, Error) or (isinstance(first, Done) and first.reason != DoneReason.COMPLETED):
        engine_request.release()
        code = first.code if isinstance(first, Error) else "engine_error"
        message = first.message if isinstance(first, Error) else "the engine ended the request early"
        return error_response(HttpError(ENGINE_ERROR_STATUS.get(code, 500), code, message), state)
    try:
        encoder = _Encoder(params)
    except OpusUnavailable as exc:
        engine_request.cancel()
        engine_request.release()
        return error_response(HttpError(400, "opus_unavailable", str(exc), param="response_format"), state)
    media_type = "text/event-stream" if params.sse else MEDIA_TYPES[params.response_format]
    body_iter = _stream(state, engine_request, first, encoder, params, started_ns, len(submit.text_ids))
    return EngineStreamingResponse(
        body_iter, engine_request, media_type=media_type, headers={"cache-control": "no-store"}
    )


class EngineStreamingResponse(StreamingResponse):
    """Cancels the engine request however the response ends, even when the client left before the
    body generator ever started (its own `finally` would then never run)."""

    def __init__(self, content: AsyncIterator[bytes], engine_request: EngineRequest, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.engine_request = engine_request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.engine_request.finished:
                self.engine_request.cancel()
                self.engine_request.release()


def _build_submit(params: SpeechParams, state: GatewayState, arrival_ns: int) -> Submit:
    tokenizer = state.tokenizer
    text = TextStream(tokenizer, tokenizer.special_strings)
    try:
        instruct_ids = tuple(tokenizer.instruct_ids(params.instructions)) if params.instructions else ()
        pieces = [text.append(params.text), text.flush()]
    except ValueError as exc:
        raise HttpError(400, "invalid_text", str(exc), param="input") from None
    # The ids the WebSocket path would send for this text, in one message.
    ids = tuple(i for piece in pieces if piece is not None for i in piece.ids)
    if not ids:
        raise HttpError(400, "missing_input", "'input' must be non-empty text", param="input")
    return Submit(
        request_id=0,
        speaker=params.voice,
        language=params.language,
        text_ids=ids,
        text_chars=sum(piece.chars for piece in pieces if piece is not None),
        text_ended=True,
        instruct_ids=instruct_ids,
        layout=params.layout,
        seed=params.seed,
        sampling=Sampling(),
        arrival_ns=arrival_ns,
    )


class _Encoder:
    """PCM chunks in, response-format bytes out."""

    def __init__(self, params: SpeechParams) -> None:
        self.format = params.response_format
        self.opus = OpusPacketizer() if self.format == "opus" else None
        self.ogg = OggOpusMuxer(self.opus.pre_skip) if self.opus is not None else None
        self.samples = 0

    def start(self) -> bytes:
        if self.format == "wav":
            return wav_header()
        return self.ogg.start() if self.ogg is not None else b""

    def audio(self, pcm: bytes) -> bytes:
        self.samples += len(pcm) // 2
        if self.opus is None or self.ogg is None:
            return pcm
        return self.ogg.pages(self.opus.encode(pcm))

    def finish(self) -> bytes:
        if self.opus is None or self.ogg is None:
            return b""
        return self.ogg.pages(self.opus.finish(), last=True, total_samples=self.samples)


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


async def _stream(
    state: GatewayState,
    engine_request: EngineRequest,
    first: Outbound,
    encoder: _Encoder,
    params: SpeechParams,
    started_ns: int,
    input_tokens: int,
) -> AsyncIterator[bytes]:
    metrics = state.metrics

    def wrap(data: bytes) -> bytes:
        if not params.sse or not data:
            return data
        return _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})

    finished = False
    with state.http_stream():
        metrics.contexts_active.inc()
        try:
            yield wrap(encoder.start())
            msg = first
            while True:
                if isinstance(msg, Audio):
                    if encoder.samples == 0:
                        metrics.ttfa_seconds.observe((time.monotonic_ns() - started_ns) / 1e9, "http")
                    yield wrap(encoder.audio(msg.pcm))
                elif isinstance(msg, Done) and msg.reason == DoneReason.COMPLETED:
                    finished = True
                    yield wrap(encoder.finish())
                    if params.sse:
                        usage = {
                            "input_tokens": input_tokens,
                            "output_tokens": msg.frames,
                            "total_tokens": input_tokens + msg.frames,
                        }
                        yield _sse({"type": "speech.audio.done", "usage": usage})
                    metrics.requests_total.inc("http", "completed")
                    metrics.audio_seconds_total.inc("http", amount=encoder.samples / 24000)
                    return
                else:
                    finished = True
                    code = msg.code if isinstance(msg, Error) else "engine_error"
                    message = msg.message if isinstance(msg, Error) else "the engine ended the request early"
                    metrics.requests_total.inc("http", "error")
                    metrics.errors_total.inc(code)
                    if params.sse:
                        yield _sse(
                            {
                                "type": "error",
                                "error": {"type": "server_error", "code": code, "message": message},
                            }
                        )
                        return
                    raise StreamAborted(f"{code}: {message}")
                msg = await engine_request.events.get()
        finally:
            metrics.contexts_active.dec()
            if not finished:  # the client went away mid-stream: stop the engine work now
                engine_request.cancel()
                metrics.requests_total.inc("http", "disconnected")
            engine_request.release()


async def models(request: Request) -> Response:
    state = gateway_state(request)
    try:
        check_api_key(request, state)
    except HttpError as error:
        return error_response(error, state)
    served = state.pool.info.model_id if state.pool.info is not None else state.settings.model
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "vivace"}
        for name in (served, *MODEL_ALIASES)
    ]
    return JSONResponse({"object": "list", "data": data})


async def voices(request: Request) -> Response:
    state = gateway_state(request)
    try:
        check_api_key(request, state)
        info = state.engine_info()
    except HttpError as error:
        return error_response(error, state)
    except EngineUnavailable as exc:
        return error_response(HttpError(503, exc.code, str(exc)), state)
    aliases = {name: speaker for name, speaker in OPENAI_VOICES.items() if speaker in info.speakers}
    return JSONResponse(
        {
            "voices": list(info.speakers),
            "openai_aliases": aliases,
            "languages": sorted({*info.languages, "auto"}),
        }
    )


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    state = gateway_state(request)
    engines = [
        {"engine": slot.index, "ready": slot.ready, "restarts": slot.restarts} for slot in state.pool.slots
    ]
    is_ready = state.pool.ready and not state.draining
    status = "ready" if is_ready else ("draining" if state.draining else "not_ready")
    return JSONResponse({"status": status, "engines": engines}, status_code=200 if is_ready else 503)


async def metrics(request: Request) -> Response:
    state = gateway_state(request)
    if state.settings.metrics_need_key:
        try:
            check_api_key(request, state)
        except HttpError as error:
            return error_response(error, state)
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
