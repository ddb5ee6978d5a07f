"""Tile sweep for `--codec-kernels fused-convs`: every vocoder conv + SnakeBeta of a codec step, timed with each tile
of a small grid against what the default fused decoder runs there (cuDNN's conv, then the SnakeBeta kernel).

    python tools/conv_snake_bench.py --shapes 1x1 8x4 8x25 --precision bf16 --out conv_snake_bench.json
    python tools/conv_snake_bench.py --dry-run      # tiny codec on the CPU: checks the script, times nothing real

For each (streams B, new frames N), one decode step of the channels-last decoder, with every stream past its
attention window, runs twice: with `triton_convs` (recording each `conv_snake` call) and without (recording each
conv + SnakeBeta it runs instead); both walk the same convs in the same order. Each distinct call is then timed
(CUDA-event median) with every tile and the baseline on the recorded tensors. Printed last, per shape: the step's
conv + SnakeBeta time with the default tile, with the best single tile, with each call's best tile, and the baseline;
then the tile that is best summed over every shape. The fifteenth session measured the default tile slower than the
baseline everywhere (docs/benchmarks.md); this says whether any tile is not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.codec.config import codec_preset  # noqa: E402
from engine.codec.stream import CodecStatePool, decode_incremental  # noqa: E402
from engine.codec.weights import random_codec  # noqa: E402
from engine.executors.codec import codec_dtype  # noqa: E402
from engine.fast import codec_fast  # noqa: E402
from engine.fast.codec_fast import FastCodecDecoder, precision_flags  # noqa: E402
from engine.fast.kernels.conv_snake import DEFAULT_TILE, ConvTile, conv_snake  # noqa: E402
from engine.fast.measure import cuda_median_ms  # noqa: E402

SEED = 1234
HISTORY = 72  # frames decoded before the measured step: every stream past the codec's attention window
TILES = [DEFAULT_TILE] + [ConvTile(m, n, k, w, s) for m, n, k, w, s in (
    (16, 32, 64, 2, 3), (16, 64, 64, 4, 3), (16, 128, 128, 4, 3), (32, 32, 128, 4, 2), (32, 64, 64, 4, 3),
    (32, 128, 64, 4, 4), (64, 32, 64, 2, 4), (64, 64, 32, 4, 4), (64, 64, 64, 4, 3), (128, 64, 64, 4, 3),
    (128, 128, 64, 8, 3),
)]  # fmt: skip


def _timer(device: str, repeats: int) -> Callable[[Callable[[], object]], float]:
    if device == "cuda":
        return lambda fn: cuda_median_ms(fn, repeats)

    def cpu_ms(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1000)
        return statistics.median(times)

    return cpu_ms


class _Recorder:
    """Records the convs one decode step runs: `conv_snake` calls (fused-convs) or `_conv_snake` calls (baseline)."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def __enter__(self) -> _Recorder:
        self._conv_snake, self._method = codec_fast.conv_snake, FastCodecDecoder._conv_snake
        recorder = self

        def fused(*args: Any, **kwargs: Any) -> Any:
            recorder.calls.append((args, kwargs))
            return self._conv_snake(*args, **kwargs)

        def method(decoder: FastCodecDecoder, *args: Any, **kwargs: Any) -> Any:
            if not decoder.triton_convs:
                recorder.calls.append(((decoder, *args), kwargs))
            return self._method(decoder, *args, **kwargs)

        codec_fast.conv_snake = fused
        FastCodecDecoder._conv_snake = method  # type: ignore[method-assign]
        return self

    def __exit__(self, *_: object) -> None:
        codec_fast.conv_snake = self._conv_snake
        FastCodecDecoder._conv_snake = self._method  # type: ignore[method-assign]


def _record(decoder: FastCodecDecoder, batch: int, frames: int, device: str) -> list[tuple[tuple, dict]]:
    """The conv calls of one step of `frames` new frames for `batch` streams that each decoded HISTORY frames."""
    gen = torch.Generator().manual_seed(SEED)
    codes = torch.randint(0, decoder.config.codebook_size, (batch, decoder.config.num_quantizers, HISTORY + frames),
                          generator=gen).to(device)  # fmt: skip
    pool = CodecStatePool(decoder.config, batch, device, decoder.dtype)
    slots = [pool.alloc() for _ in range(batch)]
    for start in range(0, HISTORY, 24):
        decode_incremental(decoder, pool, slots, codes[..., start : min(start + 24, HISTORY)], check_code_values=False)
    with _Recorder() as recorder:
        decode_incremental(decoder, pool, slots, codes[..., HISTORY:], check_code_values=False)
    return recorder.calls


