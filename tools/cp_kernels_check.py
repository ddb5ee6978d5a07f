"""GPU check and microbenchmark of the code predictor's fused kernels and frame graphs (one H200, < 3 min).

Full-size code predictor (preset 1.7b: hidden 1024, 5 layers, 16/8 heads of 128, intermediate 3072,
vocab 2048, input 2048) with random bf16 weights (never zeros). Sections, each caught on its own so one
failure never hides the others:

1. kernels: `check_cp_kernels` (gemv with every prologue/epilogue, fused attention, sampler) against the
   twins at 1..128 rows, NaN-poisoned outputs and caches, fresh inputs; bf16 error <= 1e-2 and error
   against an fp32 twin <= 1.1x the bf16 twin's ("_ratio"); sampler tokens identical; fp32 <= 1e-4.
2. teacher-forced frame: the 15 steps' logits of the fused frame, the layered frame and the plain bf16
   predictor against an fp32 copy of the predictor (same tokens forced); fused error / plain error <= 1.1.
3. gemv sweep: every product shape at 1 and 64 rows, a few tile shapes vs cuBLAS, timed as a CUDA graph
   of 20 calls (per-call us and GB/s of weights streamed); stops at its time budget.
4. frames: the CP frame graph per variant (layered = the previous frame; fused defaults; fused with the
   sweep's best tiles; fused without norm prologues; fused with cuBLAS above 16 rows) at B = 1, 4, 16, 64,
   CUDA-event median of replays; codes agreement of each variant with the layered frame on one input.

    python tools/cp_kernels_check.py [--out cp_kernels_check.json] [--budget-s 170]
    python tools/cp_kernels_check.py --dry-run      # CPU, tiny fp32 model, twins only: proves the script

Prints a short table LAST. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.fast.kernels.gemv import GemvConfig, gemv  # noqa: E402
from engine.fast.measure import cuda_median_ms, graph_per_call_us, relative_l2  # noqa: E402

COPY_BANDWIDTH = 4255e9  # B/s, measured device-to-device copy on the H200 (h200-floors.md)
BATCHES = (1, 4, 16, 64)
TARGETS_MS = {1: 1.95, 64: 2.3}
SWEEP_ROWS = (1, 64)
SWEEP_TILES = (GemvConfig(8, 512), GemvConfig(16, 512), GemvConfig(32, 512), GemvConfig(16, 1024, 8),
               GemvConfig(64, 256, 8), GemvConfig(4, 1024))  # fmt: skip


class Clock:
    def __init__(self, budget_s: float) -> None:
        self.start, self.budget = time.perf_counter(), budget_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget - self.elapsed()


def build(preset: str, device: str, dtype: torch.dtype, max_batch: int) -> dict[str, Any]:
    from engine.executors.slots import GenerationSlots, new_code_buffer
    from engine.ipc.messages import Sampling
    from engine.model.weights import load_model

    model = load_model(preset, device=device, dtype=dtype)
    c = model.config.talker
    slots = GenerationSlots(max_batch, c.hidden_size, c.vocab_size, device=model.device, dtype=model.dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    for slot in range(max_batch):  # mixed settings: default top-k 50, greedy, top-k off, small top-k
        sampling = [Sampling(), Sampling(subtalker_greedy=True), Sampling(subtalker_top_k=0),
                    Sampling(subtalker_temperature=0.7, subtalker_top_k=5)][slot % 4]  # fmt: skip
        slots.start(slot, sampling, seed=1000 + slot)
    slots.hidden.normal_(generator=gen)
    slots.code0.random_(0, c.num_codes, generator=gen)
    return {"model": model, "slots": slots, "codes": new_code_buffer(max_batch, 4, model.device)}


def variants(best: dict[str, GemvConfig]) -> dict[str, Any]:
    from engine.fast.code_predictor_graph import DEFAULT_GEMV, FrameKernels

    out = {
        "layers (previous)": FrameKernels(fused=False),
        "fused": FrameKernels(),
        "fused, gemv up to 64 rows (before 2026-12-01)": FrameKernels(gemv_max_rows=64, prologue_max_rows=16),
        "fused, norms apart": FrameKernels(prologue_max_rows=0),
        "fused, cuBLAS >16 rows": FrameKernels(gemv_max_rows=16, prologue_max_rows=4, dot_gemv={}),
        "fused, cuBLAS from 3 rows (before 2026-12-04)": FrameKernels(dot_gemv={}),
        "fused, sampler radix 4": FrameKernels(radix_bits=4),
    }
    if best:
        out["fused, swept tiles"] = FrameKernels(gemv={**DEFAULT_GEMV, **best})
    return out


# ---------------------------------------------------------------- 1. kernels


def check_kernels(device: str) -> dict[str, Any]:
    from engine.fast.kernels.cp_selfcheck import check_cp_kernels

    rows = (1, 2, 4, 16, 64) if device == "cuda" else (1, 3)
    bf16 = check_cp_kernels(device, torch.bfloat16, rows=rows)
    fp32 = check_cp_kernels(device, torch.float32, rows=(1, 16))
    failures = [k for k, v in bf16.items() if k.endswith("_ratio") and not v <= 1.1]
    failures += [k for k, v in bf16.items() if k.startswith("sampler_r") and v != 0]
    failures += [
        k
        for k, v in bf16.items()
        if not k.endswith("_ratio") and not k.startswith("sampler_r") and not v <= 1e-2
    ]
    failures += [f"fp32 {k}" for k, v in fp32.items() if not v <= (0 if k.startswith("sampler_r") else 1e-4)]
    worst = {
        k: max(v for n, v in bf16.items() if n.startswith(k) and not n.endswith("_ratio"))
        for k in ("gemv", "cp_attention", "sampler_acc")
    }
    worst_ratio = max(v for k, v in bf16.items() if k.endswith("_ratio"))
    return {"bf16": bf16, "fp32": fp32, "failures": failures, "worst": worst, "worst_ratio": worst_ratio}


# ---------------------------------------------------------------- 2. teacher-forced frame


def teacher_forced(env: dict[str, Any], graphs: dict[str, Any], batch: int = 4) -> dict[str, Any]:
    model = env["model"]
    predictor = model.code_predictor
    c = predictor.config
    device = model.device
    reference = copy.deepcopy(predictor).float()
    gen = torch.Generator(device=device).manual_seed(7)
    hidden = torch.randn(batch, model.config.talker.hidden_size, device=device, generator=gen).to(model.dtype)
    code0 = torch.randint(0, model.config.talker.num_codes, (batch,), device=device, generator=gen)
    tokens = torch.randint(0, c.vocab_size, (batch, c.num_code_groups), device=device, generator=gen)
    x = torch.stack((hidden, model.talker.embed_codec(code0)), dim=1)  # [b,2,H]

    def plain(module: torch.nn.Module, dtype: torch.dtype) -> list[torch.Tensor]:
        cache = module.new_cache(batch)
        out = [module.logits(1, module(x.to(dtype), cache, 0)[:, 1])]
        for group in range(2, c.num_code_groups):
            step = module.embed_code(group - 1, tokens[:, group - 1])[:, None].to(dtype)
            out.append(module.logits(group, module(step, cache, group)[:, 0]))
        return out

    def fused(fast: Any) -> list[torch.Tensor]:
        out = [fast.step_logits(x.reshape(2 * batch, -1), None, 0, 2).float()]
        for group in range(2, c.num_code_groups):
            out.append(fast.step_logits(fast.tables[group - 2], tokens[:, group - 1], group, 1).float())
        return out

    def layered(fast: Any) -> list[torch.Tensor]:
        caches = [fast.cache.layer(i) for i in range(c.num_layers)]
        rows = torch.arange(batch, device=device)
        two = torch.arange(2, device=device).repeat(batch)
        h = fast._forward(x.reshape(2 * batch, -1), rows.repeat_interleave(2), two, caches, two + 1)
        out = [predictor.logits(1, h.view(batch, 2, -1)[:, 1])]
        for group in range(2, c.num_code_groups):
            step = predictor.embed_code(group - 1, tokens[:, group - 1])
            position = torch.full_like(rows, group)
            out.append(predictor.logits(group, fast._forward(step, rows, position, caches, position + 1)))
        return out

    with torch.inference_mode():
        truth = plain(reference, torch.float32)
        results = {"plain bf16": plain(predictor, model.dtype)}
        for name, fast in graphs.items():
            results[name] = fused(fast) if fast.kernels.fused else layered(fast)
    errors = {
        name: [relative_l2(v, t) for v, t in zip(values, truth, strict=True)]
        for name, values in results.items()
    }
    base = errors["plain bf16"]
    report: dict[str, Any] = {"max_error": {n: max(e) for n, e in errors.items()}}
    report["max_ratio_vs_plain"] = {n: max(a / max(b, 1e-30) for a, b in zip(e, base, strict=True))
                                    for n, e in errors.items() if n != "plain bf16"}  # fmt: skip
    if model.dtype == torch.float32:  # dry run: every path computes fp32, so compare errors, not ratios
        report["failures"] = [n for n, e in report["max_error"].items() if not e <= 1e-4]
    else:
        ratios = report["max_ratio_vs_plain"]
        report["failures"] = [n for n, r in ratios.items() if n.startswith("fused") and not r <= 1.1]
    return report


# ---------------------------------------------------------------- 3. gemv sweep


def graph_us(fn: Any, calls: int = 20, repeats: int = 15) -> float:
    """Per-call microseconds of `fn` replayed `calls` times inside one CUDA graph (launch cost as in a frame)."""
    return graph_per_call_us([fn] * calls, repeats=repeats)


def sweep(env: dict[str, Any], clock: Clock, budget_s: float) -> dict[str, Any]:
    model = env["model"]
    c = model.code_predictor.config
    hidden, inter, heads, width = c.hidden_size, c.intermediate_size, c.num_heads, c.head_dim
    qkv = (c.num_heads + 2 * c.num_kv_heads) * width
    shapes = {  # name: (N rows of W, K, gemv keywords builder)
        "proj": (hidden, c.input_size, "bias"), "qkv": (qkv, hidden, "norm"), "o": (hidden, heads * width, ""),
        "gate_up": (2 * inter, hidden, "silu"), "down": (hidden, inter, ""), "head": (c.vocab_size, hidden, "norm"),
    }  # fmt: skip
    stop = clock.elapsed() + budget_s
    table: dict[str, Any] = {}
    best: dict[str, GemvConfig] = {}
    for name, (n, k, kind) in shapes.items():
        weight = torch.randn(n, k, device="cuda").to(model.dtype) * k**-0.5
        norm = torch.rand(k, device="cuda").to(model.dtype) + 0.5
        bias = torch.randn(n, device="cuda").to(model.dtype) * 0.02
        for rows in SWEEP_ROWS:
            x, res = (torch.randn(rows, k, device="cuda").to(model.dtype) for _ in range(2))
            keywords: dict[str, Any] = {"bias": bias} if kind == "bias" else {}
            if kind in ("norm", "silu") and rows <= 16:
                keywords = {"residual": res, "norm_weight": norm, "silu_mul": kind == "silu"}
            elif kind == "silu":
                keywords = {"silu_mul": True}
            row: dict[str, Any] = {}
            cublas = graph_us(lambda x=x, w=weight: x @ w.T)
            row["cuBLAS matmul only"] = {"us": cublas, "GBps": weight.numel() * 2 / cublas / 1e3}
            for tile in SWEEP_TILES:
                label = f"n{tile.block_n} k{tile.block_k} w{tile.num_warps}"
                if clock.elapsed() > stop:
                    row[label] = {"skipped": "sweep budget spent"}
                    continue
                try:
                    us = graph_us(lambda x=x, w=weight, t=tile, kw=keywords: gemv(x, w, config=t, **kw))
                    row[label] = {"us": us, "GBps": weight.numel() * 2 / us / 1e3}
                except Exception as error:  # noqa: BLE001 - one tile's failure must not stop the sweep
                    row[label] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
            table[f"{name} r{rows}"] = row
            timed = {
                label: v["us"] for label, v in row.items() if "us" in v and not label.startswith("cuBLAS")
            }
            if rows == 1 and timed:
                label = min(timed, key=timed.__getitem__)
                best[name] = next(
                    t for t in SWEEP_TILES if f"n{t.block_n} k{t.block_k} w{t.num_warps}" == label
                )
    return {"table": table, "best_at_1_row": {k: vars_of(v) for k, v in best.items()}, "_best": best}


def vars_of(config: GemvConfig) -> dict[str, Any]:
    return {"block_n": config.block_n, "block_k": config.block_k, "num_warps": config.num_warps}


# ---------------------------------------------------------------- 4. frames


def frames(env: dict[str, Any], graphs: dict[str, Any], repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {"ms": {}, "codes_agree_with_layers": {}}
    slots, codes = env["slots"], env["codes"]
    saved = (slots.frame_embed.clone(), codes.clone())
    rows = list(range(max(BATCHES)))
    reference = None
    for name, fast in graphs.items():
        try:
            codes.zero_()
            fast.predict(rows, rows, [0] * len(rows))
            torch.cuda.synchronize()
            if reference is None:
                reference = codes[:, 0].clone()
            out["codes_agree_with_layers"][name] = float((codes[:, 0] == reference).float().mean())
            out["ms"][name] = {}
            for b in BATCHES:
                fast.inputs.load(b, kv_slot=rows[:b], stream=rows[:b], frame=[1] * b)
                out["ms"][name][b] = cuda_median_ms(
                    lambda f=fast, b=b: f.steps.replay(b), repeats=repeats, warmup=3
                )
        except Exception:  # noqa: BLE001 - report, keep timing the other variants
            out["ms"][name] = {"error": traceback.format_exc()[-1500:]}
    slots.frame_embed.copy_(saved[0])
    codes.copy_(saved[1])
    return out


def capture(
    env: dict[str, Any], kernels: dict[str, Any], clock: Clock, deadline_s: float
) -> tuple[dict, dict]:
    from engine.fast.code_predictor_graph import CodePredictorGraphs

    graphs, errors = {}, {}
    for name, k in kernels.items():
        if clock.elapsed() > deadline_s:
            errors[name] = "skipped: time budget spent"
            continue
        try:
            t0 = time.perf_counter()
            fast = CodePredictorGraphs(env["model"], env["slots"], env["codes"], BATCHES, kernels=k)
            fast.capture()
            graphs[name] = fast
            errors[name] = f"captured in {time.perf_counter() - t0:.1f} s"
        except Exception:  # noqa: BLE001
            errors[name] = traceback.format_exc()[-1500:]
    return graphs, errors


# ---------------------------------------------------------------- main


def summary(report: dict[str, Any]) -> str:
    lines = [f"== code predictor kernels ({report.get('gpu')}, commit {report.get('commit', '?')[:10]}, "
             f"{report.get('elapsed_s', 0):.0f} s)"]  # fmt: skip
    kernels = report.get("kernels", {})
    if "worst" in kernels:
        lines.append(f"kernels vs twins: worst {json.dumps({k: f'{v:.2e}' for k, v in kernels['worst'].items()})}; "
                     f"worst fp32-ratio {kernels['worst_ratio']:.3f} (<= 1.1)")  # fmt: skip
    forced = report.get("teacher_forced", {})
    if "max_ratio_vs_plain" in forced and report.get("gpu") == "cpu":  # fp32 dry run: ratios are meaningless
        lines.append("teacher-forced 15 steps, max error vs fp32: "
                     + ", ".join(f"{k} {v:.2e}" for k, v in forced["max_error"].items()))  # fmt: skip
    elif "max_ratio_vs_plain" in forced:
        lines.append("teacher-forced 15 steps, error vs fp32 / plain bf16's: "
                     + ", ".join(f"{k} {v:.3f}" for k, v in forced["max_ratio_vs_plain"].items()))  # fmt: skip
    gemvs = report.get("sweep", {}).get("table", {})
    for key, row in gemvs.items():
        timed = {k: v for k, v in row.items() if "GBps" in v}
        if timed:
            label = max(
                (k for k in timed if not k.startswith("cuBLAS")), key=lambda k: timed[k]["GBps"], default=None
            )
            cublas = timed.get("cuBLAS matmul only", {}).get("GBps", 0)
            if label:
                lines.append(f"gemv {key:<11} best {label:<15} {timed[label]['us']:6.2f} us {timed[label]['GBps']:5.0f} GB/s"
                             f"   cuBLAS {cublas:5.0f} GB/s")  # fmt: skip
    ms = report.get("frames", {}).get("ms", {})
    if ms:
        floor = report.get("floor_ms", 0.585)
        lines.append(f"CP frame graph, ms (median); floor {floor:.3f} ms; targets B=1 <= 1.95, B=64 <= 2.3")
        lines.append(f"{'variant':<26}" + "".join(f"{'B=' + str(b):>9}" for b in BATCHES) + "   codes=layers")
        agree = report["frames"].get("codes_agree_with_layers", {})
        for name, per in ms.items():
            cells = "".join(f"{per[b]:9.3f}" if b in per else f"{'err':>9}" for b in BATCHES)
            lines.append(f"{name:<26}{cells}   {agree.get(name, float('nan')):.3f}")
        for b in BATCHES:
            timed = {n: per[b] for n, per in ms.items() if b in per}
            if timed:
                name = min(timed, key=timed.__getitem__)
                target = TARGETS_MS.get(b)
                verdict = (
                    ""
                    if target is None
                    else f" (target {target}: {'met' if timed[name] <= target else 'missed'})"
                )
                lines.append(f"best at B={b}: {name} {timed[name]:.3f} ms{verdict}")
    lines.append(f"failures: {report.get('failures') or 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="cp_kernels_check.json")
    p.add_argument("--preset", default="1.7b")
    p.add_argument("--budget-s", type=float, default=170.0, help="stop starting new work after this long")
    p.add_argument("--repeats", type=int, default=30, help="timed replays per frame measurement")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny fp32 model, twins: checks only")
    p.add_argument("--skip-kernels", action="store_true", help="skip section 1 (its compiles take minutes)")
    p.add_argument("--skip-sweep", action="store_true", help="skip section 3")
    p.add_argument("--variants", type=int, default=0, help="time only the first N frame variants (0: all)")
    args = p.parse_args(argv)
    clock = Clock(args.budget_s)
    device = "cpu" if args.dry_run else "cuda"
    if not args.dry_run and not torch.cuda.is_available():
        p.error("no CUDA device: run on the GPU machine, or --dry-run")
    from loadtest.revision import source_revision

    commit = source_revision()
    report: dict[str, Any] = {"commit": commit, "command": " ".join(sys.argv), "torch": torch.__version__,
                              "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "cpu"}  # fmt: skip
    failures: list[str] = []
    sections: list[str] = []
    try:
        if not args.skip_kernels:
            report["kernels"] = check_kernels(device)
            failures += report["kernels"]["failures"]
    except Exception:  # noqa: BLE001
        report["kernels"] = {"error": traceback.format_exc()[-3000:]}
        failures.append("kernels section crashed")
    with torch.inference_mode():
        env = build("tiny" if args.dry_run else args.preset, device, torch.float32 if args.dry_run else torch.bfloat16,
                    max(BATCHES))  # fmt: skip
        cp = env["model"].code_predictor
        per_step = sum(p.numel() * p.element_size() for m in (cp.model.layers, cp.small_to_mtp_projection, cp.lm_head[0])
                       for p in m.parameters())  # fmt: skip
        report["floor_ms"] = (cp.config.num_code_groups - 1) * per_step / COPY_BANDWIDTH * 1e3
        kernels = variants({})
        if args.variants:
            kernels = dict(list(kernels.items())[: args.variants])
        if device == "cpu":
            from engine.fast.code_predictor_graph import CodePredictorGraphs

            graphs = {n: CodePredictorGraphs(env["model"], env["slots"], env["codes"], BATCHES, kernels=k)
                      for n, k in kernels.items()}  # fmt: skip
            report["capture"] = {}
        else:  # in priority order; each skipped once less than 40 s are left (Triton compiles on first use)
            graphs, report["capture"] = capture(env, kernels, clock, deadline_s=args.budget_s - 40)
        try:
            report["teacher_forced"] = teacher_forced(env, graphs)
            failures += report["teacher_forced"]["failures"]
        except Exception:  # noqa: BLE001
            report["teacher_forced"] = {"error": traceback.format_exc()[-3000:]}
            failures.append("teacher-forced section crashed")
        if device == "cuda":
            report["frames"] = frames(env, graphs, args.repeats)
            if not args.skip_sweep:
                try:
                    result = sweep(env, clock, budget_s=min(40.0, clock.left() - 30))
                    best = result.pop("_best")
                    report["sweep"] = result
                    extra = {k: v for k, v in variants(best).items() if k not in kernels}
                    more, captured = capture(env, extra, clock, deadline_s=args.budget_s - 15)
                    report["capture"].update(captured)
                    timed = frames(env, {"layers (previous)": graphs["layers (previous)"], **more}, args.repeats)
                    for name in more:
                        report["frames"]["ms"][name] = timed["ms"][name]
                        report["frames"]["codes_agree_with_layers"][name] = timed["codes_agree_with_layers"][name]
                except Exception:  # noqa: BLE001
                    report["sweep"] = {"error": traceback.format_exc()[-3000:]}
                    sections.append("sweep")
    report["failures"] = failures + [f"{s} section crashed" for s in sections]
    report["elapsed_s"] = clock.elapsed()
    Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    for name, section in report.items():
        if isinstance(section, dict) and "error" in section:
            print(f"-- {name} crashed:\n{section['error']}")
    for name, message in report.get("capture", {}).items():
        if not message.startswith("captured"):
            print(f"-- capture {name}: {message}")
    for name, per in report.get("frames", {}).get("ms", {}).items():
        if "error" in per:
            print(f"-- frame {name}:\n{per['error']}")
    print(summary(report))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
