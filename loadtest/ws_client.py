"""WebSocket transport: Vivace's native protocol `vivace.speech.v1`, text streamed like an LLM.

One socket per request. Sequence (time zero = just before the first append, so the handshake,
`session.created` and `context.create` are reported separately as `connect`):

    client                                   server
    ── connect (subprotocol vivace.speech.v1) ─▶
    ◀─────────────────────────── session.created
    ── context.create {context_id, voice} ────▶
    ── input_text.append " word" every N ms ──▶   (time zero at the first)
    ── input_text.end ────────────────────────▶
    ◀──── context.created {stream}, binary audio frames, context.done
    ── playback.position every 200 ms ────────▶   (optional, simulating a real player)

Binary frame: 12-byte little-endian header, then PCM16 samples:

    byte 0      1      2..3     4..7        8..11
         version flags stream   sequence    start_sample      flags: bit 0 first, bit 1 last
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Subprotocol

from loadtest.trace import RequestFailed, StreamTrace

PROTOCOL = "vivace.speech.v1"
LIVE_PATH = "/v1/audio/speech/live"
HEADER = struct.Struct("<BBHII")  # version, flags, stream, sequence, start_sample
FRAME_VERSION = 1

_context_ids = itertools.count()


def split_words(text: str) -> list[str]:
    """LLM-like pieces: each word with its leading whitespace; joined they give the text, right-stripped."""
    return re.findall(r"\s*\S+", text)


def live_url(base_url: str) -> str:
    """http(s)://host:port[/prefix] -> ws(s)://host:port[/prefix]/v1/audio/speech/live (ws URLs kept)."""
    url = base_url.rstrip("/")
    if url.startswith(("ws://", "wss://")):
        return url if url.endswith(LIVE_PATH) else url + LIVE_PATH
    if url.startswith("https://"):
        return "wss://" + url.removeprefix("https://") + LIVE_PATH
    if url.startswith("http://"):
        return "ws://" + url.removeprefix("http://") + LIVE_PATH
    raise ValueError(f"URL must start with http://, https://, ws:// or wss://: {base_url!r}")


class WsSpeechClient:
    """`websockets` implementation (`--client library`)."""

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
        self.url = live_url(base_url)
        self.max_lead_ms = max_lead_ms
        self.voice = voice
        self.language = language
        self.sample_rate = sample_rate
        self.word_interval_s = word_interval_s
        self.playback_report_s = playback_report_s
        self.timeout_s = timeout_s
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else None

    async def close(self) -> None:
        """Nothing pooled: each request owns its socket."""

    async def synthesize(self, text: str, trace: StreamTrace) -> None:
        context_id = new_context_id()
        try:
            async with connect(
                self.url,
                subprotocols=[Subprotocol(PROTOCOL)],
                additional_headers=self.headers,
                compression=None,
                open_timeout=self.timeout_s,
                max_size=2**24,
                ping_interval=None,  # request lifetimes are bounded by the run's own timeout
            ) as ws:
                await self._converse(ws, context_id, text, trace)
        except InvalidStatus as exc:
            raise RequestFailed(f"http_{exc.response.status_code}", "WebSocket handshake refused") from None
        except InvalidHandshake as exc:
            raise RequestFailed("protocol", f"WebSocket handshake failed: {exc}") from None
        except ConnectionClosed as exc:
            raise RequestFailed("ws_closed", f"socket closed before context.done ({exc})") from None
        except TimeoutError:
            raise RequestFailed("timeout", "WebSocket opening handshake timed out") from None
        except OSError as exc:
            raise RequestFailed("connect", f"{type(exc).__name__}: {exc}") from None

    async def _converse(self, ws: ClientConnection, context_id: str, text: str, trace: StreamTrace) -> None:
        if ws.subprotocol != PROTOCOL:
            raise RequestFailed(
                "protocol", f"server negotiated subprotocol {ws.subprotocol!r}, not {PROTOCOL}"
            )
        check_session(await _receive_event(ws), self.sample_rate)
        trace.setup_done = time.monotonic()
        if self.max_lead_ms is not None:
            await ws.send(session_update_pacing(self.max_lead_ms))
        await ws.send(context_create(context_id, self.voice, self.language))

        trace.dispatch = time.monotonic()
        helpers = [asyncio.create_task(self._send_text(ws, context_id, text, trace))]
        if self.playback_report_s:
            helpers.append(asyncio.create_task(self._report_playback(ws, context_id, trace)))
        try:
            await self._receive_audio(ws, context_id, trace, helpers[0])
        finally:
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)

    async def _send_text(self, ws: ClientConnection, context_id: str, text: str, trace: StreamTrace) -> None:
        async for event in paced_input(context_id, text, self.word_interval_s, trace):
            await ws.send(event)
        trace.input_last = time.monotonic()

    async def _report_playback(self, ws: ClientConnection, context_id: str, trace: StreamTrace) -> None:
        assert self.playback_report_s is not None
        async for report in playback_reports(context_id, trace, self.playback_report_s):
            await ws.send(report)
            trace.reports_sent += 1

    async def _receive_audio(
        self, ws: ClientConnection, context_id: str, trace: StreamTrace, sender: asyncio.Task[None]
    ) -> None:
        reader = LiveContextReader(context_id, trace)
        async for message in ws:
            if sender.done() and not sender.cancelled() and sender.exception() is not None:
                raise sender.exception()  # type: ignore[misc]
            if isinstance(message, bytes):
                reader.binary(message, time.monotonic())
            elif reader.event(parse_event(message), time.monotonic()):
                return
        raise RequestFailed("ws_closed", f"socket closed before context.done (code {ws.close_code})")


