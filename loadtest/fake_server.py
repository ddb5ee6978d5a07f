"""A tiny fake TTS server that streams PCM over both transports, for tests and client benchmarks.

It is raw asyncio (HTTP/1.1 keep-alive with chunked bodies, and the WebSocket framing in
`loadtest/wsframes.py`) so that one core can serve hundreds of concurrent streams without
becoming the bottleneck the client-efficiency measurement is looking for.

Endpoints: POST /v1/audio/speech (OpenAI-shaped, response_format pcm only), GET /v1/audio/speech/live
(WebSocket, subprotocol vivace.speech.v1: context.create, input_text.append/end, context.cancel,
playback.position, ping), GET /health, GET /ready, GET /stats (counters as JSON).

What it sends and when is defined in `loadtest/fake_audio.py`, so tests can predict every
client-side number.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import struct
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from loadtest.fake_audio import FakeVoice, Producer, ToneBank
from loadtest.wsframes import (
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    ProtocolViolation,
    encode_frame,
    handshake_response,
    read_message,
)

PROTOCOL = "vivace.speech.v1"
FRAME_HEADER = struct.Struct("<BBHII")
MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = 1 << 20


@dataclass(slots=True)
class Stats:
    counters: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0

    def to_json(self) -> dict[str, Any]:
        return {**self.counters, "in_flight": self.in_flight}


class FakeTtsServer:
    def __init__(self, voice: FakeVoice | None = None) -> None:
        self.voice = voice or FakeVoice()
        self.bank = ToneBank(self.voice)
        self.stats = Stats()
        self._request_numbers = itertools.count(1)
        self._server: asyncio.Server | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen; return the bound port."""
        self._server = await asyncio.start_server(
            self._connection, host, port, limit=MAX_HEADER_BYTES, backlog=4096
        )
        return self._server.sockets[0].getsockname()[1]

    async def serve_forever(self) -> None:
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _should_fail(self) -> bool:
        number = next(self._request_numbers)
        return bool(self.voice.fail_every) and number % self.voice.fail_every == 0

    # ---------------------------------------------------------------- HTTP

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.LimitOverrunError:
                    await _respond(writer, 431, {"error": {"message": "headers too large"}}, close=True)
                    return
                method, target, headers = _parse_head(head)
                path = urlsplit(target).path
                if headers.get("upgrade", "").lower() == "websocket":
                    await self._websocket(reader, writer, path, headers)
                    return
                length = int(headers.get("content-length", "0") or 0)
                if length > MAX_BODY_BYTES:
                    await _respond(writer, 413, _error("body too large", "invalid_request_error"), close=True)
                    return
                body = await reader.readexactly(length) if length else b""
                await self._route(writer, method, path, body)
                if headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def _route(self, writer: asyncio.StreamWriter, method: str, path: str, body: bytes) -> None:
        self.stats.counters[f"http {method} {path}"] += 1
        if method == "GET" and path in ("/health", "/ready"):
            await _respond(writer, 200, {"status": "ok"})
        elif method == "GET" and path == "/stats":
            await _respond(writer, 200, self.stats.to_json())
        elif method == "POST" and path == "/v1/audio/speech":
            await self._speech(writer, body)
        else:
            await _respond(writer, 404, _error(f"no route {method} {path}", "not_found_error"))

    async def _speech(self, writer: asyncio.StreamWriter, body: bytes) -> None:
        try:
            request = json.loads(body)
        except json.JSONDecodeError:
            await _respond(writer, 400, _error("body is not JSON", "invalid_request_error"))
            return
        text = request.get("input") if isinstance(request, dict) else None
        if not isinstance(text, str) or not text.strip():
            await _respond(writer, 400, _error("'input' must be a non-empty string", "invalid_request_error"))
            return
        if request.get("response_format", "mp3") != "pcm":
            await _respond(
                writer,
                400,
                _error("this fake server speaks response_format 'pcm' only", "invalid_request_error"),
            )
            return
        if self._should_fail():
            self.stats.counters["injected_failures"] += 1
            await _respond(writer, 500, _error("injected failure", "server_error"))
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: audio/pcm\r\nx-sample-rate: %d\r\n"
            b"transfer-encoding: chunked\r\n\r\n" % self.voice.sample_rate
        )
        total = self.voice.samples_for(len(text))
        producer = Producer(self.voice)
        self.stats.in_flight += 1
        try:
            while producer.sent < total:
                await producer.wait_turn()
                size = producer.next_size(total)
                data = self.bank.slice(producer.sent, producer.sent + size)
                producer.sent += size
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            self.stats.counters["http_completed"] += 1
        finally:
            self.stats.in_flight -= 1

    # ---------------------------------------------------------------- WebSocket

    async def _websocket(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, headers: dict[str, str]
    ) -> None:
        offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",")]
        key = headers.get("sec-websocket-key")
        if path != "/v1/audio/speech/live" or PROTOCOL not in offered or not key:
            await _respond(
                writer,
                400,
                _error(f"WebSocket needs {PROTOCOL} at /v1/audio/speech/live", "invalid_request_error"),
                close=True,
            )
            return
        writer.write(handshake_response(key, PROTOCOL))
        self.stats.counters["ws_sessions"] += 1
        session = _FakeSession(self, writer)
        session.send_json(
            {
                "type": "session.created",
                "session_id": f"fake-{self.stats.counters['ws_sessions']}",
                "protocol": PROTOCOL,
                "audio": {"format": "pcm16", "sample_rate": self.voice.sample_rate, "channels": 1},
                "model": {"id": "fake", "random_weights": True},
            }
        )
        try:
            while True:
                opcode, payload = await read_message(reader)
                if opcode == OP_CLOSE:
                    writer.write(encode_frame(OP_CLOSE, payload[:2] or struct.pack("!H", 1000)))
                    await writer.drain()
                    return
                if opcode == OP_PING:
                    writer.write(encode_frame(OP_PONG, payload))
                elif opcode == OP_BINARY:
                    raise ProtocolViolation(1003, "binary frames from the client are not accepted")
                elif opcode == OP_TEXT:
                    session.handle(payload)
        except ProtocolViolation as exc:
            writer.write(encode_frame(OP_CLOSE, struct.pack("!H", exc.code) + str(exc).encode()[:120]))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            session.close()


