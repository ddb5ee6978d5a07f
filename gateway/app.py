"""The Starlette application: routes, the WebSocket door (auth, origin, subprotocol), lifespan, drain.

`create_app(settings)` builds everything a server needs; the lifespan starts the engine supervisors
and shuts the engines down at exit. `drain(state)` is the SIGTERM path: refuse new work, let live
contexts and HTTP streams finish within `drain_timeout_s`, then close sockets with 1001.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from engine.gc_watch import freeze_startup_objects
from gateway import http_api, voice_api
from gateway import protocol as p
from gateway.body_limit import BodyLimitMiddleware, body_limit_for
from gateway.compat import routes as compat_routes
from gateway.engines import EnginePool, EngineStartFailure, EngineUnavailable
from gateway.gpus import engine_gpus
from gateway.http_common import router_error
from gateway.metrics import GatewayMetrics
from gateway.model_source import locate_model
from gateway.session import Session
from gateway.settings import Settings
from gateway.state import GatewayState

LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class RequestIdMiddleware:
    """Every HTTP response carries `x-request-id`: the client's own if well-formed, else a new one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")
        request_id = given if _REQUEST_ID.match(given) else "req_" + secrets.token_hex(12)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", request_id.encode())]
            await send(message)

        await self.app(scope, receive, send_with_id)


def origin_allowed(origin: str | None, host: str | None, allowed: tuple[str, ...]) -> bool:
    """Browsers send Origin; backends usually do not (and are then not subject to this check)."""
    if origin is None or "*" in allowed:
        return True
    origin = origin.rstrip("/").lower()
    if origin in (a.lower() for a in allowed):
        return True
    parts = urlsplit(origin)
    if host is not None and parts.netloc == host.lower():
        return True  # same origin: the demo page this server serves
    return not allowed and parts.hostname in LOCAL_HOSTS


def _websocket_key_ok(websocket: WebSocket, key: str | None, offered: list[str]) -> bool:
    if key is None:
        return True
    auth = websocket.headers.get("authorization", "")
    if auth[:7].lower() == "bearer " and secrets.compare_digest(auth[7:].strip().encode(), key.encode()):
        return True
    tokens = [s[len(p.AUTH_SUBPROTOCOL_PREFIX) :] for s in offered if s.startswith(p.AUTH_SUBPROTOCOL_PREFIX)]
    return any(secrets.compare_digest(t.encode(), key.encode()) for t in tokens)


async def _deny(websocket: WebSocket, status: int, code: str, message: str, state: GatewayState) -> None:
    state.metrics.errors_total.inc(code)
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    await websocket.send_denial_response(JSONResponse(body, status_code=status))


async def _accept_and_close(
    websocket: WebSocket, error: p.ProtocolError, state: GatewayState, subprotocol: str | None
) -> None:
    assert error.close_code is not None
    state.metrics.errors_total.inc(error.code)
    await websocket.accept(subprotocol=subprotocol)
    await websocket.send_text(p.dumps(p.error_event(error)))
    await websocket.close(error.close_code, error.code)


async def live(websocket: WebSocket) -> None:
    state: GatewayState = websocket.app.state.gateway
    settings = state.settings
    offered = list(websocket.scope.get("subprotocols", []))
    if not origin_allowed(
        websocket.headers.get("origin"), websocket.headers.get("host"), settings.allowed_origins
    ):
        await _deny(websocket, 403, "origin_not_allowed", "this Origin may not open sockets here", state)
        return
    if not _websocket_key_ok(websocket, settings.api_key, offered):
        await _deny(
            websocket,
            401,
            "invalid_api_key",
            f"missing or wrong API key (Authorization: Bearer, or subprotocol {p.AUTH_SUBPROTOCOL_PREFIX}<key>)",
            state,
        )
        return
    if state.draining:
        await _deny(websocket, 503, "server_draining", "the server is shutting down", state)
        return
    if p.PROTOCOL not in offered:
        error = p.ProtocolError(
            "subprotocol_required",
            f"offer the WebSocket subprotocol {p.PROTOCOL!r}",
            close_code=p.CLOSE_PROTOCOL_ERROR,
        )
        await _accept_and_close(websocket, error, state, None)
        return
    try:
        session = Session(websocket, state)
    except EngineUnavailable as exc:
        error = p.ProtocolError(exc.code, str(exc), error_type="server_error", close_code=p.CLOSE_TRY_AGAIN)
        await _accept_and_close(websocket, error, state, p.PROTOCOL)
        return
    await session.run()


async def drain(state: GatewayState) -> None:
    """Refuse new work, give live work `drain_timeout_s` to finish, then close every socket 1001."""
    state.draining = True
    deadline = time.monotonic() + state.settings.drain_timeout_s
    waits = [session.drain(deadline) for session in list(state.sessions)]
    await asyncio.gather(*waits, return_exceptions=True)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(state.http_idle.wait(), max(0.0, deadline - time.monotonic()))
    # Give the sessions' send loops a moment to write their close frames.
    for _ in range(100):
        if not state.sessions:
            break
        await asyncio.sleep(0.02)


async def voices(request: Request) -> Response:
    """GET: what the model offers (gateway.http_api); POST: save a voice (gateway.voice_api)."""
    return await (voice_api.create if request.method == "POST" else http_api.voices)(request)


def create_app(
    settings: Settings, on_engine_failure: Callable[[EngineStartFailure], None] | None = None
) -> Starlette:
    """Build the app; raises ModelMissing when the model's files are not available, ModelUnsupported for a
    kind of model the engine does not serve (gateway.model_source), NotEnoughGpus
    when --engines asks for more GPUs than the server was given.

    `on_engine_failure` is called when an engine cannot start (see gateway.engines): the server should stop.
    """
    source = locate_model(settings)
    gpus = engine_gpus(settings)
    metrics = GatewayMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        pool = EnginePool(settings, metrics, gpus, on_failure=on_engine_failure)
        app.state.gateway = GatewayState(settings=settings, metrics=metrics, pool=pool, source=source)
        pool.start()
        freeze_startup_objects()  # what start-up built is never garbage: later collections need not walk it
        try:
            yield
        finally:
            await pool.close()

    routes: list[Route | WebSocketRoute | Mount] = [
        WebSocketRoute("/v1/audio/speech/live", live),
        Route("/v1/audio/speech", http_api.speech, methods=["POST"]),
        Route("/v1/models", http_api.models),
        Route("/v1/audio/voices", voices, methods=["GET", "POST"]),
        Route("/v1/audio/voices/{name}", voice_api.one_voice, methods=["GET", "DELETE"]),
        Route("/health", http_api.health),
        Route("/ready", http_api.ready),
        Route("/metrics", http_api.metrics),
        *compat_routes.ROUTES,
    ]
    if settings.web_dir.is_dir():
        routes.append(Mount("/", StaticFiles(directory=settings.web_dir, html=True), name="web"))
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: router_error})
    app.add_middleware(BodyLimitMiddleware, max_bytes=body_limit_for(settings.limits.max_text_chars),
                       path_limits={"/v1/audio/voices": voice_api.UPLOAD_LIMIT_BYTES})
    app.add_middleware(RequestIdMiddleware)
    return app
