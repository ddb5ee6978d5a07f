"""The talker's four decode products as `run_layers_streamed` calls them, timed per `gemv` tile (GPU; CPU dry run).

    python tools/talker_tiles.py [--rows 1] [--out talker_tiles.json]
    python tools/talker_tiles.py --dry-run            # CPU, Triton's interpreter, tiny shapes: correctness only

Each product runs with exactly the arguments the streamed talker step gives it: qkv and gate|up with the RMSNorm and
residual-add prologue (gate|up also with the SwiGLU epilogue), o and down plain. Weights are bf16, many copies, so
every call streams its weight from HBM (`HBM_BYTES`, over 3x the L2), each call timed inside one CUDA graph
(`engine.fast.measure.graph_per_call_us`). Per product: `StreamTiles` as it is (`today`), a grid of tiles (output
columns, K per load, warps, K loop unrolled (0) or pipelined over 1 / 3 tiles; 16 or 32 weight values a thread),
cuBLAS's bare product (`torch.matmul`, no norm) and, for the products with a prologue, today's tile without it.
Every result is checked against `gemv_reference` (relative L2 <= 1e-2; a wrong one is reported, not timed).
Prints one line per product and writes everything to --out. This chose `StreamTiles` on 2026-12-04.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HBM_BYTES = 200 << 20
# name: (N, K, norm prologue, SwiGLU) of the full-size talker; the dry run divides N and K by 64.
PRODUCTS = {"qkv": (4096, 2048, True, False), "o": (2048, 2048, False, False),
            "gate_up": (12288, 2048, True, True), "down": (2048, 6144, False, False)}  # fmt: skip
COLUMNS, K_LOADS, WARPS, LOOP_STAGES = (4, 8, 16), (256, 512, 1024), (4, 8), (0, 1, 3)


def tile_grid(k: int, silu: bool) -> list[Any]:
    """The tiles tried for one product: 16 or 32 weight values a thread, K unrolled only up to 8 loads."""
    from engine.fast.kernels.gemv import GemvConfig

    grid = []
    for columns, k_load, warps, stages in itertools.product(COLUMNS, K_LOADS, WARPS, LOOP_STAGES):
        per_thread = columns * k_load * (2 if silu else 1) / (32 * warps)
        if per_thread in (16, 32) and not (stages == 0 and k // k_load > 8):
            grid.append(GemvConfig(block_n=columns, block_k=k_load, num_warps=warps, loop_stages=stages))
    return grid


def label(config: Any) -> str:
    return f"{config.block_n}/{config.block_k}/{config.num_warps}/{config.loop_stages}"


def bench_product(name: str, rows: int, device: str, scale: int, grid_limit: int | None) -> dict[str, Any]:
    import torch

    from engine.fast.decoder import StreamTiles
    from engine.fast.kernels.gemv import gemv, gemv_reference
    from engine.fast.measure import graph_per_call_us, relative_l2

    n, k, norm, silu = PRODUCTS[name]
    n, k = n // scale, k // scale
    timed = device == "cuda"
    gen = torch.Generator(device=device).manual_seed(0)
    copies = max(4, math.ceil(HBM_BYTES / (n * k * 2))) if timed else 1
    weights = [torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * 0.02 for _ in range(copies)]
    x = torch.randn(rows, k, device=device, dtype=torch.bfloat16, generator=gen)
    kwargs: dict[str, Any] = {"silu_mul": silu}
    if norm:
        kwargs |= {"residual": torch.randn(rows, k, device=device, dtype=torch.bfloat16, generator=gen),
                   "norm_weight": (1 + 0.1 * torch.randn(k, device=device, generator=gen)).to(torch.bfloat16),
                   "eps": 1e-6}  # fmt: skip
    truth = gemv_reference(x, weights[0], **kwargs)[0].float()
    out = torch.empty(rows, n // 2 if silu else n, device=device, dtype=torch.bfloat16)
    total = torch.empty(rows, k, device=device, dtype=torch.bfloat16) if norm else None
    today = getattr(StreamTiles(), name)
    tiles = [("today", today)] + [(label(c), c) for c in tile_grid(k, silu)[:grid_limit]]
    result: dict[str, Any] = {"rows": rows, "n": n, "k": k, "tiles": [], "wrong": []}
    for tile_name, config in tiles:
        def call(w: Any, config: Any = config) -> None:
            gemv(x, w, config=config, out=out, sum_out=total, **kwargs)

        call(weights[0])
        error = relative_l2(out.float(), truth)
        if not error <= 1e-2:
            result["wrong"].append({"tile": tile_name, "error": error})
            continue
        us = graph_per_call_us([lambda w=w: call(w) for w in weights], repeats=9) if timed else None
        result["tiles"].append({"tile": tile_name, "us": us})
    if timed:
        result["cublas_us"] = graph_per_call_us([lambda w=w: torch.matmul(x, w.T) for w in weights], repeats=9)
        if norm:
            result["today_without_prologue_us"] = graph_per_call_us(
                [lambda w=w: gemv(x, w, config=today, silu_mul=silu) for w in weights], repeats=9
            )
        ranked = sorted(result["tiles"], key=lambda t: t["us"])
        result["best"] = ranked[:6]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1, choices=(1, 2))
    parser.add_argument("--products", nargs="+", default=list(PRODUCTS), choices=list(PRODUCTS))
    parser.add_argument("--out", type=Path, default=Path("talker_tiles.json"))
    parser.add_argument("--dry-run", action="store_true", help="CPU, Triton's interpreter, tiny shapes, 3 tiles")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before engine.fast.kernels is imported
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device: run on the GPU machine, or use --dry-run")
    device, scale, limit = ("cpu", 64, 2) if args.dry_run else ("cuda", 1, None)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (dry run)",
                              "torch": torch.__version__, "products": {}}  # fmt: skip
    for name in args.products:
        result = bench_product(name, args.rows, device, scale, limit)
        report["products"][name] = result
        if device == "cuda":
            today = next((t["us"] for t in result["tiles"] if t["tile"] == "today"), None)
            best = ", ".join(f"{t['tile']} {t['us']:.2f}" for t in result["best"][:3])
            bare = result.get("today_without_prologue_us")
            print(f"{name:8s} rows {args.rows}: today {today} us, without prologue {bare}, cuBLAS "
                  f"{result['cublas_us']:.2f}; best (columns/K/warps/stages) {best}; wrong {len(result['wrong'])}")  # fmt: skip
        else:
            print(f"{name:8s} {len(result['tiles'])} tiles agree with the twin, {len(result['wrong'])} wrong")
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 1 if any(r["wrong"] for r in report["products"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
