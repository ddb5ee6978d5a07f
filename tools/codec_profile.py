"""Where a codec step's GPU time goes: replay time, kernel count and heaviest kernels of the fast decoder (GPU only).

    python tools/codec_profile.py --shapes 1x1 16x2 32x4 --precisions tf32 bf16 --out codec_profile.json
    python tools/codec_profile.py --shapes 1x1 4x4 16x4 --precisions tf32 --kernels ops fused   # --codec-kernels A/B
    python tools/codec_profile.py --shapes 1x1 16x4 --precisions tf32 --layouts ncl channels-last  # --codec-layout
    python tools/codec_profile.py --grid tf32        # the cost table's codec_chunk entry for that precision

For each precision and (streams B, new frames N), on the full-size codec with seeded random weights and every
stream past its attention window: the captured graph's replay time (CUDA-event median), a whole
`CodecGraphs.decode` call, the kernels per replay and the heaviest of them (torch profiler over 5 replays);
with `--convs`, each decoder block's first residual unit's convs two ways (k7 in NCL vs channels-last, k1 as
cuDNN vs a product); with `--launchers PATTERN ...`, the operators (and their input shapes) that launch the
kernels whose names contain a pattern, from one eager step after the graph's (e.g. `--launchers nchwToNhwc`: which
convs cuDNN converts the layout of on every step). At the engine's shapes a step is launch-bound, so the kernel count is the number to cut.
Eager per-stage timings are not reported: launched one by one, a stage's span is the host's launch time.
Prints a short table last; `--out` writes everything as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from engine.codec.config import codec_preset
from engine.codec.stream import CodecStatePool, decode_incremental
from engine.codec.weights import random_codec
from engine.executors.codec import fast_codec_decoder
from engine.fast.codec_fast import FastCodecDecoder, precision_flags, transposed_by_product
from engine.fast.codec_graphs import RESERVED_SLOTS, CodecGraphs
from engine.fast.measure import cuda_median_ms, relative_l2
from engine.settings import CODEC_KERNELS, CODEC_LAYOUTS, EngineSettings

SEED = 1234
HISTORY = 72
DEFAULTS = EngineSettings("1.7b", "")  # the engine's own --codec-kernels and --codec-layout
DEVICE = "cuda"  # `--dry-run`: "cpu", tiny codec, profiler on the CPU only (checks this script, times nothing real)


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    if DEVICE == "cuda":
        return cuda_median_ms(fn, repeats)
    import statistics
    import time

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _activities() -> list[ProfilerActivity]:
    return [ProfilerActivity.CUDA] if DEVICE == "cuda" else [ProfilerActivity.CPU]


def _device_us(event: Any) -> float:
    for name in ("device_time_total", "cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def _self_device_us(event: Any) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def _pool(decoder: Any, streams: int, runners: int) -> tuple[CodecStatePool, list[int]]:
    """`streams` streams with HISTORY frames decoded, and a scratch row for each of `runners` CodecGraphs."""
    pool = CodecStatePool(decoder.config, streams + runners * RESERVED_SLOTS, decoder.device, decoder.dtype)
    slots = [pool.alloc() for _ in range(streams)]
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    codes = torch.randint(0, 2048, (streams, 16, HISTORY), generator=gen, device=DEVICE)
    decode_incremental(decoder, pool, slots, codes, check_code_values=False)
    return pool, slots


def _primed(pool: CodecStatePool) -> Callable[[], None]:
    """A function that puts the pool's state back as it is now: each shape is timed on streams with HISTORY
    frames behind them, as the engine's are, not on state that every earlier shape's replays moved on."""
    flat, positions = pool.flat.clone(), pool.positions.clone()

    def restore() -> None:
        pool.flat.copy_(flat)
        pool.positions.copy_(positions)

    return restore


def kernel_table(fn: Callable[[], object], replays: int) -> tuple[int, list[dict[str, Any]]]:
    """Kernels launched by `replays` calls of fn -> (kernels per call, [{name, us, calls}] per call, heaviest first)."""
    fn()
    _sync()
    with profile(activities=_activities()) as prof:
        for _ in range(replays):
            fn()
        _sync()
    rows, count = [], 0
    for event in prof.key_averages():
        us = _self_device_us(event)
        if us <= 0:
            continue
        count += event.count
        rows.append(
            {"name": event.key[:100], "us": round(us / replays, 1), "calls": round(event.count / replays, 2)}
        )
    rows.sort(key=lambda r: -r["us"])
    return round(count / replays), rows


def launcher_table(step: Callable[[], object], patterns: list[str]) -> list[dict[str, Any]]:
    """One call of `step` (eager, after a warm-up one) under the profiler -> for every kernel whose name contains
    one of `patterns`: the operator that launched it, that operator's input shapes, the kernel and its us."""
    step()
    _sync()
    with profile(activities=sorted({ProfilerActivity.CPU, *_activities()}, key=str), record_shapes=True) as prof:
        step()
        _sync()
    rows = []
    for event in prof.events():
        for kernel in getattr(event, "kernels", []):
            if any(p in kernel.name for p in patterns):
                rows.append({"op": event.name, "shapes": [list(s) for s in event.input_shapes if s],
                             "kernel": kernel.name[:80], "us": round(float(kernel.duration), 1)})  # fmt: skip
    return rows


