"""Lean HTTP/1.1 transport on asyncio Protocols: the same request and metrics as `http_client.py`
(httpx) at a small fraction of the CPU per received chunk, so one core can drive hundreds of RPS.

Each response body chunk is timestamped and recorded inside `data_received`, before any task
switch, so arrival times are as close to the socket as Python gets. Connections are pooled
(keep-alive) like httpx's; a pooled connection the server closed while idle is retried once on a
fresh one. Response framing handled: chunked, Content-Length, and read-until-close.

    response bytes ─▶ _Exchange.feed ─▶ head? status line + headers (checks) ─▶ body framing
                                                              └─▶ trace.audio(payload, now)
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

from loadtest.connect import connect_protocol
from loadtest.http_client import SPEECH_PATH, check_pcm_headers, speech_fields
from loadtest.trace import RequestFailed, StreamTrace

MAX_HEAD_BYTES = 64 * 1024
ERROR_BODY_BYTES = 300


class _Exchange:
    """Parses one response incrementally; resolves `done` (keep-alive allowed: bool) or fails it."""

    def __init__(self, trace: StreamTrace, sample_rate: int) -> None:
        self.trace, self.sample_rate = trace, sample_rate
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.buffer = bytearray()
        self.state = "head"  # head | size | data | data_crlf | trailer | length | until_close | done
        self.remaining = 0
        self.status = 0
        self.keep_alive = True
        self.error_body = bytearray()
        self.received_any = False

    def feed(self, data: bytes, now: float) -> None:
        self.received_any = True
        try:
            self._feed(data, now)
        except RequestFailed as exc:
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        self.state = "done"
        if not self.done.done():
            self.done.set_exception(exc)

    def eof(self) -> None:
        if self.state == "until_close":
            self._finish(keep_alive=False)
        elif self.state != "done":
            self.fail(RequestFailed("transport", f"connection closed mid-response (state {self.state})"))

    def _body(self, payload: memoryview | bytes, now: float) -> None:
        if not payload:
            return
        if self.status == 200:
            self.trace.audio(payload, now)
        elif len(self.error_body) < ERROR_BODY_BYTES:
            self.error_body += payload[: ERROR_BODY_BYTES - len(self.error_body)]

    def _finish(self, keep_alive: bool) -> None:
        self.state = "done"
        if self.status != 200:
            raise_later = RequestFailed(f"http_{self.status}", self.error_body.decode("utf-8", "replace"))
            if not self.done.done():
                self.done.set_exception(raise_later)
            return
        self.trace.end = time.monotonic()
        if not self.done.done():
            self.done.set_result(keep_alive and self.keep_alive)

    def _feed(self, data: bytes, now: float) -> None:
        if self.buffer:
            self.buffer += data
            data, self.buffer = bytes(self.buffer), bytearray()
        view = memoryview(data)
        pos = 0
        while pos < len(data) and self.state != "done":
            state = self.state
            if state == "head":
                end = data.find(b"\r\n\r\n", pos)
                if end < 0:
                    if len(data) - pos > MAX_HEAD_BYTES:
                        raise RequestFailed("protocol", "response head over 64 KiB")
                    break
                self._head(data[pos:end].decode("latin-1"))
                pos = end + 4
            elif state in ("length", "data"):
                take = min(self.remaining, len(data) - pos)
                self._body(view[pos : pos + take], now)
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    if state == "length":
                        self._finish(keep_alive=True)
                    else:
                        self.state = "data_crlf"
            elif state == "until_close":
                self._body(view[pos:], now)
                pos = len(data)
            elif state == "data_crlf":
                if len(data) - pos < 2:
                    break
                if data[pos : pos + 2] != b"\r\n":
                    raise RequestFailed("protocol", "chunk not followed by CRLF")
                pos += 2
                self.state = "size"
            elif state == "size":
                end = data.find(b"\r\n", pos)
                if end < 0:
                    break
                line = data[pos:end].split(b";", 1)[0].strip()
                try:
                    self.remaining = int(line, 16)
                except ValueError:
                    raise RequestFailed("protocol", f"bad chunk size line {line[:40]!r}") from None
                pos = end + 2
                self.state = "data" if self.remaining else "trailer"
            elif state == "trailer":
                end = data.find(b"\r\n", pos)
                if end < 0:
                    break
                if end == pos:
                    pos += 2
                    self._finish(keep_alive=True)
                else:
                    pos = end + 2  # a trailer field: ignored
        if pos < len(data) and self.state != "done":
            self.buffer += view[pos:]

    def _head(self, head: str) -> None:
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise RequestFailed("protocol", f"bad status line {lines[0][:80]!r}")
        status = int(parts[1])
        if 100 <= status < 200:
            return  # an interim response (100 Continue): the real head follows
        self.status = status
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if parts[0] == "HTTP/1.0" or "close" in headers.get("connection", "").lower():
            self.keep_alive = False
        if status == 200:
            check_pcm_headers(headers.get("content-type"), headers.get("x-sample-rate"), self.sample_rate)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.state = "size"
        elif "content-length" in headers:
            self.remaining = int(headers["content-length"])
            self.state = "length"
            if self.remaining == 0:
                self._finish(keep_alive=True)
        else:
            self.state = "until_close"


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.exchange is None:  # bytes nobody asked for: the connection is unusable
            self.close()
            return
        self.exchange.feed(data, time.monotonic())

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.exchange is not None:
            self.exchange.eof()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class FastHttpSpeechClient:
    """`--client fast` (default) for HTTP: keep-alive pool of raw asyncio connections."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        voice: str,
        language: str | None,
        sample_rate: int,
        max_connections: int,
        timeout_s: float,
        extra_params: dict[str, Any] | None = None,
        api_key: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"HTTP URL must look like http://host:port, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.path = parts.path.rstrip("/") + SPEECH_PATH
        self.sample_rate = sample_rate
        self.max_connections = max_connections
        self.fields = speech_fields(model, voice, language, extra_params)
        host_header = parts.netloc.rsplit("@", 1)[-1]
        auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self.head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: vivace-loadtest\r\n"
            f"Accept-Encoding: identity\r\nContent-Type: application/json\r\n{auth}"
        )
        self.idle: list[_Connection] = []
        self.open = 0

    async def close(self) -> None:
        for connection in self.idle:
            connection.close()
        self.idle.clear()

    async def synthesize(self, text: str, trace: StreamTrace) -> None:
        body = json.dumps({**self.fields, "input": text}).encode()
        request = (self.head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        for attempt in (0, 1):
            connection = None
            while self.idle and connection is None:
                candidate = self.idle.pop()
                if not candidate.closed:
                    connection = candidate
            reused = connection is not None
            if connection is None:
                connection = await connect_protocol(_Connection, self.host, self.port, self.ssl)
            exchange = _Exchange(trace, self.sample_rate)
            connection.exchange = exchange
            if connection.closed:
                exchange.eof()
            else:
                assert connection.transport is not None
                trace.dispatch = time.monotonic()
                connection.transport.write(request)
            try:
                keep_alive = await exchange.done
            except RequestFailed:
                connection.close()
                if reused and attempt == 0 and not exchange.received_any:
                    trace.dispatch = None  # the server dropped an idle connection: retry once
                    continue
                raise
            except BaseException:
                connection.close()  # cancelled or timed out mid-response: never reuse
                raise
            connection.exchange = None
            if keep_alive and len(self.idle) < self.max_connections:
                self.idle.append(connection)
            else:
                connection.close()
            return
