"""Lean WebSocket transport for `vivace.speech.v1` on an asyncio Protocol (`--client fast`, default).

Same conversation, checks and metrics as `ws_client.py` (the `websockets` implementation), but
each server frame is parsed and recorded inside `data_received`, with no task switch or message
queue per audio frame: that is what lets one core drive hundreds of streams. Framing per
RFC 6455 (`loadtest/wsframes.py`); client frames are masked with a fresh random key each.

    socket bytes ─▶ handshake (101, accept key, subprotocol) ─▶ FrameParser ─▶ session.created?
                                                                            └▶ LiveContextReader
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from loadtest.connect import connect_protocol
from loadtest.trace import RequestFailed, StreamTrace
from loadtest.ws_client import (
    PROTOCOL,
    LiveContextReader,
    check_session,
    context_create,
    live_url,
    new_context_id,
    paced_input,
    parse_event,
    playback_reports,
    session_update_pacing,
)
from loadtest.wsframes import (
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    FrameParser,
    ProtocolViolation,
    accept_key,
    encode_masked_frame,
)

MAX_HEAD_BYTES = 64 * 1024
Handler = Callable[[int, bytes, float], None]


class _WsConnection(asyncio.Protocol):
    def __init__(self, key: str, handler: Handler) -> None:
        loop = asyncio.get_running_loop()
        self.key, self.handler = key, handler
        self.transport: asyncio.Transport | None = None
        self.upgraded: asyncio.Future[None] = loop.create_future()
        self.failed: asyncio.Future[None] = loop.create_future()  # set when the connection breaks
        self.head = b""
        self.parser = FrameParser()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        try:
            if not self.upgraded.done():
                data = self._handshake(data)
            for opcode, payload in self.parser.feed(data) if data else ():
                if opcode == OP_PING:
                    self.send(OP_PONG, payload)
                elif opcode == OP_CLOSE:
                    code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                    reason = payload[2:].decode("utf-8", "replace")
                    self._break(
                        RequestFailed("ws_closed", f"server closed the socket ({code} {reason})".strip())
                    )
                    return
                elif opcode in (OP_TEXT, OP_BINARY):
                    self.handler(opcode, payload, now)
        except ProtocolViolation as exc:
            self._break(RequestFailed("protocol", str(exc)))
        except RequestFailed as exc:
            self._break(exc)

    def _handshake(self, data: bytes) -> bytes:
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > MAX_HEAD_BYTES:
                raise RequestFailed("protocol", "handshake response head over 64 KiB")
            return b""
        lines = self.head[:end].decode("latin-1").split("\r\n")
        rest, self.head = self.head[end + 4 :], b""
        status = lines[0].split(" ", 2)
        if len(status) < 2 or status[1] != "101":
            raise RequestFailed(
                f"http_{status[1] if len(status) > 1 else '???'}", "WebSocket handshake refused"
            )
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("sec-websocket-accept") != accept_key(self.key):
            raise RequestFailed("protocol", "bad Sec-WebSocket-Accept in the handshake")
        if headers.get("sec-websocket-protocol") != PROTOCOL:
            raise RequestFailed(
                "protocol", f"server negotiated {headers.get('sec-websocket-protocol')!r}, not {PROTOCOL}"
            )
        if headers.get("sec-websocket-extensions"):
            raise RequestFailed("protocol", "server enabled an extension we did not offer")
        self.upgraded.set_result(None)
        return rest

    def send(self, opcode: int, payload: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(encode_masked_frame(opcode, payload, os.urandom(4)))

    def send_text(self, text: str) -> None:
        self.send(OP_TEXT, text.encode())

    def _break(self, exc: RequestFailed) -> None:
        for future in (self.upgraded, self.failed):
            if not future.done():
                future.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._break(RequestFailed("ws_closed", f"connection lost before context.done ({exc or 'EOF'})"))

    def close(self) -> None:
        """Polite close (1000), then drop the connection: the request's numbers are already final."""
        self.send(OP_CLOSE, (1000).to_bytes(2, "big"))
        if self.transport is not None:
            self.transport.close()
        for future in (self.upgraded, self.failed):
            if future.done() and not future.cancelled():
                future.exception()  # mark retrieved
            else:
                future.cancel()


