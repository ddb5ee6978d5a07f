"""Start a real engine process on the GPU (full-size dummy weights, default settings), then time first audio.

    python tools/gpu_smoke.py --model 1.7b --requests 8 [--timeout 150]

Prints the engine's start-up time (load, graph capture, warm-up: the control socket appears only
once it is ready), then submits requests at once through the shared-memory link and prints, per
request, time to first audio and total audio, and the GPU memory in use. Needs only torch-free
stdlib on the client side; the engine is `python -m engine`.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import time

from engine.ipc.client import EngineLink
from engine.ipc.messages import Audio, Done, EndText, Error, Submit
from engine.ipc.process import spawn_engine, wait_for_socket_async
from engine.text.tokenizer import TextTokenizer

TEXTS = [
    "Please call Stella and ask her to bring these things with her from the store.",
    "The quick brown fox jumps over the lazy dog while the band plays on.",
    "A realtime voice should start speaking within a few tens of milliseconds.",
    "Streaming text arrives word by word from a language model somewhere far away.",
]


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="1.7b")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=150.0)
    ap.add_argument("engine_args", nargs="*")
    args = ap.parse_args()
    socket = f"@vivace-gpu-smoke-{time.monotonic_ns()}"
    argv = [
        sys.executable,
        "-m",
        "engine",
        "--model",
        args.model,
        "--load-format",
        "dummy",
        "--device",
        "cuda",
        *args.engine_args,
    ]
    started = time.monotonic()
    proc = spawn_engine(argv, socket)
    try:
        await wait_for_socket_async(socket, args.timeout, proc=proc)
        print(f"engine ready after {time.monotonic() - started:.1f} s (load + capture + warm-up)", flush=True)
        link = await EngineLink.connect(socket)
        await asyncio.wait_for(link.ready.wait(), 10)
        tokenizer = TextTokenizer.fallback()
        results = await asyncio.gather(
            *(one(link, i + 1, TEXTS[i % len(TEXTS)], tokenizer) for i in range(args.requests))
        )
        for rid, ttfa_ms, samples, error in results:
            print(
                f"request {rid}: first audio {ttfa_ms:7.1f} ms, audio {samples / 24000:5.2f} s {error or ''}"
            )
        if shutil.which("nvidia-smi"):
            query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"]
            print("GPU memory used:", subprocess.run(query, capture_output=True, text=True).stdout.strip())
        await link.close()
        return 0 if all(r[3] is None for r in results) else 1
    finally:
        proc.terminate()
        proc.wait(30)


async def one(
    link: EngineLink, rid: int, text: str, tokenizer: TextTokenizer
) -> tuple[int, float, int, str | None]:
    queue = link.subscribe(rid)
    t0 = time.monotonic_ns()
    link.send(
        Submit(
            rid,
            "ryan",
            "english",
            tuple(tokenizer.target_ids(text)),
            len(text),
            True,
            seed=rid,
            arrival_ns=t0,
        )
    )
    link.send(EndText(rid))
    first: float | None = None
    samples = 0
    while True:
        msg = await asyncio.wait_for(queue.get(), 120)
        if isinstance(msg, Audio):
            if first is None:
                first = (time.monotonic_ns() - t0) / 1e6
            samples += len(msg.pcm) // 2
        elif isinstance(msg, Error):
            return rid, first or -1.0, samples, f"error {msg.code}: {msg.message}"
        elif isinstance(msg, Done):
            return rid, first or -1.0, samples, None


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