def conv_table(fast: FastCodecDecoder, batch: int, frames: int) -> list[dict[str, Any]]:
    """Each decoder block at this shape: its transposed conv in NCL, channels-last (cuDNN) and as a product plus
    an overlap-add; its first residual unit's k7 conv in NCL against channels-last (NHWC, input already in that
    layout), and the k1 conv as cuDNN against a product."""
    rows = []
    length = frames * 4
    gen = torch.Generator(device=DEVICE).manual_seed(SEED + 2)
    for index, block in enumerate(fast._blocks, start=1):
        up = block.up_weight if block.up_weight.dim() == 3 else block.up_weight.squeeze(2).contiguous()
        c_in, c_out, taps = up.shape
        xt = torch.randn(batch, c_in, length, generator=gen, device=DEVICE).to(fast.dtype)
        xt_cl = xt.transpose(1, 2).contiguous().transpose(1, 2)  # [B, C_in, L] in [B, L, C_in] memory
        up4 = up.unsqueeze(2).contiguous(memory_format=torch.channels_last)
        xt4 = xt.unsqueeze(2).contiguous(memory_format=torch.channels_last)
        up_rows = up.permute(0, 2, 1).reshape(c_in, taps * c_out).contiguous()  # [C_in, k * C_out], tap-major
        with precision_flags(fast.precision):
            up_ncl = _median_ms(partial(F.conv_transpose1d, xt, up, None, stride=block.stride), 20)
            up_nhwc = _median_ms(partial(F.conv_transpose2d, xt4, up4, None, stride=(1, block.stride)), 20)
            up_gemm = _median_ms(partial(transposed_by_product, xt_cl, up_rows, block.stride), 20)
            up_err = relative_l2(transposed_by_product(xt_cl, up_rows, block.stride),
                                 F.conv_transpose1d(xt, up, None, stride=block.stride))  # fmt: skip
        length *= block.stride
        unit = block.units[0]
        c = unit.conv1_weight.shape[0]
        x = torch.randn(batch, c, unit.history + length, generator=gen, device=DEVICE).to(fast.dtype)
        h = torch.randn(batch, c, length, generator=gen, device=DEVICE).to(fast.dtype)
        w3 = unit.conv1_weight if unit.conv1_weight.dim() == 3 else unit.conv1_weight.squeeze(2).contiguous()
        w4 = w3.unsqueeze(2).contiguous(memory_format=torch.channels_last)
        x4 = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
        k1 = unit.conv2_weight if unit.conv2_weight.dim() == 3 else unit.conv2_weight.squeeze(2).contiguous()
        w1 = k1.squeeze(-1).contiguous()
        with precision_flags(fast.precision):
            dilation = unit.dilation
            k7_ncl = _median_ms(partial(F.conv1d, x, w3, None, dilation=dilation), 20)
            k7_nhwc = _median_ms(partial(F.conv2d, x4, w4, None, dilation=(1, dilation)), 20)
            k1_cudnn = _median_ms(partial(F.conv1d, h, k1, None), 20)
            k1_gemm = _median_ms(partial(torch.matmul, w1, h), 20)
            k1_err = relative_l2(torch.matmul(w1, h), F.conv1d(h, k1, None))
        rows.append({
            "block": index, "channels": c, "length": length, "up_ncl_us": round(up_ncl * 1000, 1),
            "up_nhwc_us": round(up_nhwc * 1000, 1), "up_gemm_us": round(up_gemm * 1000, 1), "up_rel_l2": up_err,
            "k7_ncl_us": round(k7_ncl * 1000, 1),
            "k7_nhwc_us": round(k7_nhwc * 1000, 1), "k1_cudnn_us": round(k1_cudnn * 1000, 1),
            "k1_gemm_us": round(k1_gemm * 1000, 1), "k1_rel_l2": k1_err,
        })  # fmt: skip
    return rows


