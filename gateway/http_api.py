"""HTTP endpoints: OpenAI-compatible `POST /v1/audio/speech`, models, voices, health, readiness, metrics, OpenAPI.

`/v1/audio/speech` follows OpenAI's request shape (ecosystem.md 1.4) and streams audio as the
engine produces it, in every OpenAI `response_format`: mp3 (the default, as at OpenAI), opus (Ogg),
aac (ADTS), flac, wav (streaming header) and pcm (raw s16le), raw or as SSE (`speech.audio.delta` /
`speech.audio.done`). An extra `sample_rate` field (8000 ... 48000) resamples pcm, wav, mp3, aac and
flac; the default is the model's 24 kHz. The engine path and its failure rules are gateway/oneshot.py:
failures known before audio are OpenAI-shaped JSON errors; a failure after audio started ends an
SSE stream with an `error` event and aborts a raw stream (the client sees a truncated body, never a
silently short file).
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.ipc.messages import Layout
from gateway.encoders import FormatUnavailable, OutputFormat, StreamEncoder, make_encoder
from gateway.engines import EngineUnavailable
from gateway.http_common import HttpError, check_api_key, check_seed, error_response, gateway_state
from gateway.oneshot import EngineFailed, EngineStreamingResponse, PcmStream, build_submit, open_request
from gateway.openapi import document as openapi_document
from gateway.resample import ENGINE_RATE, OUTPUT_RATES
from gateway.state import GatewayState
from gateway.voices import UnknownName, Voice, resolve_language

# OpenAI's response_format -> our codec names.
RESPONSE_FORMATS = {
    "mp3": "mp3",
    "opus": "opus",
    "aac": "aac",
    "flac": "flac",
    "wav": "wav",
    "pcm": "pcm_s16le",
}
MODEL_ALIASES = ("tts-1", "tts-1-hd")
_PARAMS = {  # the request field an UnknownName code is about (else "voice")
    "unknown_language": "language",
    "missing_instructions": "instructions",
    "instructions_not_supported": "instructions",
}

# ---------------------------------------------------------------- request parsing


@dataclass(frozen=True, slots=True)
class SpeechParams:
    text: str
    voice: Voice
    language: str
    instructions: str
    response_format: str
    output: OutputFormat
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
    instructions = _field(body, "instructions", str, "")
    try:
        served = state.voices()
        served.check_instructions(instructions)
        voice = served.pick(voice_field)
        language = resolve_language(language_field, (*info.languages, "auto"))
    except UnknownName as exc:
        raise HttpError(400, exc.code, str(exc), param=_PARAMS.get(exc.code, "voice")) from None
    response_format = _field(body, "response_format", str, "mp3")
    if response_format not in RESPONSE_FORMATS:
        raise HttpError(
            400,
            "unsupported_response_format",
            f"response_format {response_format!r} is not supported; use {', '.join(RESPONSE_FORMATS)}",
            param="response_format",
        )
    sample_rate = _field(body, "sample_rate", int, ENGINE_RATE)
    if sample_rate not in OUTPUT_RATES or (response_format == "opus" and sample_rate != ENGINE_RATE):
        raise HttpError(
            400,
            "unsupported_sample_rate",
            f"sample_rate must be one of {', '.join(map(str, OUTPUT_RATES))} (opus: Ogg Opus always "
            "decodes at 48 kHz; leave it out)",
            param="sample_rate",
        )
    stream_format = _field(body, "stream_format", str, "audio")
    if stream_format not in ("audio", "sse"):
        raise HttpError(400, "invalid_value", "stream_format must be 'audio' or 'sse'", param="stream_format")
    speed = _field(body, "speed", (int, float), 1.0)
    if speed != 1.0:
        raise HttpError(400, "unsupported_speed", "only speed 1.0 is supported for now", param="speed")
    seed = check_seed(_field(body, "seed", int, None))
    _field(body, "stream", bool, True)  # accepted: audio is always streamed
    non_streaming = _field(body, "non_streaming_mode", bool, False)
    return SpeechParams(
        text=text,
        voice=voice,
        language=language,
        instructions=instructions,
        response_format=response_format,
        output=OutputFormat(RESPONSE_FORMATS[response_format], sample_rate),
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
        encoder = _encoder(params.output)
        submit = build_submit(
            state,
            params.text,
            voice=params.voice,
            language=params.language,
            instructions=params.instructions,
            layout=params.layout,
            seed=params.seed,
            arrival_ns=started_ns,
        )
        engine_request, first = await open_request(state, submit)
    except EngineUnavailable as exc:
        return error_response(HttpError(503, exc.code, str(exc)), state)
    except HttpError as error:
        return error_response(error, state)
    pcm = PcmStream(state, engine_request, first, started_ns, "http")
    media_type = "text/event-stream" if params.sse else params.output.media_type
    body_iter = _stream(pcm, encoder, params.sse, len(submit.text_ids))
    return EngineStreamingResponse(body_iter, engine_request, media_type=media_type)


def _encoder(output: OutputFormat) -> StreamEncoder:
    try:
        return make_encoder(output)
    except FormatUnavailable as exc:
        code = "opus_unavailable" if output.codec == "opus" else "format_unavailable"
        raise HttpError(400, code, f"{exc}; use pcm or wav", param="response_format") from None


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


async def _stream(
    pcm: PcmStream, encoder: StreamEncoder, sse: bool, input_tokens: int
) -> AsyncIterator[bytes]:
    def wrap(data: bytes) -> bytes:
        if not sse or not data:
            return data
        return _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})

    yield wrap(encoder.start())
    try:
        async for chunk in pcm:
            data = encoder.audio(chunk)
            if data:
                yield wrap(data)
    except EngineFailed as exc:
        if not sse:
            raise  # aborts the body: a truncated response, never a silently short file
        yield _sse(
            {"type": "error", "error": {"type": "server_error", "code": exc.code, "message": exc.message}}
        )
        return
    yield wrap(encoder.finish())
    if sse:
        usage = {
            "input_tokens": input_tokens,
            "output_tokens": pcm.frames,
            "total_tokens": input_tokens + pcm.frames,
        }
        yield _sse({"type": "speech.audio.done", "usage": usage})


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
    served = state.voices()

    def listing() -> dict[str, object]:  # reads each saved voice's voice.json (up to the store's 200)
        saved = served.saved_names()
        return {
            "voices": saved if served.saved_only else served.names(),
            "voice_kind": served.voice_kind,
            "openai_aliases": served.openai_aliases(),
            "languages": sorted({*info.languages, "auto"}),
            "saved_voices": saved,
        }

    return JSONResponse(await asyncio.to_thread(listing))  # file reads off the event loop that serves audio


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    state = gateway_state(request)
    engines = [
        {
            "engine": slot.index,
            "ready": slot.ready,
            "restarts": slot.restarts,
            "gpu": slot.gpu,  # its CUDA_VISIBLE_DEVICES; null: the server's own
            "gpu_uuid": (slot.info.gpu_uuid or None) if slot.info is not None else None,
        }
        for slot in state.pool.slots
    ]
    is_ready = state.pool.ready and not state.draining
    status = "ready" if is_ready else ("draining" if state.draining else "not_ready")
    return JSONResponse({"status": status, "engines": engines}, status_code=200 if is_ready else 503)


async def openapi(request: Request) -> Response:
    return JSONResponse(openapi_document())


async def metrics(request: Request) -> Response:
    state = gateway_state(request)
    if state.settings.metrics_need_key:
        try:
            check_api_key(request, state)
        except HttpError as error:
            return error_response(error, state)
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
