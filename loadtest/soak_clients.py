"""The soak's clients: each kind of user a server meets, and what each must get back.

One promise: every client function runs one user against a Vivace server and returns an `Outcome` whose
`result` is `completed`, `cancelled`, `abandoned` (the client itself hung up, on purpose), `error:<code>`
(the server answered with a structured error: a JSON body or an `error` event with a code), or
`failed:<why>` (no answer in time, wrong audio length, a broken protocol promise). Only `failed:` breaks
the soak's rule that every request completes or gets a clear error. A raw HTTP stream cut after its audio
started is `error:stream_aborted`: that is how the API reports a failure once the status line is sent.

Kinds: `http` (a whole WAV-less PCM body, length checked), `http_abandon` (hangs up after the first
chunk), `ws_multi` (three contexts on one socket, text streamed word by word and interleaved),
`ws_cancel` (barge-in after the first audio), `ws_disconnect` (drops the TCP connection after the first
audio), `ws_slow` (stops reading for a while mid-stream, then reads on). Lengths follow the
random-weight length model of the tiny model and the fake engine: ceil(12.5 x chars / 14) frames of 1920
samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

PROTOCOL = "vivace.speech.v1"
SAMPLES_PER_FRAME = 1920
HEADER_BYTES = 12  # binary audio frame header (docs/protocol.md 1.4)
FLAG_LAST = 2


def expected_samples(text: str) -> int:
    return math.ceil(12.5 * len(text) / 14) * SAMPLES_PER_FRAME


@dataclass
class Outcome:
    kind: str
    result: str
    seconds: float = 0.0
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.result.startswith("failed:")


class Broken(Exception):
    """A broken promise: the outcome is `failed:<reason>`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