def eager_step(fast: FastCodecDecoder, pool: CodecStatePool, slots: list[int], codes: torch.Tensor,
               restore: Callable[[], None]) -> None:
    """The captured step's work, launched op by op (so the profiler can say which operator launched what)."""
    restore()
    fast.decode_incremental(pool, slots, codes, check_code_values=False)


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.backends.cudnn.benchmark = True
    config = codec_preset("tiny" if args.dry_run else "full")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry run)"
    report: dict[str, Any] = {"device": name, "torch": torch.__version__, "results": []}
    variants = [(p, k, lay) for p in args.precisions for k in args.kernels for lay in args.layouts]
    for precision, variant, layout in variants:
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        decoder = random_codec(config, device=DEVICE, dtype=dtype, seed=SEED)
        with precision_flags(precision):
            pool, slots = _pool(decoder, max(b for b, _ in shapes), 1)
        restore = _primed(pool)
        fused = variant != "ops"  # as the engine's --codec-kernels
        fast = fast_codec_decoder(decoder, precision, variant, layout)
        graphs = CodecGraphs(fast, pool, batch_sizes=sorted({1, *(b for b, _ in shapes)}),
                             frame_sizes=sorted({1, *(n for _, n in shapes)}), state_kernel=fused)  # fmt: skip
        for batch, frames in shapes:
            restore()
            graphs.capture([(batch, frames)])
            codes = torch.randint(0, 2048, (batch, 16, frames), device=DEVICE)
            graphs.decode(slots[:batch], codes, check_code_values=False)
            step = graphs._steps[(batch, frames)]
            replay_ms = _median_ms(step.run, 20)
            call_ms = _median_ms(partial(graphs.decode, slots[:batch], codes, check_code_values=False), 20)
            kernels, top = kernel_table(step.run, 5)
            result = {
                "precision": precision, "kernels": variant, "layout": layout, "batch": batch, "frames": frames, "replay_ms": round(replay_ms, 3),
                "decode_call_ms": round(call_ms, 3), "kernels_per_replay": kernels, "top_kernels": top[: args.top],
                "convs": conv_table(fast, batch, frames) if args.convs else [],
            }  # fmt: skip
            if args.launchers:  # eager steps move the streams on: the state goes back before and after
                restore()
                result["launchers"] = launcher_table(partial(eager_step, fast, pool, slots[:batch], codes, restore),
                                                     args.launchers)  # fmt: skip
                restore()
            report["results"].append(result)
            print(json.dumps(result), flush=True)
        del graphs, pool, fast, decoder
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return report


