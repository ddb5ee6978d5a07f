"""Tile sweep for `--codec-kernels fused-convs`: every vocoder conv + SnakeBeta of a codec step, timed per call as a
captured step pays for it (inside a CUDA graph), with each tile of a small grid against what the default fused
decoder runs there (cuDNN's conv, then the SnakeBeta kernel).

    python tools/conv_snake_bench.py --shapes 1x1 8x4 8x25 --precision bf16 --out conv_snake_bench.json
    python tools/conv_snake_bench.py --dry-run      # tiny codec on the CPU: checks the script, times nothing real

For each (streams B, new frames N), one decode step of the channels-last decoder, with every stream past its
attention window, runs twice: with `triton_convs` (recording each `conv_snake` call) and without (recording each
conv + SnakeBeta it runs instead); both walk the same convs in the same order. Each distinct call is then timed on
the recorded tensors with every tile and the baseline: run eagerly on a side stream first (Triton compiles; cuDNN
has timed its algorithms in benchmark mode while the step was recorded, as the engine's codec graphs' warm-ups do),
checked replay-safe (below), captured `--calls-per-graph` times back to back into one CUDA graph, and the graph's
replay CUDA-event timed (median of `--repeats`) and divided by the calls (`measure.graph_per_call_us`). Printed
last, per shape: the step's conv + SnakeBeta time with the default tile, with the best single tile, with each call's
best tile, and the baseline; then the tile that is best summed over every shape. The sixteenth session timed each
call eagerly on its own: launch latency and CUDA events made the sums 3-5x a whole graphed step (0.90 ms at 1 x 1,
baseline) and favoured the fused kernel's one launch over the baseline's two; inside a graph neither counts. The
fifteenth session measured the default tile slower than the baseline everywhere (docs/benchmarks.md); this says
whether any tile is not.

Replay safety: a call writes `out` and `sum_out` and only reads its other tensors, and each recorded tensor is
written by one call of the step, so replaying a call rewrites its outputs with what they hold (a view of the next
conv's input buffer, say). An output that overlaps one of the call's own inputs (a residual added in place) would
compound over the replays: it is swapped for a fresh tensor of its shape and strides and named in the call's
`redirected` (the decoder has none). After its warm-up each call runs once more and must leave every input
bit-identical and its outputs as they were, or the sweep stops.

`--dry-run` runs the same path on the CPU, with the graph's calls run eagerly back to back and timed by the clock.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.codec.config import codec_preset  # noqa: E402
from engine.codec.stream import CodecStatePool, decode_incremental  # noqa: E402
from engine.codec.weights import random_codec  # noqa: E402
from engine.executors.codec import codec_dtype  # noqa: E402
from engine.fast import codec_fast  # noqa: E402
from engine.fast.codec_fast import FastCodecDecoder, precision_flags  # noqa: E402
from engine.fast.codec_graphs import _cudnn_benchmark  # noqa: E402  (the engine's capture-time cuDNN mode)
from engine.fast.kernels.conv_snake import DEFAULT_TILE, ConvTile, conv_snake  # noqa: E402
from engine.fast.measure import graph_per_call_us, relative_l2  # noqa: E402

SEED = 1234
HISTORY = 72  # frames decoded before the measured step: every stream past the codec's attention window
TILES = [DEFAULT_TILE] + [ConvTile(m, n, k, w, s) for m, n, k, w, s in (
    (16, 32, 64, 2, 3), (16, 64, 64, 4, 3), (16, 128, 128, 4, 3), (32, 32, 128, 4, 2), (32, 64, 64, 4, 3),
    (32, 128, 64, 4, 4), (64, 32, 64, 2, 4), (64, 64, 32, 4, 4), (64, 64, 64, 4, 3), (128, 64, 64, 4, 3),
    (128, 128, 64, 8, 3),
)]  # fmt: skip


WARMUPS = 2  # eager calls before the check and the capture (as `codec_graphs._Step.capture`)
OUTPUTS = ("out", "sum_out")  # the arguments a call writes; it only reads the others
REPLAY_TOLERANCE = 1e-2  # relative L2 of a rerun's outputs to the last run's (0 expected; cuDNN may not be bitwise)


def _tensors(name: str, value: object) -> Iterator[tuple[str, Tensor]]:
    """The tensors an argument holds: itself, or a dataclass's (the baseline's `_Snake` act: alpha, inv_beta)."""
    if isinstance(value, Tensor):
        yield name, value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _tensors(f"{name}.{field.name}", getattr(value, field.name))


def _arguments(function: Callable, args: tuple, kwargs: dict) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(inputs, outputs) of a call by parameter name: the tensors it reads, and the ones it writes (`OUTPUTS`)."""
    bound = inspect.signature(function).bind(*args, **kwargs).arguments
    inputs = {n: t for name, value in bound.items() if name not in OUTPUTS for n, t in _tensors(name, value)}
    outputs = {name: value for name, value in bound.items() if name in OUTPUTS and value is not None}
    return inputs, outputs