class LiveContextReader:
    """Checks and records what the server sends for one context; shared by both WS implementations."""

    def __init__(self, context_id: str, trace: StreamTrace) -> None:
        self.context_id, self.trace = context_id, trace
        self.stream: int | None = None
        self.next_sequence: int | None = None

    def binary(self, message: bytes, now: float) -> None:
        trace = self.trace
        if len(message) < HEADER.size:
            raise RequestFailed("protocol", f"binary frame of {len(message)} bytes, shorter than the header")
        version, _flags, stream, sequence, start_sample = HEADER.unpack_from(message)
        if version != FRAME_VERSION or self.stream is None or stream != self.stream:
            raise RequestFailed(
                "protocol", f"unexpected frame (version {version}, stream {stream}; ours {self.stream})"
            )
        if self.next_sequence is not None and sequence != self.next_sequence:
            raise RequestFailed("protocol", f"sequence {sequence}, expected {self.next_sequence}")
        if start_sample != trace.samples:
            raise RequestFailed("protocol", f"start_sample {start_sample}, but {trace.samples} received")
        self.next_sequence = sequence + 1
        trace.audio(memoryview(message)[HEADER.size :], now)

    def event(self, event: dict[str, Any], now: float) -> bool:
        """Handle a JSON event; True once the context is complete."""
        kind = event.get("type")
        if kind == "error":
            error = event.get("error") or {}
            code = error.get("code") or error.get("type") or "error"
            raise RequestFailed(f"ws_{code}", str(error.get("message")))
        if event.get("context_id") != self.context_id:
            return False  # session-level events we do not need (pong, session.updated, ...)
        if kind == "context.created":
            self.stream = _check_context_audio(event, self.trace.sample_rate)
        elif kind == "context.done":
            self.trace.end = now
            reason = event.get("reason")
            if reason != "completed":
                raise RequestFailed(f"done_{reason}", f"context ended with reason {reason!r}")
            if event.get("samples", self.trace.samples) != self.trace.samples:
                raise RequestFailed(
                    "protocol",
                    f"context.done says {event.get('samples')} samples, {self.trace.samples} received",
                )
            return True
        return False