class _FakeSession:
    """One socket's contexts; each context streams audio from its own task."""

    def __init__(self, server: FakeTtsServer, writer: asyncio.StreamWriter) -> None:
        self.server, self.writer = server, writer
        self.contexts: dict[str, _FakeContext] = {}
        self.streams = itertools.count()

    def send_json(self, event: dict[str, Any]) -> None:
        self.writer.write(encode_frame(OP_TEXT, json.dumps(event).encode()))

    def handle(self, payload: bytes) -> None:
        try:
            event = json.loads(payload)
        except json.JSONDecodeError:
            self.send_json(
                {
                    "type": "error",
                    "error": {"type": "invalid_request_error", "code": "invalid_json", "message": "not JSON"},
                }
            )
            return
        kind, context_id = event.get("type"), event.get("context_id")
        counters = self.server.stats.counters
        counters[f"ws {kind}"] += 1
        if kind == "ping":
            self.send_json(
                {
                    "type": "pong",
                    "id": event.get("id"),
                    "client_time_ms": event.get("client_time_ms"),
                    "server_time_ms": time.monotonic() * 1000.0,
                }
            )
            return
        if kind == "session.update":
            self.send_json({"type": "session.updated", "max_lead_ms": event.get("max_lead_ms")})
            return
        if not isinstance(context_id, str):
            self.send_json(
                {
                    "type": "error",
                    "error": {
                        "type": "invalid_request_error",
                        "code": "missing_context_id",
                        "message": f"{kind} needs a context_id",
                    },
                }
            )
            return
        context = self.contexts.get(context_id)
        if context is None and kind in ("context.create", "input_text.append"):
            context = self.contexts[context_id] = _FakeContext(self, context_id, next(self.streams))
        if context is None:
            self.send_json(
                {
                    "type": "error",
                    "context_id": context_id,
                    "error": {
                        "type": "invalid_request_error",
                        "code": "unknown_context",
                        "message": f"no context {context_id!r}",
                    },
                }
            )
            return
        if kind == "input_text.append":
            context.append(str(event.get("text", "")))
        elif kind == "input_text.end":
            context.end()
        elif kind == "context.cancel":
            context.cancel(int(event.get("heard_samples") or 0))
        elif kind == "playback.position":
            played = event.get("played_samples")
            if not isinstance(played, int) or played < context.reported or played > context.samples_sent:
                counters["playback_report_errors"] += 1
            else:
                context.reported = played
                counters["playback_reports"] += 1

    def close(self) -> None:
        for context in self.contexts.values():
            if context.task is not None:
                context.task.cancel()