def _overlaps(a: Tensor, b: Tensor) -> bool:
    """Whether the memory spans of two tensors intersect (conservative for interleaved strides)."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False

    def span(t: Tensor) -> tuple[int, int]:  # [first byte, past the last byte]
        elements = 1 + sum((n - 1) * abs(stride) for n, stride in zip(t.shape, t.stride(), strict=True))
        return t.data_ptr(), t.data_ptr() + elements * t.element_size()

    (a_lo, a_hi), (b_lo, b_hi) = span(a), span(b)
    return a_lo < b_hi and b_lo < a_hi


def replay_safe(function: Callable, args: tuple, kwargs: dict) -> tuple[dict, list[str]]:
    """`kwargs` with each output that overlaps one of the call's inputs (a residual added in place: a replay would
    add it again) swapped for a fresh tensor of its shape and strides, and the swapped outputs' names."""
    inputs, outputs = _arguments(function, args, kwargs)
    kwargs, swapped = dict(kwargs), []
    for name, out in outputs.items():
        if any(_overlaps(out, t) for t in inputs.values()):
            kwargs[name] = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=out.device)
            swapped.append(name)
    return kwargs, swapped


def _bits(t: Tensor) -> Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def check_replayable(function: Callable, args: tuple, kwargs: dict) -> None:
    """Runs the (warmed-up) call once more: it must leave every input bit-identical and rewrite its outputs with
    what they held (within REPLAY_TOLERANCE), as every replay of a graph of it must. Raises RuntimeError if not."""
    inputs, outputs = _arguments(function, args, kwargs)
    before = {name: t.clone() for name, t in (inputs | outputs).items()}
    function(*args, **kwargs)
    what = getattr(function, "__qualname__", repr(function))
    for name, t in inputs.items():
        if not torch.equal(_bits(t), _bits(before[name])):
            raise RuntimeError(f"{what} changed its input {name}: replaying it would not repeat one call")
    for name, t in outputs.items():
        if not torch.equal(_bits(t), _bits(before[name])) and relative_l2(t, before[name]) > REPLAY_TOLERANCE:
            raise RuntimeError(f"{what} wrote {name} differently when run again: its replays would compound")


def time_call(function: Callable, args: tuple, kwargs: dict, device: str, repeats: int, calls: int) -> float:
    """Milliseconds per call of function(*args, **kwargs) as a captured step pays for it (module docstring): warmed
    up, checked replay-safe, then `calls` of it back to back in one CUDA graph, the median replay over `repeats`
    divided by `calls`. On the CPU the same, with the graph's calls run eagerly and timed by the clock."""
    fn = partial(function, *args, **kwargs)
    with torch.no_grad(), _cudnn_benchmark():
        if device == "cuda":  # warm-ups on a side stream, as before any capture (codec_graphs._Step.capture)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUPS):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
        else:
            for _ in range(WARMUPS):
                fn()
        check_replayable(function, args, kwargs)  # host syncs and clones: before the capture, never inside it
        if device == "cuda":  # graph_per_call_us runs each call once more, syncs, captures, replays
            return graph_per_call_us([fn] * calls, repeats) / 1e3
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - start) * 1e3 / calls)
        return statistics.median(times)


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
    """The conv calls of one step of `frames` new frames for `batch` streams that each decoded HISTORY frames.

    cuDNN runs in benchmark mode throughout, as in the engine's capture warm-ups (whole steps): each conv shape's
    algorithm is timed here, inside a step, and `time_call` finds it cached. PyTorch's benchmark only tries the
    algorithms whose workspace fits the caching allocator's largest free block (Conv_v8.cpp), and `time_call`
    runs just after a capture emptied that cache: a first version that left the timing to it read a 356 ms
    baseline at 8 x 25 on the H200 (40x the eager sweep's), as if only workspace-free algorithms had been tried."""
    gen = torch.Generator().manual_seed(SEED)
    codes = torch.randint(0, decoder.config.codebook_size, (batch, decoder.config.num_quantizers, HISTORY + frames),
                          generator=gen).to(device)  # fmt: skip
    pool = CodecStatePool(decoder.config, batch, device, decoder.dtype)
    slots = [pool.alloc() for _ in range(batch)]
    with _cudnn_benchmark():
        for start in range(0, HISTORY, 24):
            decode_incremental(decoder, pool, slots, codes[..., start : min(start + 24, HISTORY)],
                               check_code_values=False)  # fmt: skip
        with _Recorder() as recorder:
            decode_incremental(decoder, pool, slots, codes[..., HISTORY:], check_code_values=False)
    return recorder.calls


def _key(args: tuple, kwargs: dict) -> tuple:
    x, taps, dilation = args[:3]
    return (tuple(x.shape), tuple(taps.shape), dilation, kwargs.get("bias") is not None,
            kwargs.get("residual") is not None, kwargs.get("sum_out") is not None)  # fmt: skip


