"""One complete text through the engine, for HTTP endpoints: submit, first reply, then PCM as it comes.

Every HTTP synthesis endpoint (OpenAI, ElevenLabs, Cartesia) goes through here, so they share the
same limits, metrics and failure rules: the engine's first reply is awaited before the response
starts (failures known by then become JSON errors with a status), `PcmStream` yields the engine's
24 kHz PCM16 and counts TTFA, audio seconds and outcomes, and a client that leaves mid-stream has
its engine request cancelled at once (`EngineStreamingResponse` covers a client that left before
the body started).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.ipc.messages import Audio, Done, DoneReason, Error, Layout, Outbound, Sampling, Submit
from gateway.engines import EngineRequest, EngineUnavailable
from gateway.http_common import HttpError, check_seed
from gateway.resample import ENGINE_RATE
from gateway.state import GatewayState
from gateway.textstream import TextStream
from gateway.voices import Voice

ENGINE_ERROR_STATUS = {"bad_request": 400, "overloaded": 503, "engine_died": 503, "engine_unavailable": 503}


class EngineFailed(RuntimeError):
    """The engine ended a request with an error after audio had started."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def build_submit(
    state: GatewayState,
    text: str,
    *,
    voice: Voice,
    language: str,
    instructions: str = "",
    layout: Layout = Layout.STREAMING,
    seed: int | None = None,
    arrival_ns: int,
    param: str = "input",
) -> Submit:
    """The engine request for one complete text: the ids the WebSocket path would send in one message."""
    check_seed(seed)
    if len(text) > state.settings.limits.max_text_chars:
        raise HttpError(
            400,
            "text_too_long",
            f"text is limited to {state.settings.limits.max_text_chars} characters",
            param=param,
        )
    tokenizer = state.tokenizer
    stream = TextStream(tokenizer, tokenizer.special_strings)
    try:
        instruct_ids = tuple(tokenizer.instruct_ids(instructions)) if instructions else ()
        pieces = [p for p in (stream.append(text), stream.flush()) if p is not None]
    except ValueError as exc:
        raise HttpError(400, "invalid_text", str(exc), param=param) from None
    ids = tuple(i for piece in pieces for i in piece.ids)
    if not ids:
        raise HttpError(400, "missing_input", "the text must not be empty", param=param)
    return Submit(
        request_id=0,
        speaker=voice.speaker,
        language=language,
        text_ids=ids,
        text_chars=sum(piece.chars for piece in pieces),
        text_ended=True,
        instruct_ids=instruct_ids,
        layout=layout,
        seed=secrets.randbits(31) if seed is None else seed,
        sampling=Sampling(),
        arrival_ns=arrival_ns,
        voice=voice.saved,
    )


async def open_request(state: GatewayState, submit: Submit) -> tuple[EngineRequest, Outbound]:
    """Submit and wait for the engine's first reply; a failure by then is an HttpError."""
    if state.draining:
        raise HttpError(503, "server_draining", "the server is shutting down")
    try:
        engine_request = state.pool.submit(submit)
    except EngineUnavailable as exc:
        raise HttpError(503, exc.code, str(exc)) from None
    first = await engine_request.events.get()
    if isinstance(first, Error) or (isinstance(first, Done) and first.reason != DoneReason.COMPLETED):
        engine_request.release()
        code = first.code if isinstance(first, Error) else "engine_error"
        message = first.message if isinstance(first, Error) else "the engine ended the request early"
        raise HttpError(ENGINE_ERROR_STATUS.get(code, 500), code, message)
    return engine_request, first


class PcmStream:
    """The engine's PCM chunks for one request: `async for pcm in stream`; afterwards `frames` and
    `samples` are final. Raises EngineFailed if the engine fails; cancels the engine work if the
    consumer stops early."""

    def __init__(
        self,
        state: GatewayState,
        engine_request: EngineRequest,
        first: Outbound,
        started_ns: int,
        endpoint: str,
    ) -> None:
        self.state = state
        self.engine_request = engine_request
        self.first = first
        self.started_ns = started_ns
        self.endpoint = endpoint
        self.samples = 0  # at 24 kHz
        self.frames = 0  # codec frames the engine generated (OpenAI's usage counts them as output tokens)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        metrics = self.state.metrics
        endpoint = self.endpoint
        finished = False
        with self.state.http_stream():
            metrics.contexts_active.inc()
            try:
                msg = self.first
                while True:
                    if isinstance(msg, Audio):
                        if self.samples == 0:
                            metrics.ttfa_seconds.observe(
                                (time.monotonic_ns() - self.started_ns) / 1e9, endpoint
                            )
                        self.samples += len(msg.pcm) // 2
                        yield msg.pcm
                    elif isinstance(msg, Done) and msg.reason == DoneReason.COMPLETED:
                        finished = True
                        self.frames = msg.frames
                        metrics.requests_total.inc(endpoint, "completed")
                        metrics.audio_seconds_total.inc(endpoint, amount=self.samples / ENGINE_RATE)
                        return
                    else:
                        finished = True
                        code = msg.code if isinstance(msg, Error) else "engine_error"
                        message = (
                            msg.message if isinstance(msg, Error) else "the engine ended the request early"
                        )
                        metrics.requests_total.inc(endpoint, "error")
                        metrics.errors_total.inc(code)
                        raise EngineFailed(code, message)
                    msg = await self.engine_request.events.get()
            finally:
                metrics.contexts_active.dec()
                if not finished:  # the client went away mid-stream: stop the engine work now
                    self.engine_request.cancel()
                    metrics.requests_total.inc(endpoint, "disconnected")
                self.engine_request.release()


class EngineStreamingResponse(StreamingResponse):
    """Cancels the engine request however the response ends, even when the client left before the
    body generator ever started (its own `finally` would then never run)."""

    def __init__(self, content: AsyncIterator[bytes], engine_request: EngineRequest, **kwargs: Any) -> None:
        kwargs.setdefault("headers", {"cache-control": "no-store"})
        super().__init__(content, **kwargs)
        self.engine_request = engine_request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.engine_request.finished:
                self.engine_request.cancel()
                self.engine_request.release()