class _FakeContext:
    def __init__(self, session: _FakeSession, context_id: str, stream: int) -> None:
        self.session, self.context_id, self.stream = session, context_id, stream
        self.chars = 0
        self.ended = False
        self.more = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.samples_sent = 0
        self.reported = 0
        voice = session.server.voice
        session.send_json(
            {
                "type": "context.created",
                "context_id": context_id,
                "stream": stream,
                "audio": {"format": "pcm16", "sample_rate": voice.sample_rate, "channels": 1},
            }
        )

    def append(self, text: str) -> None:
        self.chars += len(text)
        self.more.set()
        if self.task is None:
            self.task = asyncio.create_task(self._produce())

    def end(self) -> None:
        self.ended = True
        self.more.set()
        if self.task is None:
            self.task = asyncio.create_task(self._produce())

    def cancel(self, heard: int) -> None:
        if self.task is not None:
            self.task.cancel()
        self.session.send_json(
            {
                "type": "context.cancelled",
                "context_id": self.context_id,
                "samples_sent": self.samples_sent,
                "heard_samples": heard,
            }
        )

    async def _produce(self) -> None:
        server = self.session.server
        voice, writer = server.voice, self.session.writer
        if server._should_fail():
            server.stats.counters["injected_failures"] += 1
            self.session.send_json(
                {
                    "type": "error",
                    "context_id": self.context_id,
                    "error": {
                        "type": "server_error",
                        "code": "injected_failure",
                        "message": "injected failure",
                    },
                }
            )
            self.session.send_json(
                {"type": "context.done", "context_id": self.context_id, "reason": "error", "samples": 0}
            )
            return
        producer = Producer(voice)
        sequence = 0
        server.stats.in_flight += 1
        try:
            while True:
                # The length model grows with the text received; when caught up, wait for more text.
                available = voice.samples_for(self.chars) if self.chars else 0
                if producer.sent >= available:
                    if self.ended:
                        break
                    self.more.clear()
                    await self.more.wait()
                    continue
                await producer.wait_turn()
                size = producer.next_size(available)
                flags = 1 if sequence == 0 else 0
                header = FRAME_HEADER.pack(1, flags, self.stream, sequence, producer.sent)
                writer.write(
                    encode_frame(OP_BINARY, header + server.bank.slice(producer.sent, producer.sent + size))
                )
                producer.sent += size
                self.samples_sent = producer.sent
                sequence += 1
                await writer.drain()
            self.session.send_json(
                {
                    "type": "context.done",
                    "context_id": self.context_id,
                    "reason": "completed",
                    "samples": producer.sent,
                }
            )
            server.stats.counters["ws_completed"] += 1
        except ConnectionError:
            pass
        finally:
            server.stats.in_flight -= 1


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = (lines[0].split(" ", 2) + ["", ""])[:3]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return method, target, headers


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


async def _respond(
    writer: asyncio.StreamWriter, status: int, body: dict[str, Any], close: bool = False
) -> None:
    data = json.dumps(body).encode()
    reason = {
        200: "OK",
        400: "Bad Request",
        404: "Not Found",
        413: "Payload Too Large",
        431: "Request Header Fields Too Large",
        500: "Internal Server Error",
    }.get(status, "Error")
    connection = b"close" if close else b"keep-alive"
    writer.write(
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: %s\r\n\r\n%s"
        % (status, reason.encode(), len(data), connection, data)
    )
    await writer.drain()


async def serve(voice: FakeVoice, host: str, port: int) -> None:
    """Run until cancelled; print the URL first so a parent process can find the port."""
    server = FakeTtsServer(voice)
    bound = await server.start(host, port)
    print(f"fake TTS server listening on http://{host}:{bound}", flush=True)
    await server.serve_forever()