def check_session(event: dict[str, Any], sample_rate: int) -> None:
    """Raise unless `event` is a session.created compatible with the run."""
    if event.get("type") != "session.created":
        raise RequestFailed("protocol", f"expected session.created, got {event.get('type')!r}")
    rate = (event.get("audio") or {}).get("sample_rate", sample_rate)
    if rate != sample_rate:
        raise RequestFailed("protocol", f"session sample_rate {rate} but the run expects {sample_rate}")


def context_create(context_id: str, voice: str, language: str | None) -> str:
    create: dict[str, Any] = {"type": "context.create", "context_id": context_id, "voice": voice}
    if language:
        create["language"] = language
    return json.dumps(create)


def session_update_pacing(max_lead_ms: int) -> str:
    """`session.update` asking the server to pace contexts created afterwards (`--max-lead-ms`)."""
    return json.dumps({"type": "session.update", "max_lead_ms": max_lead_ms})


def append_event(context_id: str, text: str) -> str:
    return json.dumps({"type": "input_text.append", "context_id": context_id, "text": text})


def end_event(context_id: str) -> str:
    return json.dumps({"type": "input_text.end", "context_id": context_id})


def playback_report(context_id: str, trace: StreamTrace, now: float) -> str:
    """The simulated player's position, as a browser would send it."""
    played = trace.playback.played_samples(now)
    return json.dumps(
        {
            "type": "playback.position",
            "context_id": context_id,
            "played_samples": played,
            "buffered_samples": trace.playback.total_samples - played,
            "underruns": trace.playback.underruns,
            "client_time_ms": now * 1000.0,
        }
    )


async def paced_input(
    context_id: str, text: str, word_interval_s: float, trace: StreamTrace
) -> AsyncIterator[str]:
    """The input events to send, each when it is due: the text word by word on an absolute cadence from
    time zero (`trace.dispatch`, so a late send never drifts the schedule; the whole text in one append
    when the interval is 0), then `input_text.end`."""
    assert trace.dispatch is not None
    pieces = split_words(text) if word_interval_s > 0 else [text]
    for i, piece in enumerate(pieces):
        delay = trace.dispatch + i * word_interval_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        yield append_event(context_id, piece)
    yield end_event(context_id)


async def playback_reports(context_id: str, trace: StreamTrace, interval_s: float) -> AsyncIterator[str]:
    """Every `interval_s` once audio plays, the simulated player's playback.position report, forever."""
    while True:
        await asyncio.sleep(interval_s)
        if trace.playback.started:
            yield playback_report(context_id, trace, time.monotonic())


def new_context_id() -> str:
    return f"lt-{next(_context_ids)}"


def parse_event(message: str) -> dict[str, Any]:
    try:
        event = json.loads(message)
    except json.JSONDecodeError:
        raise RequestFailed("protocol", f"text frame is not JSON: {message[:80]!r}") from None
    if not isinstance(event, dict):
        raise RequestFailed("protocol", f"text frame is not a JSON object: {message[:80]!r}")
    return event


async def _receive_event(ws: ClientConnection) -> dict[str, Any]:
    message = await ws.recv()
    if isinstance(message, bytes):
        raise RequestFailed("protocol", "binary frame before session.created")
    return parse_event(message)


def _check_context_audio(event: dict[str, Any], sample_rate: int) -> int:
    """The stream number of a context.created event whose audio is PCM16 mono at the run's rate."""
    audio = event.get("audio") or {}
    shape = (audio.get("format", "pcm16"), audio.get("sample_rate", sample_rate), audio.get("channels", 1))
    if shape != ("pcm16", sample_rate, 1):
        raise RequestFailed("protocol", f"context audio {shape}, expected ('pcm16', {sample_rate}, 1)")
    stream = event.get("stream")
    if not isinstance(stream, int):
        raise RequestFailed("protocol", f"context.created without an integer stream: {stream!r}")
    return stream
