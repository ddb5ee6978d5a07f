"""A stand-in for `python -m gateway` that speaks `vivace.speech.v1` with synthetic audio, for
developing and testing web/ without the engine. It is NOT the product: the browser test runs the
real gateway when it is available (see conftest.py) and this server only when told to.

What it does, in the protocol's terms:
- serves web/ at `/`, answers `GET /ready` 200, and accepts `/v1/audio/speech/live` with the
  `vivace.speech.v1` subprotocol;
- `session.created` announces a model with random weights (the audio is a synthetic tone);
- each context turns its stable text (up to the last whitespace, or all of it after
  `input_text.end`) into 80 ms frames, about 14 characters per second of audio, generated
  8x faster than real time; PCM16 frames carry one 1,920-sample frame, Opus frames one 20 ms packet
  (24 kHz input, `pre_skip` = encoder lookahead, zero padding to flush the tail);
- records every `playback.position` and `context.cancel` it receives; `GET /_standin/received`
  returns them so tests can compare what the server got with what the page played.

Run: python -m tests.browser.standin_server --port 8123
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

PROTOCOL = "vivace.speech.v1"
SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920  # one codec frame: 80 ms
OPUS_PACKET_SAMPLES = 480  # 20 ms at 24 kHz
CHARS_PER_FRAME = 14 * 0.08  # about 14 characters per second of speech
FRAME_INTERVAL_S = 0.08 / 8  # generate 8x faster than real time
HEADER = struct.Struct("<BBHII")
VOICES = ["aiden", "dylan", "eric", "ono_anna", "ryan", "serena", "sohee", "uncle_fu", "vivian"]
LANGUAGES = ["auto", "chinese", "english", "french", "german", "italian", "japanese", "korean", "portuguese",
             "russian", "spanish"]  # fmt: skip
WEB_DIR = Path(__file__).resolve().parents[2] / "web"

RECEIVED: list[dict[str, Any]] = []  # playback.position and context.cancel events, all sessions


def tone(start_sample: int, count: int) -> bytes:
    """A quiet two-partial tone: deterministic, clearly audible, easy to check after Opus."""
    t = (np.arange(start_sample, start_sample + count) / SAMPLE_RATE).astype(np.float64)
    wave = 0.25 * np.sin(2 * np.pi * 220.0 * t) + 0.1 * np.sin(2 * np.pi * 330.0 * t)
    return (wave * 32767).astype("<i2").tobytes()


@dataclass
class Context:
    context_id: str
    stream: int
    audio_format: str
    text: str = ""
    ended: bool = False
    frames_made: int = 0
    samples_sent: int = 0
    sequence: int = 0
    done: bool = False
    cancelled: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    encoder: Any = None
    pre_skip: int = 0
    pending_pcm: bytes = b""

    def frames_due(self) -> int:
        stable = self.text if self.ended else self.text[: max(self.text.rfind(" "), 0)]
        return math.ceil(len(stable.strip()) / CHARS_PER_FRAME) if stable.strip() else 0


class Session:
    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.contexts: dict[str, Context] = {}
        self.streams = itertools.count(1)
        self.default_format = "pcm16"
        self.send_lock = asyncio.Lock()

    async def send_event(self, event: dict[str, Any]) -> None:
        async with self.send_lock:
            await self.ws.send_text(orjson.dumps(event).decode())

    async def send_frame(self, ctx: Context, payload: bytes, start_sample: int, last: bool) -> None:
        flags = (1 if ctx.sequence == 0 else 0) | (2 if last else 0)
        async with self.send_lock:
            await self.ws.send_bytes(HEADER.pack(1, flags, ctx.stream, ctx.sequence, start_sample) + payload)
        ctx.sequence += 1

    async def error(self, code: str, message: str, context_id: str | None = None) -> None:
        event: dict[str, Any] = {"type": "error", "error": {"type": "invalid_request_error", "code": code,
                                                           "message": message}}  # fmt: skip
        if context_id is not None:
            event["context_id"] = context_id
        await self.send_event(event)

    async def create(self, context_id: str, audio_format: str | None) -> Context:
        ctx = Context(context_id, next(self.streams), audio_format or self.default_format)
        audio: dict[str, Any] = {"format": ctx.audio_format, "sample_rate": SAMPLE_RATE, "channels": 1}
        if ctx.audio_format == "opus":
            import opuslib

            ctx.encoder = opuslib.Encoder(SAMPLE_RATE, 1, opuslib.APPLICATION_AUDIO)
            ctx.encoder.bitrate = 32000
            ctx.pre_skip = int(ctx.encoder.lookahead)
            audio |= {"samples_per_packet": OPUS_PACKET_SAMPLES, "pre_skip": ctx.pre_skip}
        else:
            audio |= {"samples_per_packet": FRAME_SAMPLES}
        self.contexts[context_id] = ctx
        await self.send_event({"type": "context.created", "context_id": context_id, "stream": ctx.stream,
                               "audio": audio})  # fmt: skip
        ctx.task = asyncio.create_task(self.generate(ctx))
        return ctx

    async def generate(self, ctx: Context) -> None:
        while not ctx.cancelled:
            if ctx.frames_made < ctx.frames_due():
                start = ctx.frames_made * FRAME_SAMPLES
                pcm = tone(start, FRAME_SAMPLES)
                ctx.frames_made += 1
                final = ctx.ended and ctx.frames_made >= ctx.frames_due()
                await self.publish(ctx, pcm, start, final)
                await asyncio.sleep(FRAME_INTERVAL_S)
                continue
            if ctx.ended:
                if ctx.frames_made == 0:
                    await self.publish(ctx, b"", 0, True)
                break
            ctx.wake.clear()
            await ctx.wake.wait()
        if not ctx.cancelled:
            ctx.done = True
            await self.send_event({"type": "context.done", "context_id": ctx.context_id, "reason": "completed",
                                   "samples": ctx.samples_sent})  # fmt: skip

    async def publish(self, ctx: Context, pcm: bytes, start: int, final: bool) -> None:
        if ctx.audio_format == "pcm16":
            if pcm or final:
                await self.send_frame(ctx, pcm, start, final)
            ctx.samples_sent += len(pcm) // 2
            return
        ctx.pending_pcm += pcm
        ctx.samples_sent += len(pcm) // 2
        if final:
            # Push the encoder's lookahead out with zeros: decoded length >= pre_skip + samples.
            packets = max(1, math.ceil((ctx.samples_sent + ctx.pre_skip) / OPUS_PACKET_SAMPLES))
            target_bytes = (packets - ctx.sequence) * OPUS_PACKET_SAMPLES * 2
            ctx.pending_pcm += b"\0" * (target_bytes - len(ctx.pending_pcm))
        step = OPUS_PACKET_SAMPLES * 2
        while len(ctx.pending_pcm) >= step:
            chunk, ctx.pending_pcm = ctx.pending_pcm[:step], ctx.pending_pcm[step:]
            packet = ctx.encoder.encode(chunk, OPUS_PACKET_SAMPLES)
            last = final and len(ctx.pending_pcm) < step
            await self.send_frame(ctx, packet, ctx.sequence * OPUS_PACKET_SAMPLES, last)

    async def handle(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        cid = event.get("context_id")
        if kind == "ping":
            await self.send_event({"type": "pong", "id": event.get("id"), "client_time_ms": event.get("client_time_ms"),
                                   "server_time_ms": time.time() * 1000})  # fmt: skip
        elif kind == "session.update":
            fmt = (event.get("audio") or {}).get("format")
            if fmt:
                self.default_format = fmt
            await self.send_event({"type": "session.updated"})
        elif kind == "context.create":
            if cid in self.contexts:
                await self.error("context_exists", f"context {cid!r} exists", cid)
            else:
                await self.create(cid, (event.get("audio") or {}).get("format"))
        elif kind in ("input_text.append", "input_text.end", "input_text.flush"):
            ctx = self.contexts.get(cid) or await self.create(cid, None)
            if kind == "input_text.append":
                ctx.text += event.get("text", "")
            elif kind == "input_text.end":
                ctx.ended = True
            ctx.wake.set()
        elif kind == "playback.position":
            RECEIVED.append(event)
        elif kind == "context.cancel":
            RECEIVED.append(event)
            ctx = self.contexts.get(cid)
            if ctx is None or ctx.done or ctx.cancelled:
                await self.error("unknown_context", f"no live context {cid!r}", cid)
                return
            ctx.cancelled = True
            ctx.wake.set()
            await self.send_event({"type": "context.cancelled", "context_id": cid, "samples_sent": ctx.samples_sent,
                                   "heard_samples": event.get("heard_samples")})  # fmt: skip
            await self.send_event({"type": "context.done", "context_id": cid, "reason": "cancelled",
                                   "samples": ctx.samples_sent})  # fmt: skip
        else:
            await self.error("unknown_event_type", f"unknown event type {kind!r}")


async def live(ws: WebSocket) -> None:
    if PROTOCOL not in ws.scope.get("subprotocols", []):
        await ws.close(code=1002)
        return
    await ws.accept(subprotocol=PROTOCOL)
    session = Session(ws)
    await session.send_event({
        "type": "session.created", "session_id": f"standin-{id(session):x}", "protocol": PROTOCOL,
        "audio": {"format": "pcm16", "sample_rate": SAMPLE_RATE, "channels": 1},
        "model": {"id": "standin-tone", "random_weights": True},
        "voices": VOICES, "languages": LANGUAGES, "limits": {"max_contexts": 8},
    })  # fmt: skip
    try:
        while True:
            text = await ws.receive_text()
            await session.handle(orjson.loads(text))
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        for ctx in session.contexts.values():
            ctx.cancelled = True
            if ctx.task:
                ctx.task.cancel()


async def ready(_: Request) -> PlainTextResponse:
    return PlainTextResponse("ready")


async def received(_: Request) -> JSONResponse:
    return JSONResponse(RECEIVED)


app = Starlette(routes=[
    Route("/ready", ready),
    Route("/_standin/received", received),
    WebSocketRoute("/v1/audio/speech/live", live),
    Mount("/", StaticFiles(directory=WEB_DIR, html=True)),
])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", ws="websockets")


if __name__ == "__main__":
    main()