class ServerError(Exception):
    """The server answered with a structured error: the outcome is `error:<code>`."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(code)
        self.code = code
        self.detail = detail


# ------------------------------------------------------------------ HTTP


def _http_error(status: int, body: bytes) -> Exception:
    try:
        error = orjson.loads(body)["error"]
        if isinstance(error.get("code"), str) and isinstance(error.get("message"), str):
            return ServerError(error["code"], f"HTTP {status}")
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    return Broken("unstructured_http_error", f"HTTP {status}: {body[:200]!r}")


async def http_speech(client: httpx.AsyncClient, text: str, voice: str, *, abandon: bool) -> str:
    body = {"model": "tts-1", "input": text, "voice": voice, "response_format": "pcm"}
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        if response.status_code != 200:
            raise _http_error(response.status_code, await response.aread())
        received = 0
        try:
            async for chunk in response.aiter_raw():
                received += len(chunk)
                if abandon and received:
                    return "abandoned"  # leaving the block closes the connection mid-stream
        except httpx.HTTPError as error:  # how a raw stream reports a failure after audio started
            raise ServerError("stream_aborted", f"after {received} bytes: {error!r}") from None
    want = 2 * expected_samples(text)
    if received != want:
        raise Broken("wrong_length", f"{received} bytes of PCM, want {want}")
    return "completed"


# ------------------------------------------------------------------ WebSocket


@dataclass
class LiveSocket:
    """One `vivace.speech.v1` socket: sends events, sorts what arrives by context and stream."""

    ws: ClientConnection
    streams: dict[str, int] = field(default_factory=dict)  # context_id -> stream
    audio: dict[int, int] = field(default_factory=dict)  # stream -> payload bytes
    last_seen: dict[int, bool] = field(default_factory=dict)  # stream -> its last frame arrived
    done: dict[str, dict[str, Any]] = field(default_factory=dict)
    cancelled: dict[str, int] = field(default_factory=dict)  # context_id -> audio bytes when confirmed
    errors: list[dict[str, Any]] = field(default_factory=list)

    async def send(self, **event: Any) -> None:
        try:
            await self.ws.send(orjson.dumps(event).decode())
        except ConnectionClosed as closed:
            raise await self._closed(closed) from None

    async def _closed(self, closed: ConnectionClosed) -> Exception:
        """The server closed the socket: read what it sent before (the error event that must precede a
        close it chooses) and make that a ServerError; Broken if no error came first."""
        with contextlib.suppress(ConnectionClosed, TimeoutError, Broken):
            while True:
                await self.receive(1.0)
        if self.errors:
            code = self.errors[-1]["error"]["code"]
            return ServerError(str(code), f"closed {closed.rcvd.code if closed.rcvd else ''}")
        return Broken("closed_without_error", repr(closed))

    async def receive(self, timeout_s: float) -> None:
        message = await asyncio.wait_for(self.ws.recv(), timeout_s)
        if isinstance(message, bytes):
            flags, stream = message[1], int.from_bytes(message[2:4], "little")
            if stream not in self.streams.values():
                raise Broken("audio_for_unknown_stream", str(stream))
            context = next(c for c, s in self.streams.items() if s == stream)
            if context in self.cancelled or context in self.done:
                raise Broken("audio_after_cancel_or_done", context)
            self.audio[stream] = self.audio.get(stream, 0) + len(message) - HEADER_BYTES
            self.last_seen[stream] = bool(flags & FLAG_LAST)
            return
        event = orjson.loads(message)
        kind, context = event.get("type"), event.get("context_id")
        if kind == "context.created":
            self.streams[context] = event["stream"]
        elif kind == "context.cancelled":
            self.cancelled[context] = self.audio.get(self.streams.get(context, -1), 0)
        elif kind == "context.done":
            self.done[context] = event
        elif kind == "error":
            error = event.get("error") or {}
            if not isinstance(error.get("code"), str) or not isinstance(error.get("message"), str):
                raise Broken("unstructured_error_event", str(event)[:200])
            self.errors.append(event)

    def audio_of(self, context: str) -> int:
        return self.audio.get(self.streams.get(context, -1), 0)

    async def until(self, check: Callable[[], bool], deadline: float) -> None:
        while not check():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Broken("no_answer", "timed out waiting for the server")
            try:
                await self.receive(remaining)
            except TimeoutError:
                raise Broken("no_answer", "timed out waiting for the server") from None
            except ConnectionClosed as closed:
                raise await self._closed(closed) from None


def first_error_code(sock: LiveSocket, context: str) -> str | None:
    for event in sock.errors:
        if event.get("context_id") in (context, None):
            return str(event["error"]["code"])
    return None


def _check_completed(sock: LiveSocket, context: str, text: str) -> str:
    done = sock.done[context]
    if done["reason"] == "error":
        code = first_error_code(sock, context)
        if code is None:
            raise Broken("error_done_without_error_event", context)
        raise ServerError(code)
    if done["reason"] != "completed":
        raise Broken("unexpected_done_reason", str(done))
    want = expected_samples(text)
    if done["samples"] != want or sock.audio_of(context) != 2 * want:
        raise Broken(
            "wrong_length", f"{context}: done {done['samples']}, audio {sock.audio_of(context) // 2}"
        )
    return "completed"


async def _stream_words(sock: LiveSocket, context: str, text: str, word_gap_s: float) -> None:
    words = text.split(" ")
    for i, word in enumerate(words):
        await sock.send(
            type="input_text.append", context_id=context, text=word + (" " if i < len(words) - 1 else "")
        )
        await asyncio.sleep(word_gap_s)
    await sock.send(type="input_text.end", context_id=context)


async def ws_multi(url: str, texts: list[str], deadline: float, word_gap_s: float = 0.02) -> str:
    async with connect(url, subprotocols=[PROTOCOL], max_size=None) as ws:  # type: ignore[list-item]
        sock = LiveSocket(ws)
        contexts = [f"c{i}" for i in range(len(texts))]
        senders = [
            asyncio.create_task(_stream_words(sock, c, t, word_gap_s))
            for c, t in zip(contexts, texts, strict=True)
        ]
        try:
            await sock.until(lambda: all(c in sock.done for c in contexts), deadline)
        finally:
            for task in senders:
                task.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
        results = [_check_completed(sock, c, t) for c, t in zip(contexts, texts, strict=True)]
        return results[0]


async def ws_interrupted(url: str, text: str, deadline: float, how: str, pause_s: float = 3.0) -> str:
    """One context, interrupted after its first audio: `cancel`, `disconnect` or `slow` (stop reading)."""
    async with connect(url, subprotocols=[PROTOCOL], max_size=None) as ws:  # type: ignore[list-item]
        sock = LiveSocket(ws)
        await sock.send(type="input_text.append", context_id="c", text=text)
        await sock.send(type="input_text.end", context_id="c")
        await sock.until(lambda: sock.audio_of("c") > 0 or "c" in sock.done, deadline)
        if "c" in sock.done:  # finished before the interruption could happen
            return _check_completed(sock, "c", text)
        if how == "disconnect":
            ws.transport.abort()  # no close handshake: a dropped connection
            return "abandoned"
        if how == "cancel":
            await sock.send(type="context.cancel", context_id="c")
            await sock.until(lambda: "c" in sock.done, deadline)
            reason = sock.done["c"]["reason"]
            if reason == "completed":
                return _check_completed(sock, "c", text)  # the cancel raced with the end
            if reason != "cancelled" or "c" not in sock.cancelled:
                raise Broken("cancel_not_confirmed", str(sock.done["c"]))
            return "cancelled"
        assert how == "slow", how
        await asyncio.sleep(pause_s)
        await sock.until(lambda: "c" in sock.done, deadline)
        return _check_completed(sock, "c", text)


# ------------------------------------------------------------------ running one client


async def run_client(kind: str, make: Callable[[], Awaitable[str]], timeout_s: float) -> Outcome:
    started = time.monotonic()
    try:
        result = await asyncio.wait_for(make(), timeout_s)
        return Outcome(kind, result, time.monotonic() - started)
    except ServerError as error:
        return Outcome(kind, f"error:{error.code}", time.monotonic() - started, error.detail)
    except InvalidStatus as refused:  # the WebSocket handshake was refused: with a structured body, clearly
        response = refused.response
        error = _http_error(response.status_code, bytes(response.body or b""))
        result = f"error:{error.code}" if isinstance(error, ServerError) else f"failed:{error.reason}"
        return Outcome(kind, result, time.monotonic() - started, f"handshake HTTP {response.status_code}")
    except Broken as broken:
        return Outcome(kind, f"failed:{broken.reason}", time.monotonic() - started, broken.detail)
    except TimeoutError:
        return Outcome(kind, "failed:no_answer", time.monotonic() - started, f"over {timeout_s} s")
    except (OSError, httpx.HTTPError, ConnectionClosed) as error:
        return Outcome(kind, "failed:connection", time.monotonic() - started, repr(error)[:300])
