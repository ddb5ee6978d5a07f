"""Opening the raw connections the fast clients run on: a failure to connect is `RequestFailed("connect")`.

`h1_client.py` (HTTP/1.1) and `ws_fast.py` (WebSocket) speak their protocols on their own asyncio
Protocols; this is the one place both open a TCP connection (TLS when given a context), so a
refused or unreachable server is counted the same way by both.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import TypeVar

from loadtest.trace import RequestFailed

ProtocolT = TypeVar("ProtocolT", bound=asyncio.BaseProtocol)


async def connect_protocol(
    protocol_factory: Callable[[], ProtocolT], host: str, port: int, tls: ssl.SSLContext | None
) -> ProtocolT:
    """Connect to `host:port` (TLS, checking the host name, when `tls` is given); the protocol built."""
    loop = asyncio.get_running_loop()
    try:
        _, protocol = await loop.create_connection(
            protocol_factory, host, port, ssl=tls, server_hostname=host if tls else None
        )
    except OSError as exc:
        raise RequestFailed("connect", f"{type(exc).__name__}: {exc}") from None
    return protocol