def sweep_shape(fused: FastCodecDecoder, plain: FastCodecDecoder, batch: int, frames: int, device: str,
                repeats: int, calls_per_graph: int) -> dict[str, Any]:  # fmt: skip
    fused_calls = _record(fused, batch, frames, device)
    plain_calls = _record(plain, batch, frames, device)
    if len(fused_calls) != len(plain_calls):
        raise RuntimeError(f"the two decoders ran {len(fused_calls)} and {len(plain_calls)} convs")
    timer = partial(time_call, device=device, repeats=repeats, calls=calls_per_graph)
    calls: dict[tuple, dict[str, Any]] = {}
    for (args, kwargs), (plain_args, plain_kwargs) in zip(fused_calls, plain_calls, strict=True):
        key = _key(args, kwargs)
        if key in calls:
            calls[key]["count"] += 1
            continue
        kwargs, redirected = replay_safe(conv_snake, args, kwargs)
        plain_kwargs, plain_redirected = replay_safe(FastCodecDecoder._conv_snake, plain_args, plain_kwargs)
        with precision_flags(fused.precision):
            tiles = [timer(conv_snake, args, kwargs | {"tile": tile}) for tile in TILES]  # kwargs hold tf32
            baseline = timer(FastCodecDecoder._conv_snake, plain_args, plain_kwargs)
        x, taps = args[0], args[1]
        calls[key] = {"x": list(x.shape), "taps": list(taps.shape), "dilation": args[2], "count": 1,
                      "tile_ms": tiles, "baseline_ms": baseline,
                      "redirected": redirected, "baseline_redirected": plain_redirected}  # fmt: skip
        for what, names in (("fused", redirected), ("baseline", plain_redirected)):
            if names:
                print(f"note: {what} call {key} writes {names} over its own input: timed into a fresh tensor",
                      flush=True)  # fmt: skip
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
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("conv_snake_bench needs a CUDA GPU (or --dry-run)")
    codec = random_codec(codec_preset("tiny" if args.dry_run else "full"), device=device,
                         dtype=codec_dtype(args.precision), seed=SEED)  # fmt: skip
    fused = FastCodecDecoder(codec, args.precision, fused_attention=True, channels_last=True, triton_convs=True)
    plain = FastCodecDecoder(codec, args.precision, fused_attention=True, channels_last=True)
    shapes = []
    for text in args.shapes:
        batch, frames = (int(v) for v in text.split("x"))
        shapes.append(sweep_shape(fused, plain, batch, frames, device, args.repeats, args.calls_per_graph))
        s = shapes[-1]
        print(f"{batch} x {frames}: default {s['default_ms']:.3f} ms, best tile {s['best_single']} "
              f"{s['best_single_ms']:.3f}, per call {s['best_per_call_ms']:.3f}, baseline {s['baseline_ms']:.3f}",
              flush=True)  # fmt: skip
    overall = [sum(s["tile_total_ms"][i] for s in shapes) for i in range(len(TILES))]
    best = min(range(len(TILES)), key=lambda i: overall[i])
    return {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "precision": args.precision,
            "tiles": [vars_of(t) for t in TILES], "shapes": shapes, "best_tile_overall": best,
            "overall_ms": overall, "timing": {"mode": "cuda-graph" if device == "cuda" else "cpu-eager",
                                              "calls_per_graph": args.calls_per_graph, "repeats": args.repeats,
                                              "warmups": WARMUPS}}  # fmt: skip


def vars_of(tile: ConvTile) -> dict[str, Any]:
    return {name: getattr(tile, name) for name in ConvTile.__slots__}


def summary(result: dict[str, Any]) -> str:
    timing = result["timing"]
    if timing["mode"] == "cuda-graph":
        how = (f"each call timed inside a CUDA graph: {timing['calls_per_graph']} calls back to back, the median of "
               f"{timing['repeats']} replays / {timing['calls_per_graph']} (what a captured step pays)")
    else:
        how = (f"each call run eagerly on the CPU, {timing['calls_per_graph']} back to back (a dry run: where the "
               "GPU captures them into a CUDA graph; nothing real is timed)")
    lines = [f"conv + SnakeBeta per codec step, {result['precision']}, {result['device']} (ms):", how,
             "| B x N | default tile | best single tile | best tile per call | cuDNN conv + SnakeBeta |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for s in result["shapes"]:
        lines.append(f"| {s['batch']} x {s['frames']} | {s['default_ms']:.3f} | {s['best_single_ms']:.3f} "
                     f"(tile {s['best_single']}) | {s['best_per_call_ms']:.3f} | {s['baseline_ms']:.3f} |")  # fmt: skip
    best = result["best_tile_overall"]
    lines.append(f"best tile over every shape: {best} {result['tiles'][best]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--shapes", nargs="+", default=["1x1", "8x4", "8x25"], help="BxN: streams x new frames")
    parser.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "bf16"])
    parser.add_argument("--repeats", type=int, default=20, help="timed graph replays per median")
    parser.add_argument("--calls-per-graph", type=int, default=32,
                        help="invocations of one call captured back to back into one CUDA graph")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="write every timing as JSON here")
    parser.add_argument("--dry-run", action="store_true", help="tiny codec on the CPU: checks the script only")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.calls_per_graph < 1:
        parser.error("--repeats and --calls-per-graph must be positive")
    if args.dry_run:
        args.repeats, args.calls_per_graph = min(args.repeats, 2), min(args.calls_per_graph, 2)
    result = run(args)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))
    print(summary(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
