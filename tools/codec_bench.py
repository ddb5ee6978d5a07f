"""`python tools/codec_bench.py`: time one incremental codec step per (batch, frames) shape, eager and graphed.

Every stream carries state from real history (past the 72-frame window), so the step is the shape a streaming
engine runs. Prints one JSON line per shape (milliseconds per call, frames per second) for the cost model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.codec.config import codec_preset  # noqa: E402
from engine.codec.model import CodecDecoder  # noqa: E402
from engine.codec.stream import CodecStatePool, decode_incremental  # noqa: E402
from engine.codec.weights import random_codec  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _timed(fn, repeats: int, device: torch.device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - start) * 1000 / repeats


@torch.no_grad()
def bench_shape(decoder: CodecDecoder, batch: int, frames: int, repeats: int) -> dict:
    device = decoder.device
    pool = CodecStatePool(decoder.config, batch, device, decoder.dtype)
    slots = [pool.alloc() for _ in range(batch)]
    history = torch.randint(
        0, decoder.config.codebook_size, (batch, 16, decoder.config.sliding_window), device=device
    )
    decode_incremental(decoder, pool, slots, history, check_code_values=False)
    codes = torch.randint(0, decoder.config.codebook_size, (batch, 16, frames), device=device)
    positions, state = pool.gather(torch.tensor(slots, device=device))
    step = lambda: decoder.forward_stream(codes, positions, state)  # noqa: E731 (state stays put: steady shape)
    for _ in range(2):
        step()
    result = {"batch": batch, "frames": frames, "eager_ms": round(_timed(step, repeats, device), 3)}
    if device.type == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        result["graph_ms"] = round(_timed(graph.replay, repeats, device), 3)
    best = result.get("graph_ms", result["eager_ms"])
    result["frames_per_s"] = round(batch * frames * 1000 / best)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python tools/codec_bench.py", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="full", choices=["full", "tiny"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--frames", default="1,4,12")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    decoder = random_codec(codec_preset(args.preset), device=args.device, dtype=DTYPES[args.dtype])
    config = {
        "preset": args.preset,
        "device": str(decoder.device),
        "dtype": args.dtype,
        "torch": torch.__version__,
    }
    if decoder.device.type == "cuda":
        config |= {"gpu": torch.cuda.get_device_name(), "cudnn_tf32": torch.backends.cudnn.allow_tf32}
    print(json.dumps(config))
    for batch in (int(b) for b in args.batches.split(",")):
        for frames in (int(f) for f in args.frames.split(",")):
            print(json.dumps(bench_shape(decoder, batch, frames, args.repeats)), flush=True)


if __name__ == "__main__":
    main()
