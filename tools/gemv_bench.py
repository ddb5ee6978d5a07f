"""Microbenchmark of the code predictor's products as the frame streams them: weights from HBM, not L2.

A CP step reads 165 MB of weights through 22 products of 4-12 MB. Timing one product replayed on the same
weight measures L2 (60 MiB) instead: here every timed graph cycles through copies of the weight whose sum is
over 3x L2, so each call streams its weight from HBM as in the frame. For each product shape and token-row
count it times, per call (CUDA graph of many calls, CUDA-event median):

    cublas      F.linear
    engine      `engine.fast.kernels.gemv.gemv` at its configured tiles (DEFAULT_GEMV)
    late        a CUDA-core product accumulating the [BN, BK] tile products and summing once at the end
    splitk      `late` cut along K too (fp32 atomics into a zeroed output: speed only, not deterministic)
    dot_splitk  tensor-core tiles cut along K (16+ rows)
    read        a kernel that only reads the weight (the per-call floor at this size, launch included)

over a grid of tile shapes, and prints the best of each against the copy bandwidth. Every variant's output
is checked against an fp32 product (relative L2 <= 1e-2), so a fast wrong kernel cannot win.

    python tools/gemv_bench.py [--rows 1,2,64,128] [--out gemv_bench.json] [--workers 12]
    python tools/gemv_bench.py --chain      # a frame's 330 products in one graph: norm placement x PDL
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from engine.fast.measure import cuda_median_ms, graph_per_call_us, relative_l2  # noqa: E402

COPY_BANDWIDTH = 4255e9  # B/s, h200-floors.md
HBM_BYTES = 200 << 20  # each timed graph streams this much weight: > 3x the 60 MiB L2
SHAPES = {  # name: (N, K) of the full-size code predictor
    "proj": (1024, 2048), "qkv": (4096, 1024), "o": (1024, 2048),
    "gate_up": (6144, 1024), "down": (1024, 3072), "head": (2048, 1024),
    "talker_qkv": (4096, 2048), "talker_o": (2048, 2048), "talker_gate_up": (12288, 2048), "talker_down": (2048, 6144),
}  # fmt: skip


@triton.jit
def _late_kernel(x_ptr, w_ptr, out_ptr, K: tl.constexpr, K_PER: tl.constexpr, R: tl.constexpr,
                 BN: tl.constexpr, BK: tl.constexpr, ATOMIC: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    n = pid_n * BN + tl.arange(0, BN)
    w_rows = w_ptr + n.to(tl.int64)[:, None] * K
    base = pid_k * K_PER
    acc0 = tl.zeros([BN, BK], dtype=tl.float32)
    acc1 = tl.zeros([BN, BK], dtype=tl.float32)
    for k0 in tl.range(0, K_PER, BK, num_stages=STAGES):
        kk = base + k0 + tl.arange(0, BK)
        w = tl.load(w_rows + kk[None, :]).to(tl.float32)
        acc0 += w * tl.load(x_ptr + kk).to(tl.float32)[None, :]
        if R == 2:
            acc1 += w * tl.load(x_ptr + K + kk).to(tl.float32)[None, :]
    y0 = tl.sum(acc0, axis=1)
    if ATOMIC:
        tl.atomic_add(out_ptr + n, y0, sem="relaxed")
    else:
        tl.store(out_ptr + n, y0.to(out_ptr.dtype.element_ty))
    if R == 2:
        y1 = tl.sum(acc1, axis=1)
        if ATOMIC:
            tl.atomic_add(out_ptr + tl.num_programs(0) * BN + n, y1, sem="relaxed")
        else:
            tl.store(out_ptr + tl.num_programs(0) * BN + n, y1.to(out_ptr.dtype.element_ty))


@triton.jit
def _dot_kernel(x_ptr, w_ptr, out_ptr, rows, N, K: tl.constexpr, K_PER: tl.constexpr, BR: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    r = tl.arange(0, BR)
    n = pid_n * BN + tl.arange(0, BN)
    base = pid_k * K_PER
    acc = tl.zeros([BR, BN], dtype=tl.float32)
    for k0 in tl.range(0, K_PER, BK, num_stages=STAGES):
        kk = base + k0 + tl.arange(0, BK)
        x = tl.load(x_ptr + r[:, None] * K + kk[None, :], mask=(r < rows)[:, None], other=0.0)
        w = tl.load(w_ptr + n.to(tl.int64)[:, None] * K + kk[None, :])
        acc += tl.dot(x, tl.trans(w), out_dtype=tl.float32)
    tl.atomic_add(out_ptr + r[:, None] * N + n[None, :], acc, mask=(r < rows)[:, None], sem="relaxed")


@triton.jit
def _read_kernel(w_ptr, out_ptr, total, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(w_ptr + offsets, mask=offsets < total, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(v, axis=0))


def late_configs(rows: int) -> list[dict[str, int]]:
    out = []
    for bn, bk, warps, split, stages in itertools.product((4, 8, 16, 32), (256, 512, 1024), (4, 8), (1, 2, 4),
                                                          (1, 3)):  # fmt: skip
        per_thread = bn * bk * rows / (32 * warps)
        if 16 <= per_thread <= 64:
            out.append({"bn": bn, "bk": bk, "warps": warps, "split": split, "stages": stages})
    return out


def dot_configs() -> list[dict[str, int]]:
    return [{"bn": bn, "bk": bk, "warps": w, "split": s, "stages": st}
            for bn, bk, w, s, st in itertools.product((32, 64), (64, 128), (4,), (1, 2, 4, 8), (3, 4))]


def run_late(x: torch.Tensor, w: torch.Tensor, out32: torch.Tensor, out: torch.Tensor, c: dict[str, int]) -> None:
    n, k = w.shape
    rows = x.shape[0]
    split = c["split"]
    if split > 1:
        out32.zero_()
    target = out32 if split > 1 else out
    _late_kernel[(n // c["bn"], split)](x, w, target, K=k, K_PER=k // split, R=rows, BN=c["bn"], BK=c["bk"],
                                       ATOMIC=split > 1, STAGES=c["stages"], num_warps=c["warps"])  # fmt: skip


def run_dot(x: torch.Tensor, w: torch.Tensor, out32: torch.Tensor, c: dict[str, int]) -> None:
    n, k = w.shape
    out32.zero_()
    br = max(16, triton.next_power_of_2(x.shape[0]))
    _dot_kernel[(n // c["bn"], c["split"])](x, w, out32, x.shape[0], n, K=k, K_PER=k // c["split"], BR=br,
                                           BN=c["bn"], BK=c["bk"], STAGES=c["stages"], num_warps=c["warps"])  # fmt: skip


def valid(k: int, c: dict[str, int]) -> bool:
    per = k // c["split"]
    return k % c["split"] == 0 and per % c["bk"] == 0


def bench_shape(name: str, rows: int, only_compile: bool, share: tuple[int, int]) -> dict[str, Any]:
    n, k = SHAPES[name]
    nbytes = n * k * 2
    copies = max(4, math.ceil(HBM_BYTES / nbytes)) if not only_compile else 1
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02 for _ in range(copies)]
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    truth = x.float() @ weights[0].float().T
    out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    out32 = torch.empty(rows, n, device="cuda", dtype=torch.float32)
    result: dict[str, Any] = {"shape": name, "rows": rows, "mb": nbytes / 1e6, "floor_us": nbytes / COPY_BANDWIDTH * 1e6}

    def measure(label: str, fn: Any, check: Any) -> float | None:
        try:
            fn(weights[0])
            torch.cuda.synchronize()
            error = relative_l2(check(), truth)
            if not error <= 1e-2:
                result.setdefault("wrong", []).append(f"{label}: {error:.2e}")
                return None
            if only_compile:
                return None
            return graph_per_call_us([lambda w=w: fn(w) for w in weights], repeats=9)
        except Exception as exc:  # noqa: BLE001 - a config that fails to compile is reported, not fatal
            result.setdefault("errors", []).append(f"{label}: {type(exc).__name__}: {str(exc)[:120]}")
            return None

    candidates: list[tuple[str, dict[str, int] | None]] = [("cublas", None), ("engine", None), ("read", None)]
    if rows <= 2:
        candidates += [("late", c) for c in late_configs(rows) if valid(k, c)]
    if rows >= 16:
        candidates += [("dot_splitk", c) for c in dot_configs() if valid(k, c)]
    index, count = share
    if only_compile:
        candidates = [c for i, c in enumerate(candidates) if i % count == index]
    timings: dict[str, list[tuple[float, Any]]] = {}
    for kind, config in candidates:
        if kind == "cublas":
            us = measure(kind, lambda w: torch.matmul(x, w.T, out=out), lambda: out)
        elif kind == "engine":
            from engine.fast.code_predictor_graph import DEFAULT_GEMV
            from engine.fast.kernels.gemv import gemv

            if rows > 2:
                continue
            from engine.fast.kernels.gemv import STREAM_TILE

            cfg = DEFAULT_GEMV.get(name, STREAM_TILE)
            us = measure(kind, lambda w, cfg=cfg: gemv(x, w, config=cfg, out=out), lambda: out)
        elif kind == "read":
            block = 8192
            partial = torch.empty(triton.cdiv(n * k, block), device="cuda")
            us = measure(kind, lambda w, p=partial, b=block: _read_kernel[(p.numel(),)](w, p, n * k, BLOCK=b,
                                                                                  num_warps=8),  # fmt: skip
                         lambda: truth)
        elif kind == "late":
            us = measure(f"late {config}", lambda w, c=config: run_late(x, w, out32, out, c),
                         lambda c=config: out32 if c["split"] > 1 else out)  # fmt: skip
        else:
            us = measure(f"dot {config}", lambda w, c=config: run_dot(x, w, out32, c), lambda: out32)
        if us is not None:
            timings.setdefault(kind, []).append((us, config))
    best = {kind: min(t, key=lambda p: p[0]) for kind, t in timings.items()}
    result["best"] = {kind: {"us": us, "config": config, "tb_s": nbytes / us / 1e6}
                      for kind, (us, config) in best.items()}  # fmt: skip
    return result


def chain(rounds: int = 5) -> dict[str, Any]:
    """A code-predictor frame's 330 products alone (15 steps x [proj, 5 x (qkv, o, gate_up, down), head], the
    real weights' shapes and sizes, SwiGLU in gate|up), engine `gemv` at one row, as one CUDA graph per variant:
    the norms and residual adds in the products' prologues, in `rms_norm` kernels of their own ("norms
    apart"), or in the prologues of 16-column programs ("wide prologues": every program re-reads x, the
    residual and the norm weight, 4-6 KB, so 4x fewer programs read 4x less), each launched plainly or as
    programmatic dependents ("pdl"). -> ms per frame (median of rounds,
    variants alternating), whether PDL changed any bit, and how far apart the two norm placements land."""
    from engine.fast.kernels.gemv import GemvConfig, gemv
    from engine.fast.kernels.rmsnorm import rms_norm

    WIDE_TILE = GemvConfig(block_n=16, block_k=1024, num_warps=8)  # noqa: N806

    hidden, inter, heads, kv_heads, dim, inp = 1024, 3072, 16, 8, 128, 2048
    gen = torch.Generator(device="cuda").manual_seed(1)

    def weight(n: int, k: int) -> torch.Tensor:
        return torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02

    layers = [dict(qkv=weight((heads + 2 * kv_heads) * dim, hidden), o=weight(hidden, heads * dim),
                   gate_up=weight(2 * inter, hidden), down=weight(hidden, inter),
                   norm=1 + 0.1 * torch.randn(hidden, device="cuda", generator=gen).to(torch.bfloat16))
              for _ in range(5)]  # fmt: skip
    proj, bias, head = weight(hidden, inp), torch.zeros(hidden, device="cuda", dtype=torch.bfloat16), weight(2048, hidden)
    x0 = torch.randn(1, inp, device="cuda", dtype=torch.bfloat16, generator=gen)
    outs = {}

    def product(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None, norm: torch.Tensor | None,
                variant: str, **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        pdl = variant.endswith("pdl")
        if norm is not None and variant.startswith("wide prologues"):  # 4x fewer programs redo each row's norm
            return gemv(x, w, residual=residual, norm_weight=norm, pdl=pdl, config=WIDE_TILE, **kw)
        if norm is None or not variant.startswith("norms apart"):
            return gemv(x, w, residual=residual, norm_weight=norm, pdl=pdl, **kw)
        normed, total = rms_norm(x, norm, 1e-6, residual)  # its own kernel, then a prologue-free product
        return gemv(normed, w, pdl=pdl, **kw)[0], total

    def frame(variant: str) -> torch.Tensor:
        y = x0
        for _ in range(15):
            h, _ = gemv(y, proj, bias=bias, pdl=variant.endswith("pdl"))
            residual = None
            for layer in layers:
                qkv, total = product(h, layer["qkv"], residual, layer["norm"], variant)
                residual = h if total is None else total
                a, _ = product(qkv[:, : heads * dim], layer["o"], None, None, variant)  # q stands in for attention
                act, residual = product(a, layer["gate_up"], residual, layer["norm"], variant, silu_mul=True)
                h, _ = product(act, layer["down"], None, None, variant)
            y, _ = product(h, head, residual, layers[0]["norm"], variant)  # [1, 2048] = inp
        return y

    variants = ("prologues", "prologues pdl", "norms apart", "norms apart pdl", "wide prologues", "wide prologues pdl")
    graphs = {}
    for variant in variants:
        frame(variant)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs[variant] = frame(variant)
        graphs[variant] = graph
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for variant in variants:
            times[variant].append(cuda_median_ms(graphs[variant].replay, repeats=20, warmup=3))
    results: dict[str, torch.Tensor] = {}
    for variant in variants:
        graphs[variant].replay()
        torch.cuda.synchronize()
        results[variant] = outs[variant].clone()
    return {"ms": {v: sorted(t)[rounds // 2] for v, t in times.items()},
            "pdl_bitwise_equal": bool(torch.equal(results["prologues"], results["prologues pdl"])
                                      and torch.equal(results["norms apart"], results["norms apart pdl"])),
            "norms_apart_error": relative_l2(results["norms apart"], results["prologues"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,2,64,128")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--out", type=Path, default=Path("gemv_bench.json"))
    parser.add_argument("--workers", type=int, default=12, help="parallel compile processes (0: none)")
    parser.add_argument("--compile-share", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--chain", action="store_true",
                        help="only the frame's 330 one-row products in one graph, plain vs programmatic dependent launch")
    args = parser.parse_args(argv)
    if args.chain:
        result = chain()
        print(json.dumps(result))
        return 0 if result["pdl_bitwise_equal"] else 1
    rows = [int(r) for r in args.rows.split(",")]
    shapes = args.shapes.split(",")
    if args.compile_share:
        index, count = (int(v) for v in args.compile_share.split("/"))
        one_per_k = {SHAPES[name][1]: name for name in shapes}.values()  # compiled kernels depend on K, not N
        for name, r in itertools.product(one_per_k, rows):
            bench_shape(name, r, True, (index, count))
        return 0
    started = time.perf_counter()
    if args.workers:
        children = [subprocess.Popen([sys.executable, __file__, "--rows", args.rows, "--shapes", args.shapes,
                                      "--compile-share", f"{i}/{args.workers}"]) for i in range(args.workers)]  # fmt: skip
        for child in children:
            child.wait()
        print(f"compiled in {time.perf_counter() - started:.0f} s", flush=True)
    results = []
    for name, r in itertools.product(shapes, rows):
        results.append(bench_shape(name, r, False, (0, 1)))
        print(json.dumps(results[-1]), flush=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"\n{'shape':8} {'rows':>4} {'MB':>5} {'floor':>6}  " + "  ".join(
        f"{k:>16}" for k in ("cublas", "engine", "read", "late", "dot_splitk")))
    for res in results:
        cells = []
        for kind in ("cublas", "engine", "read", "late", "dot_splitk"):
            b = res["best"].get(kind)
            cells.append(f"{b['us']:7.2f}us {b['tb_s']:4.2f}TB" if b else " " * 16)
        print(f"{res['shape']:8} {res['rows']:>4} {res['mb']:5.1f} {res['floor_us']:5.2f}u  " + "  ".join(cells))
    for res in results:
        for kind in ("late", "dot_splitk"):
            if kind in res["best"]:
                print(res["shape"], res["rows"], kind, res["best"][kind]["config"])
        for key in ("wrong", "errors"):
            if res.get(key):
                print(res["shape"], res["rows"], key, len(res[key]), res[key][:2])
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