def cost_grid(
    precision: str,
    batches: list[int],
    frames: list[int],
    kernels: str = DEFAULTS.codec_kernels,
    layout: str = DEFAULTS.codec_layout,
) -> dict[str, Any]:
    """Replay medians over a (batch x frames) grid, as a `codec_chunk` entry of engine/scheduling/costs/*.json."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    decoder = random_codec(
        codec_preset("tiny" if DEVICE == "cpu" else "full"), device=DEVICE, dtype=dtype, seed=SEED
    )
    fused = kernels != "ops"
    fast = fast_codec_decoder(decoder, precision, kernels, layout)
    with precision_flags(precision):
        pool, slots = _pool(decoder, max(batches), 1)
    restore = _primed(pool)
    graphs = CodecGraphs(fast, pool, batch_sizes=sorted({1, *batches}), frame_sizes=sorted({1, *frames}),
                         state_kernel=fused)  # fmt: skip
    ms = []
    for batch in batches:
        row = []
        for n in frames:
            restore()
            graphs.capture([(batch, n)])
            codes = torch.randint(0, 2048, (batch, 16, n), device=DEVICE)
            graphs.decode(slots[:batch], codes, check_code_values=False)
            row.append(round(_median_ms(graphs._steps[(batch, n)].run, 15), 3))
        ms.append(row)
        largest = pool.flat[slots[:batch]].abs().max().item()
        print(f"[codec_profile] grid {precision} B={batch}: {row} (largest |state| {largest:.3g})", flush=True)
    return {"batch": batches, "frames": frames, "ms": ms}


def table(report: dict[str, Any]) -> str:
    lines = []
    for r in report["results"]:
        lines.append(
            f"{r['precision']} {r.get('kernels', 'ops')} {r.get('layout', 'ncl')} B={r['batch']} N={r['frames']}: replay "
            f"{r['replay_ms']} ms, decode call {r['decode_call_ms']} ms, {r['kernels_per_replay']} kernels"
        )
        lines.append(
            "  convs µs, transposed ncl/nhwc/gemm, k7 ncl/nhwc, k1 cudnn/gemm: "
            + ", ".join(
                f"b{t['block']} {t['up_ncl_us']}/{t['up_nhwc_us']}/{t['up_gemm_us']}, {t['k7_ncl_us']}/"
                f"{t['k7_nhwc_us']}, {t['k1_cudnn_us']}/{t['k1_gemm_us']}"
                for t in r.get("convs", [])
            )
        )
        lines.append(
            "  top: " + "; ".join(f"{k['us']}us x{k['calls']} {k['name'][:50]}" for k in r["top_kernels"][:8])
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["1x1", "16x2", "32x4"])
    parser.add_argument("--precisions", nargs="+", default=["tf32", "bf16"])
    parser.add_argument("--kernels", nargs="+", default=[DEFAULTS.codec_kernels], choices=CODEC_KERNELS,
                        help="the engine's --codec-kernels variants to profile, each on its own runner")
    parser.add_argument("--layouts", nargs="+", default=[DEFAULTS.codec_layout], choices=CODEC_LAYOUTS,
                        help="the engine's --codec-layout variants (with every --kernels variant)")
    parser.add_argument("--convs", action="store_true", help="also time the residual units' convs two ways")
    parser.add_argument("--launchers", nargs="*", default=[], metavar="PATTERN",
                        help="name the operators that launch kernels whose names contain these (one eager step)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--dry-run", action="store_true", help="tiny codec on the CPU: checks the script only"
    )
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--grid",
        default=None,
        metavar="PRECISION",
        help="only time the cost-table grid (B 1,8,32,64 x N --grid-frames) in this precision",
    )
    parser.add_argument("--grid-frames", default="1,2,4,8,12,25", help="the grid's frames per row, comma-separated")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = "cpu" if args.dry_run else "cuda"
    if not args.dry_run and not torch.cuda.is_available():
        print("codec_profile needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.grid:
        frames = [int(n) for n in args.grid_frames.split(",")]
        entry = cost_grid(args.grid, [1, 8, 32, 64] if not args.dry_run else [1, 2], frames,
                          args.kernels[0], args.layouts[0])  # fmt: skip
        print(json.dumps({"codec_chunk": entry, "precision": args.grid}))
        return 0
    report = run(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
