"""A cap on HTTP request bodies, enforced before any handler reads them.

One promise: a request whose body is larger than `max_bytes` (by its Content-Length, or by what arrives
when it has none or lies) gets 413 with an OpenAI-shaped error, and no more than `max_bytes` of it is ever
held in memory. The gateway's bound is derived from its text limit: `6 x max_text_chars + 64 KiB`, room for
an `input` of `max_text_chars` characters written entirely as JSON `\\uXXXX` escapes plus the other fields.
"""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

JSON_ESCAPE_BYTES = 6  # the longest JSON spelling of one character ("\\uXXXX")
OTHER_FIELDS_BYTES = 64 * 1024


def body_limit_for(max_text_chars: int) -> int:
    return JSON_ESCAPE_BYTES * max_text_chars + OTHER_FIELDS_BYTES


class BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, path_limits: dict[str, int] | None = None) -> None:
        """`path_limits`: a larger (or smaller) bound for exact paths, e.g. an upload endpoint."""
        self.app = app
        self.max_bytes = max_bytes
        self.path_limits = path_limits or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(scope.get("path", ""), self.max_bytes)
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(send, limit)
            return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(send, limit)

    async def _refuse(self, send: Send, limit: int) -> None:
        body = orjson.dumps(
            {
                "error": {
                    "message": f"the request body is larger than {limit} bytes",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "body_too_large",
                }
            }
        )
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
