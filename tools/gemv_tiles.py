"""The talker's and the code predictor's products as their steps call them, timed per `gemv` tile (GPU; CPU dry run).

    python tools/gemv_tiles.py [--model talker] [--rows 1] [--out gemv_tiles.json]
    python tools/gemv_tiles.py --model code_predictor --rows 64 128 [--jobs 12]
    python tools/gemv_tiles.py --model talker --rows 64 --columns 64 128 --split-k 1 2 4 8 [--tma] --jobs 15
    python tools/gemv_tiles.py --dry-run [--model ...] [--rows ...]   # CPU, Triton's interpreter: correctness only

At 1-2 token rows each product runs with exactly the arguments the streamed step gives it: qkv, gate|up (and the
code predictor's head) with the RMSNorm and residual-add prologue, gate|up also with the SwiGLU epilogue, the code
predictor's input projection with its bias; the grid is CUDA-core tiles (output columns, K per load, warps, K loop
unrolled (0) or pipelined over 1 / 3 tiles; 16 or 32 weight values a thread). From 16 rows up the steps norm in a
kernel of their own, so each product runs bare (bias and SwiGLU epilogues kept) over tensor-core tiles (columns
16-64, K per load 64-256 as `launch_tile` caps it, 4 or 8 warps, unrolled or pipelined over 2-4 tiles), and the
best tile is timed once more with the norm prologue, beside the norm kernel alone. `--columns` and `--split-k` set
the tensor-core grid's widths and K slices; `--tma` adds each pipelined tile loading by bulk tensor copies.

Weights are bf16, many copies, so every call streams its weight from HBM (`HBM_BYTES`, over 3x the L2), each call
timed inside one CUDA graph (`engine.fast.measure.graph_per_call_us`), beside the tile the engine uses today
(`StreamTiles` / `FrameKernels`, at 1-2 rows) and cuBLAS's bare product (`torch.matmul`). Every result is checked
against `gemv_reference` (relative L2 <= 1e-2; a wrong one is reported, not timed). `--jobs` compiles the grid in
that many processes first (Triton's cache then serves the timing process). Prints one line per product and rows
and writes everything to --out. This chose `StreamTiles` on 2026-12-04 (as tools/talker_tiles.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HBM_BYTES = 200 << 20
# name: (N, K, norm prologue at 1-2 rows, SwiGLU, bias) of the full-size models; the dry run divides N and K by 64.
PRODUCTS = {
    "talker": {"qkv": (4096, 2048, True, False, False), "o": (2048, 2048, False, False, False),
               "gate_up": (12288, 2048, True, True, False), "down": (2048, 6144, False, False, False)},
    "code_predictor": {"proj": (1024, 2048, False, False, True), "qkv": (4096, 1024, True, False, False),
                       "o": (1024, 2048, False, False, False), "gate_up": (6144, 1024, True, True, False),
                       "down": (1024, 3072, False, False, False), "head": (2048, 1024, True, False, False)},
}  # fmt: skip
COLUMNS, K_LOADS, WARPS, LOOP_STAGES = (4, 8, 16), (256, 512, 1024), (4, 8), (0, 1, 3)
DOT_COLUMNS, DOT_K_LOADS, DOT_STAGES = (16, 32, 64), (64, 128, 256), (0, 2, 3, 4)
DOT_ROWS = 16  # from here the steps norm apart and the grid is tensor-core tiles


def tile_grid(k: int, silu: bool, rows: int = 1, splits: tuple[int, ...] = (1,),
              columns: tuple[int, ...] = DOT_COLUMNS) -> list[Any]:  # fmt: skip
    """The tiles tried for one product at `rows` rows. CUDA-core tiles: 16 or 32 weight values a thread, K unrolled
    only up to 8 loads. Tensor-core tiles (`columns` output columns a program): one per distinct launch
    (`launch_tile` caps K per load by the rows), in each of `splits` K slices (`GemvConfig.split_k`: pipelined loops
    over whole tiles only)."""
    from engine.fast.kernels.gemv import GemvConfig, launch_tile

    grid = []
    if rows < DOT_ROWS:
        for columns, k_load, warps, stages in itertools.product(COLUMNS, K_LOADS, WARPS, LOOP_STAGES):
            per_thread = columns * k_load * (2 if silu else 1) / (32 * warps)
            if per_thread in (16, 32) and not (stages == 0 and k // k_load > 8):
                grid.append(GemvConfig(block_n=columns, block_k=k_load, num_warps=warps, loop_stages=stages))
        return grid
    launched = set()
    for width, k_load, warps, stages, split in itertools.product(columns, DOT_K_LOADS, WARPS, DOT_STAGES, splits):
        config = GemvConfig(block_n=width, block_k=k_load, num_warps=warps, use_dot=True, loop_stages=stages,
                            split_k=split)  # fmt: skip
        tile = launch_tile(rows, k, config)
        if (tile, warps, stages, split) in launched or (stages == 0 and k // tile[3] > 8):
            continue
        if split > 1 and (stages == 0 or k % (split * tile[3])):
            continue
        launched.add((tile, warps, stages, split))
        grid.append(config)
    return grid


def label(config: Any) -> str:
    split = f"/s{config.split_k}" if config.split_k > 1 else ""
    split += "/tma" if config.tma else ""
    return f"{config.block_n}/{config.block_k}/{config.num_warps}/{config.loop_stages}{split}"


def today_tile(model: str, name: str, rows: int) -> Any:
    """The tile the engine gives this product at `rows` rows today, or None where cuBLAS runs it."""
    from engine.fast.code_predictor_graph import FrameKernels
    from engine.fast.decoder import StreamTiles

    if model == "talker":
        return getattr(StreamTiles(), name) if rows <= 2 else None
    kernels = FrameKernels()
    return kernels.gemv[name] if rows <= kernels.gemv_max_rows else None


def bench_product(model: str, name: str, rows: int, device: str, scale: int, grid_limit: int | None,
                  compile_only: bool = False, splits: tuple[int, ...] = (1,),
                  widths: tuple[int, ...] = DOT_COLUMNS, tma: bool = False) -> dict[str, Any]:  # fmt: skip
    import torch

    from engine.fast.kernels.gemv import gemv, gemv_reference
    from engine.fast.kernels.rmsnorm import rms_norm
    from engine.fast.measure import graph_per_call_us, relative_l2

    n, k, norm, silu, bias = PRODUCTS[model][name]
    n, k = n // scale, k // scale
    dot = rows >= DOT_ROWS
    timed = device == "cuda" and not compile_only
    gen = torch.Generator(device=device).manual_seed(0)
    copies = max(4, math.ceil(HBM_BYTES / (n * k * 2))) if timed else 1
    # bf16 as the engine runs; but Triton 3.9's interpreter gets bf16 `tl.dot` wrong, so a CPU dry run checks the
    # tensor-core tiles in fp32.
    dtype = torch.float32 if device == "cpu" and dot else torch.bfloat16
    weights = [torch.randn(n, k, device=device, dtype=dtype, generator=gen) * 0.02 for _ in range(copies)]
    x = torch.randn(rows, k, device=device, dtype=dtype, generator=gen)
    columns = n // 2 if silu else n
    product: dict[str, Any] = {"silu_mul": silu}
    if bias:
        product["bias"] = 0.1 * torch.randn(columns, device=device, generator=gen).to(dtype)
    prologue: dict[str, Any] = {}
    if norm:
        prologue = {"residual": torch.randn(rows, k, device=device, dtype=dtype, generator=gen),
                    "norm_weight": (1 + 0.1 * torch.randn(k, device=device, generator=gen)).to(dtype),
                    "eps": 1e-6}  # fmt: skip
    kwargs = product if dot else product | prologue  # from DOT_ROWS up the step norms in a kernel of its own
    truth = gemv_reference(x, weights[0], **kwargs)[0].float()
    out = torch.empty(rows, columns, device=device, dtype=dtype)
    total = torch.empty(rows, k, device=device, dtype=dtype) if norm and not dot else None
    today = today_tile(model, name, rows)
    base = tile_grid(k, silu, rows, splits, widths)
    grid = base[:grid_limit]
    if tma:  # each pipelined tensor-core tile also loading by bulk tensor copies (`GemvConfig.tma`)
        grid += [replace(c, tma=True) for c in base if c.use_dot and c.loop_stages][:grid_limit]
    tiles = ([("today", today)] if today is not None else []) + [(label(c), c) for c in grid]
    result: dict[str, Any] = {"rows": rows, "n": n, "k": k, "tiles": [], "wrong": [], "unlaunchable": []}
    for tile_name, config in tiles:
        def call(w: Any, config: Any = config) -> None:
            gemv(x, w, config=config, out=out, sum_out=total, **kwargs)

        try:
            call(weights[0])
        except Exception as error:  # noqa: BLE001 - a tile the device cannot launch (e.g. shared memory) is skipped
            result["unlaunchable"].append({"tile": tile_name, "error": f"{type(error).__name__}: {error}"[:200]})
            continue
        error = relative_l2(out.float(), truth)
        if not error <= 1e-2:
            result["wrong"].append({"tile": tile_name, "error": error})
            continue
        us = graph_per_call_us([lambda w=w: call(w) for w in weights], repeats=9) if timed else None
        result["tiles"].append({"tile": tile_name, "us": us})
    if not timed:
        return result
    matmul = (lambda w: torch.nn.functional.linear(x, w, product["bias"])) if bias else (lambda w: x @ w.T)
    result["cublas_us"] = graph_per_call_us([lambda w=w: matmul(w) for w in weights], repeats=9)
    ranked = sorted(result["tiles"], key=lambda t: t["us"])
    result["best"] = ranked[:6]
    best = dict(tiles)[ranked[0]["tile"]] if ranked else None
    if norm and not dot and today is not None:
        result["today_without_prologue_us"] = graph_per_call_us(
            [lambda w=w: gemv(x, w, config=today, **product) for w in weights], repeats=9
        )
    if norm and dot and best is not None:  # the norm in the product's prologue, against the norm kernel alone
        with_norm = {**product, **prologue}
        sums = torch.empty(rows, k, device=device, dtype=torch.bfloat16)
        result["best_with_prologue_us"] = graph_per_call_us(
            [lambda w=w: gemv(x, w, config=best, out=out, sum_out=sums, **with_norm) for w in weights], repeats=9
        )
        result["norm_kernel_us"] = graph_per_call_us(
            [lambda: rms_norm(x, prologue["norm_weight"], 1e-6, prologue["residual"])] * 16, repeats=9
        )
    return result


def _compile_in_parallel(args: argparse.Namespace) -> None:
    """Every (product, rows) grid compiled in its own process, `--jobs` at a time: Triton's on-disk cache then
    hands the timing process its kernels without compiling them one by one."""
    cmds = [[sys.executable, __file__, "--model", args.model, "--rows", str(rows), "--products", name,
             "--split-k", *map(str, args.split_k), "--columns", *map(str, args.columns), "--compile-only",
             "--out", os.devnull, *(["--tma"] if args.tma else [])]
            for rows in args.rows for name in args.products]  # fmt: skip
    running: list[subprocess.Popen[bytes]] = []
    for cmd in cmds:
        if len(running) >= args.jobs:
            running.pop(0).wait()
        running.append(subprocess.Popen(cmd))
    for proc in running:
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="talker", choices=list(PRODUCTS))
    parser.add_argument("--rows", type=int, nargs="+", default=[1])
    parser.add_argument("--products", nargs="+", default=None, help="default: every product of --model")
    parser.add_argument("--jobs", type=int, default=0, help="compile the grids in this many processes first")
    parser.add_argument("--split-k", type=int, nargs="+", default=[1],
                        help="tensor-core tiles in these many K slices each (`GemvConfig.split_k`; default 1)")
    parser.add_argument("--columns", type=int, nargs="+", default=list(DOT_COLUMNS),
                        help="tensor-core tiles' output columns a program (default: 16 32 64)")
    parser.add_argument("--tma", action="store_true",
                        help="also each pipelined tensor-core tile loading by bulk tensor copies (`GemvConfig.tma`)")
    parser.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("gemv_tiles.json"))
    parser.add_argument("--dry-run", action="store_true", help="CPU, Triton's interpreter, tiny shapes, 2 tiles")
    args = parser.parse_args(argv)
    args.products = args.products or list(PRODUCTS[args.model])
    if unknown := set(args.products) - set(PRODUCTS[args.model]):
        parser.error(f"{args.model} has no product {', '.join(sorted(unknown))}")
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before engine.fast.kernels is imported
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device: run on the GPU machine, or use --dry-run")
    device, scale, limit = ("cpu", 64, 2) if args.dry_run else ("cuda", 1, None)
    if args.jobs and not args.dry_run and not args.compile_only:
        _compile_in_parallel(args)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (dry run)",
                              "torch": torch.__version__, "model": args.model, "products": {}}  # fmt: skip
    for rows in args.rows:
        for name in args.products:
            result = bench_product(args.model, name, rows, device, scale, limit, args.compile_only,
                                   tuple(args.split_k), tuple(args.columns), args.tma)  # fmt: skip
            report["products"][f"{name}@{rows}"] = result
            if device == "cpu" or args.compile_only:
                print(f"{name:8s} rows {rows}: {len(result['tiles'])} tiles agree with the twin, "
                      f"{len(result['wrong'])} wrong")  # fmt: skip
                continue
            today = next((t["us"] for t in result["tiles"] if t["tile"] == "today"), None)
            best = ", ".join(f"{t['tile']} {t['us']:.2f}" for t in result["best"][:3])
            extra = {k: round(result[k], 2) for k in ("today_without_prologue_us", "best_with_prologue_us",
                                                      "norm_kernel_us") if k in result}  # fmt: skip
            print(f"{name:8s} rows {rows}: today {today} us, cuBLAS {result['cublas_us']:.2f}; best "
                  f"(columns/K/warps/stages) {best}; {extra or ''} wrong {len(result['wrong'])}, unlaunchable "
                  f"{len(result['unlaunchable'])}")  # fmt: skip
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 1 if any(r["wrong"] for r in report["products"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
