"""Gateway overhead benchmark: socket-in to socket-out latency with a fake engine that answers at once.

    python tools/bench_gateway.py [--streams 500] [--duration 20] [--period 1.0] [--chars 14] [--url WS_URL]

Starts `python -m gateway --fake-engine` (unless --url points at a running one), opens `--streams`
WebSocket sessions, and in each one streams text like an LLM: every `--period` seconds (phases
spread evenly) one `input_text.append` of `--chars` characters followed by `input_text.flush`, on
one long-lived context per stream. The fake engine (engine.ipc.fake_engine, `--ms-per-frame 0`)
turns each append into audio at once (12.5 frames per 14 characters), so the time from sending an
append to receiving the first audio frame it caused is the whole round trip: client socket ->
gateway (parse, tokenize, ring) -> engine turnaround -> gateway (route, frame, send) -> client socket.
It includes the fake engine's own turnaround and this client's event-loop delay, so it is an upper
bound of the gateway's share. A second figure, append+flush -> `context.flushed`, is the gateway
alone (socket in, parse, tokenize, ring write, event out), with no engine in the path.
Prints the configuration and the raw numbers; `--json` saves them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
from websockets.asyncio.client import connect

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gateway.protocol import PROTOCOL  # noqa: E402

WORD_CHARS = "abcdefghijklmnopqrstuvwxyz"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_gateway(port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "gateway", "--model", "tiny", "--fake-engine", "--port", str(port),
           "--log-level", "warning", "--engine-arg=--ms-per-frame=0", "--limit=max_contexts=8"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("gateway did not become ready")


def text_piece(chars: int, index: int) -> str:
    word = WORD_CHARS[index % 26] * (chars - 1)
    return word + " "


async def run_stream(url: str, stream_index: int, args: argparse.Namespace, start_at: float,
                     latencies: list[float], event_latencies: list[float], errors: list[str]) -> None:  # fmt: skip
    loop = asyncio.get_running_loop()
    async with connect(url, subprotocols=[PROTOCOL], max_size=None, compression=None) as ws:
        await ws.recv()  # session.created
        sent_at: float | None = None
        event_sent_at: float | None = None
        stop_at = start_at + args.duration
        next_send = start_at + args.period * stream_index / args.streams
        context = "ctx"

        async def reader() -> None:
            nonlocal sent_at, event_sent_at
            async for message in ws:
                if isinstance(message, bytes):
                    if sent_at is not None:
                        latencies.append(loop.time() - sent_at)
                        sent_at = None
                elif '"context.flushed"' in message:
                    if event_sent_at is not None:
                        event_latencies.append(loop.time() - event_sent_at)
                        event_sent_at = None
                elif '"type":"error"' in message:
                    errors.append(message)

        task = asyncio.create_task(reader())
        index = 0
        while True:
            now = loop.time()
            if next_send >= stop_at:
                break
            await asyncio.sleep(max(0.0, next_send - now))
            if sent_at is not None:
                errors.append("previous append still unanswered after one period")
            append = {
                "type": "input_text.append",
                "context_id": context,
                "text": text_piece(args.chars, index),
            }
            sent_at = event_sent_at = loop.time()
            await ws.send(orjson.dumps(append).decode())
            await ws.send(orjson.dumps({"type": "input_text.flush", "context_id": context}).decode())
            index += 1
            next_send += args.period
        await asyncio.sleep(min(1.0, args.period))
        task.cancel()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def bench(url: str, args: argparse.Namespace) -> dict[str, object]:
    latencies: list[float] = []
    event_latencies: list[float] = []
    errors: list[str] = []
    loop = asyncio.get_running_loop()
    start_at = loop.time() + 2.0 + args.streams / 500  # time to open every socket first
    await asyncio.gather(
        *(run_stream(url, i, args, start_at, latencies, event_latencies, errors) for i in range(args.streams))
    )
    return {
        "errors": len(errors),
        "first_errors": errors[:3],
        # append -> first audio frame: gateway in, engine ring, fake engine, engine ring, gateway out
        "audio": summary(latencies[args.streams :]),  # the first round warms every context up
        # append+flush -> context.flushed: the gateway alone (parse, tokenize, ring write, event out)
        "gateway_only": summary(event_latencies[args.streams :]),
    }


def summary(seconds: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in seconds]
    return {
        "samples": len(ms),
        "p50_ms": percentile(ms, 0.50),
        "p90_ms": percentile(ms, 0.90),
        "p99_ms": percentile(ms, 0.99),
        "max_ms": max(ms),
        "mean_ms": statistics.fmean(ms),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of measured streaming")
    parser.add_argument("--period", type=float, default=1.0, help="seconds between appends of one stream")
    parser.add_argument(
        "--chars", type=int, default=14, help="characters per append (14 = 12.5 frames of audio)"
    )
    parser.add_argument("--url", help="an already running gateway's WebSocket URL (default: start one)")
    parser.add_argument("--json", type=Path, help="write configuration and results here")
    args = parser.parse_args()
    proc = None
    url = args.url
    if url is None:
        port = _free_port()
        proc = start_gateway(port)
        url = f"ws://127.0.0.1:{port}/v1/audio/speech/live"
    config = {
        "streams": args.streams, "duration_s": args.duration, "period_s": args.period, "chars": args.chars,
        "appends_per_s": args.streams / args.period, "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "python": platform.python_version(), "url": url,
    }  # fmt: skip
    print("config:", json.dumps(config))
    try:
        results = asyncio.run(bench(url, args))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    print("results:", json.dumps(results))
    if args.json:
        args.json.write_text(json.dumps({"config": config, "results": results}, indent=2))


if __name__ == "__main__":
    main()