class FastWsSpeechClient:
    def __init__(
        self,
        base_url: str,
        *,
        voice: str,
        language: str | None,
        sample_rate: int,
        word_interval_s: float,
        playback_report_s: float | None,
        timeout_s: float,
        api_key: str | None = None,
        max_lead_ms: int | None = None,
    ) -> None:
        self.max_lead_ms = max_lead_ms
        url = urlsplit(live_url(base_url))
        if not url.hostname:
            raise ValueError(f"no host in {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "wss" else 80)
        self.ssl = ssl.create_default_context() if url.scheme == "wss" else None
        auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self.request_head = (
            f"GET {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {PROTOCOL}\r\nUser-Agent: vivace-loadtest\r\n{auth}"
        )
        self.voice, self.language, self.sample_rate = voice, language, sample_rate
        self.word_interval_s = word_interval_s
        self.playback_report_s = playback_report_s
        self.timeout_s = timeout_s

    async def close(self) -> None:
        """Nothing pooled: each request owns its socket."""

    async def synthesize(self, text: str, trace: StreamTrace) -> None:
        loop = asyncio.get_running_loop()
        context_id = new_context_id()
        reader = LiveContextReader(context_id, trace)
        session: asyncio.Future[None] = loop.create_future()
        finished: asyncio.Future[None] = loop.create_future()

        def on_message(opcode: int, payload: bytes, now: float) -> None:
            try:
                if opcode == OP_BINARY:
                    if not session.done():
                        raise RequestFailed("protocol", "binary frame before session.created")
                    reader.binary(payload, now)
                elif not session.done():
                    check_session(parse_event(payload.decode("utf-8", "replace")), self.sample_rate)
                    session.set_result(None)
                elif (
                    reader.event(parse_event(payload.decode("utf-8", "replace")), now) and not finished.done()
                ):
                    finished.set_result(None)
            except RequestFailed as exc:
                for future in (session, finished):
                    if not future.done():
                        future.set_exception(exc)

        key = base64.b64encode(os.urandom(16)).decode()
        connection = await connect_protocol(lambda: _WsConnection(key, on_message), self.host, self.port, self.ssl)
        helpers: list[asyncio.Task[None]] = []
        try:
            assert connection.transport is not None
            connection.transport.write((self.request_head + f"Sec-WebSocket-Key: {key}\r\n\r\n").encode())
            await _first(session, connection.failed)
            trace.setup_done = time.monotonic()
            if self.max_lead_ms is not None:
                connection.send_text(session_update_pacing(self.max_lead_ms))
            connection.send_text(context_create(context_id, self.voice, self.language))
            trace.dispatch = time.monotonic()
            helpers.append(asyncio.create_task(self._send_text(connection, context_id, text, trace)))
            if self.playback_report_s:
                helpers.append(asyncio.create_task(self._report_playback(connection, context_id, trace)))
            await _first(finished, connection.failed)
        finally:
            for helper in helpers:
                helper.cancel()
            connection.close()
            for future in (session, finished):
                if future.done() and not future.cancelled():
                    future.exception()
                else:
                    future.cancel()

    async def _send_text(
        self, connection: _WsConnection, context_id: str, text: str, trace: StreamTrace
    ) -> None:
        async for event in paced_input(context_id, text, self.word_interval_s, trace):
            connection.send_text(event)
        trace.input_last = time.monotonic()

    async def _report_playback(self, connection: _WsConnection, context_id: str, trace: StreamTrace) -> None:
        assert self.playback_report_s is not None
        async for report in playback_reports(context_id, trace, self.playback_report_s):
            connection.send_text(report)
            trace.reports_sent += 1


async def _first(wanted: asyncio.Future[None], failure: asyncio.Future[None]) -> None:
    """Wait for `wanted`; raise what `failure` carries if the connection breaks first."""
    await asyncio.wait((wanted, failure), return_when=asyncio.FIRST_COMPLETED)
    if wanted.done():
        wanted.result()
        return
    failure.result()
    raise RequestFailed("ws_closed", "connection ended before the server answered")