def _key(args: tuple, kwargs: dict) -> tuple:
    x, taps, dilation = args[:3]
    return (tuple(x.shape), tuple(taps.shape), dilation, kwargs.get("bias") is not None,
            kwargs.get("residual") is not None, kwargs.get("sum_out") is not None)  # fmt: skip


def sweep_shape(fused: FastCodecDecoder, plain: FastCodecDecoder, batch: int, frames: int, device: str,
                repeats: int) -> dict[str, Any]:  # fmt: skip
    fused_calls = _record(fused, batch, frames, device)
    plain_calls = _record(plain, batch, frames, device)
    if len(fused_calls) != len(plain_calls):
        raise RuntimeError(f"the two decoders ran {len(fused_calls)} and {len(plain_calls)} convs")
    timer = _timer(device, repeats)
    calls: dict[tuple, dict[str, Any]] = {}
    for (args, kwargs), (plain_args, plain_kwargs) in zip(fused_calls, plain_calls, strict=True):
        key = _key(args, kwargs)
        if key in calls:
            calls[key]["count"] += 1
            continue
        with precision_flags(fused.precision):
            tiles = [timer(partial(conv_snake, *args, **kwargs, tile=tile)) for tile in TILES]  # kwargs hold tf32
            baseline = timer(partial(FastCodecDecoder._conv_snake, *plain_args, **plain_kwargs))
        x, taps = args[0], args[1]
        calls[key] = {"x": list(x.shape), "taps": list(taps.shape), "dilation": args[2], "count": 1,
                      "tile_ms": tiles, "baseline_ms": baseline}  # fmt: skip
    rows = list(calls.values())
    total = [sum(row["tile_ms"][i] * row["count"] for row in rows) for i in range(len(TILES))]
    best_single = min(range(len(TILES)), key=lambda i: total[i])
    return {
        "batch": batch, "frames": frames, "calls": rows, "tile_total_ms": total,
        "default_ms": total[0], "best_single": best_single, "best_single_ms": total[best_single],
        "best_per_call_ms": sum(min(row["tile_ms"]) * row["count"] for row in rows),
        "baseline_ms": sum(row["baseline_ms"] * row["count"] for row in rows),
    }  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("conv_snake_bench needs a CUDA GPU (or --dry-run)")
        torch.backends.cudnn.benchmark = True  # as the engine's codec graphs run (engine/fast/codec_graphs.py)
    codec = random_codec(codec_preset("tiny" if args.dry_run else "full"), device=device,
                         dtype=codec_dtype(args.precision), seed=SEED)  # fmt: skip
    fused = FastCodecDecoder(codec, args.precision, fused_attention=True, channels_last=True, triton_convs=True)
    plain = FastCodecDecoder(codec, args.precision, fused_attention=True, channels_last=True)
    shapes = []
    for text in args.shapes:
        batch, frames = (int(v) for v in text.split("x"))
        shapes.append(sweep_shape(fused, plain, batch, frames, device, args.repeats))
        s = shapes[-1]
        print(f"{batch} x {frames}: default {s['default_ms']:.3f} ms, best tile {s['best_single']} "
              f"{s['best_single_ms']:.3f}, per call {s['best_per_call_ms']:.3f}, baseline {s['baseline_ms']:.3f}",
              flush=True)  # fmt: skip
    overall = [sum(s["tile_total_ms"][i] for s in shapes) for i in range(len(TILES))]
    best = min(range(len(TILES)), key=lambda i: overall[i])
    return {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "precision": args.precision,
            "tiles": [vars_of(t) for t in TILES], "shapes": shapes, "best_tile_overall": best,
            "overall_ms": overall}  # fmt: skip


def vars_of(tile: ConvTile) -> dict[str, Any]:
    return {name: getattr(tile, name) for name in ConvTile.__slots__}


def summary(result: dict[str, Any]) -> str:
    lines = [f"conv + SnakeBeta per codec step, {result['precision']}, {result['device']} (ms):",
             "| B x N | default tile | best single tile | best tile per call | cuDNN conv + SnakeBeta |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for s in result["shapes"]:
        lines.append(f"| {s['batch']} x {s['frames']} | {s['default_ms']:.3f} | {s['best_single_ms']:.3f} "
                     f"(tile {s['best_single']}) | {s['best_per_call_ms']:.3f} | {s['baseline_ms']:.3f} |")  # fmt: skip
    best = result["best_tile_overall"]
    lines.append(f"best tile over every shape: {best} {result['tiles'][best]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["1x1", "8x4", "8x25"], help="BxN: streams x new frames")
    parser.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "bf16"])
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per median")
    parser.add_argument("--out", type=Path, default=None, help="write every timing as JSON here")
    parser.add_argument("--dry-run", action="store_true", help="tiny codec on the CPU: checks the script only")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.repeats = min(args.repeats, 2)
    result = run(args)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))
    print(summary(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
