"""What every HTTP endpoint shares: the error type, its OpenAI-shaped JSON body, the API-key check.

Errors are `{"error": {"message", "type", "param", "code"}}` on every endpoint, the compatible ones
included (their clients read the status and show the body), and on the router's own 404 and 405 (whose
`Allow` names the methods of the routes at that path). The key is accepted in each vendor's
header: `Authorization: Bearer` (OpenAI, Cartesia SDK), `X-API-Key` (Cartesia), `xi-api-key`
(ElevenLabs).
"""

from __future__ import annotations

import secrets
from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route

from gateway.state import GatewayState

KEY_HEADERS = ("x-api-key", "xi-api-key")


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

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


def error_response(error: HttpError, state: GatewayState) -> JSONResponse:
    state.metrics.errors_total.inc(error.code)
    return JSONResponse(error.body(), status_code=error.status)


SEED_MAX = 2**64 - 1  # the engine wire carries the seed as an unsigned 64-bit integer


def check_seed(seed: int | None) -> int | None:
    """A request's `seed`: None or an integer 0 to 2^64 - 1 (else 400, not a failure to encode it)."""
    if seed is not None and not 0 <= seed <= SEED_MAX:
        raise HttpError(400, "invalid_value", "seed must be an integer from 0 to 2^64 - 1", param="seed")
    return seed


ROUTER_CODES = {404: "not_found", 405: "method_not_allowed"}


async def router_error(request: Request, exc: Exception) -> Response:
    """The router's refusals (no such path, wrong method) in the OpenAI error shape."""
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:  # the static mount at "/" answers for every path: name the routes' methods
        methods = {
            method
            for route in request.app.routes
            if isinstance(route, Route) and route.matches(request.scope)[0] is not Match.NONE
            for method in route.methods or ()
        }
        if methods:
            headers["Allow"] = ", ".join(sorted(methods))
    code = ROUTER_CODES.get(exc.status_code, "http_error")
    error = HttpError(exc.status_code, code, str(exc.detail))
    return JSONResponse(error.body(), status_code=exc.status_code, headers=headers)


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


def key_matches(headers: Headers, key: str | None) -> bool:
    """Whether the request carries `key` in any header a supported client sends it in."""
    if key is None:
        return True
    auth = headers.get("authorization", "")
    given = [auth[7:].strip()] if auth[:7].lower() == "bearer " else []
    given += [headers[name] for name in KEY_HEADERS if name in headers]
    return any(secrets.compare_digest(g.encode(), key.encode()) for g in given)


def check_api_key(request: Request, state: GatewayState) -> None:
    if not key_matches(request.headers, state.settings.api_key):
        raise HttpError(
            401,
            "invalid_api_key",
            "missing or wrong API key (Authorization: Bearer <key>, X-API-Key or xi-api-key)",
            error_type="authentication_error",
        )
