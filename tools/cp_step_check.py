"""The persistent code-predictor step (`engine.fast.kernels.cp_step`) on the GPU against its twins (GPU only).

    python tools/cp_step_check.py [--batches 1 16 64 128] [--out cp_step_check.json]

Full-size 1.7B with random bf16 weights. For each batch size and both step kinds (the frame's 2-token first step
from stacked rows, a 1-token step from a table lookup) it runs the step four ways on the same inputs and caches:
persistent (one launch, grid barriers), phased (one launch per phase, the same programs and tiles: it must be
bitwise the persistent result, or a barrier let a program read too early), the per-kernel fused step
(`CodePredictorGraphs.step_logits`) and the torch twin (`step_reference`); it reports the logits' largest
difference to the twin relative to the twin's spread, the same for the per-kernel step (the bar to meet), and
repeats the persistent launch 20 times to show the barrier counters reset (every repeat bitwise equal). Then the
CUDA-event median of each way's step. With `--timeline`, one more persistent launch of each step records when every
program starts and ends every phase (`StepTiles.timeline`), summarised per kind of phase: its span (from the last
program starting it to the last starting the next: what it adds to the step) and its slowest program's work.
Exit status 1 when persistent and phased differ or a repeat differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.fast.measure import cuda_median_ms  # noqa: E402

PHASE_KINDS = ("norm_in", "qkv", "attention", "o", "norm_post", "gate_up", "down")


def timeline(step: Any, run: Any) -> dict[str, dict[str, float]]:
    """One persistent launch with `StepTiles.timeline` -> per kind of phase, summed over the step: span (the last
    program's start of the next phase minus its start of this one) and the slowest program's work, in us."""
    tiles = step.tiles
    step.tiles = replace(tiles, timeline=True)
    try:
        run("persistent")
        torch.cuda.synchronize()
    finally:
        step.tiles = tiles
    stamps = step.timeline().double()  # [2 * phases, programs] ns
    phases = stamps.shape[0] // 2
    starts, ends = stamps[0::2], stamps[1::2]
    out: dict[str, dict[str, float]] = {}
    for phase in range(phases):
        if phase == 0:
            kind = "proj"
        elif phase == phases - 2:
            kind = "norm_out"
        elif phase == phases - 1:
            kind = "head"
        else:
            kind = PHASE_KINDS[(phase - 1) % len(PHASE_KINDS)]
        following = starts[phase + 1].max() if phase + 1 < phases else ends[phase].max()
        cell = out.setdefault(kind, {"span": 0.0, "work": 0.0})
        cell["span"] += (following - starts[phase].max()).item() / 1000
        cell["work"] += (ends[phase] - starts[phase]).max().item() / 1000
    out["total"] = {"span": (ends[-1].max() - starts[0].min()).item() / 1000,
                    "work": sum(cell["work"] for cell in out.values())}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 128])
    p.add_argument("--out", default="cp_step_check.json")
    p.add_argument("--timeline", action="store_true", help="per-phase times inside the persistent launch")
    p.add_argument("--programs-per-sm", type=int, default=1, help="persistent programs per SM (`StepTiles`)")
    p.add_argument("--max-registers", type=int, default=None, help="register cap a thread (`StepTiles`)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA device")
    from engine.executors.slots import GenerationSlots, new_code_buffer
    from engine.fast.code_predictor_graph import CodePredictorGraphs, FrameKernels
    from engine.fast.kernels.cp_step import StepTiles, step_reference
    from engine.model.weights import load_model

    torch.manual_seed(0)
    model = load_model("1.7b", device="cuda", dtype=torch.bfloat16)
    c = model.config.talker
    top = max(args.batches)
    slots = GenerationSlots(top, c.hidden_size, c.vocab_size, device=model.device, dtype=model.dtype)
    codes = new_code_buffer(top, 4, model.device)
    graphs = CodePredictorGraphs(model, slots, codes, [top], use_graphs=False,
                                 kernels=FrameKernels(persistent_min_rows=1,
                                                      step_tiles=StepTiles(programs_per_sm=args.programs_per_sm,
                                                                           max_registers=args.max_registers)))  # fmt: skip
    step = graphs.persistent
    assert step is not None
    phased = replace(step.tiles, persistent=False)
    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": {}}
    failures = []
    gen = torch.Generator(device="cuda").manual_seed(2)
    with torch.inference_mode():
        for b in args.batches:
            x2 = torch.randn(2 * b, c.hidden_size, device="cuda", generator=gen).to(model.dtype)
            codes1 = torch.randint(0, 2048, (b, 16), device="cuda", generator=gen)
            kinds = {"first": (x2, None, 0, 2), "lookup": (graphs.tables[3], codes1[:, 4], 5, 1)}
            for kind, (x, index, start, tokens) in kinds.items():
                kv = graphs.cache.kv
                kv.normal_(generator=gen)  # earlier positions' keys and values
                head = max(1, start) - 1

                def run(way: str, x: Any = x, index: Any = index, start: int = start, tokens: int = tokens,
                        head: int = head) -> torch.Tensor:  # fmt: skip
                    if way == "per_kernel":
                        saved, graphs.persistent = graphs.persistent, None
                        try:
                            return graphs.step_logits(x, index, start, tokens)
                        finally:
                            graphs.persistent = saved
                    if way == "reference":
                        return step_reference(step.weights, x, index, head, graphs.cos, graphs.sin, graphs.cache.kv, start,
                                              tokens)
                    tiles = step.tiles
                    step.tiles = phased if way == "phased" else tiles
                    try:
                        return step.logits(x, index, head, graphs.cos, graphs.sin, start, tokens)
                    finally:
                        step.tiles = tiles

                out = {way: run(way).float().clone() for way in ("reference", "per_kernel", "phased", "persistent")}
                spread = out["reference"].std().item()
                repeats_equal = all(torch.equal(run("persistent").float(), out["persistent"]) for _ in range(20))
                row = {
                    "persistent_equals_phased": torch.equal(out["persistent"], out["phased"]),
                    "repeats_equal": repeats_equal,
                    "persistent_vs_twin": (out["persistent"] - out["reference"]).abs().max().item() / spread,
                    "per_kernel_vs_twin": (out["per_kernel"] - out["reference"]).abs().max().item() / spread,
                    "argmax_agree": out["persistent"].argmax(-1).eq(out["reference"].argmax(-1)).float().mean().item(),
                }
                for way in ("persistent", "phased", "per_kernel"):
                    row[f"{way}_us"] = 1000 * cuda_median_ms(lambda w=way: run(w), repeats=30, warmup=5)
                if args.timeline:
                    row["timeline_us"] = timeline(step, run)
                if not (row["persistent_equals_phased"] and repeats_equal):
                    failures.append(f"B={b} {kind}")
                report["rows"][f"{b}_{kind}"] = row
                print(f"B={b} {kind}", json.dumps(row), flush=True)
    report["failures"] = failures
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print("\nB    step     persistent / phased / per-kernel us   err vs twin: persistent / per-kernel   bitwise")
    for key, row in report["rows"].items():
        b, kind = key.split("_")
        print(f"{b:<4} {kind:<8} {row['persistent_us']:8.1f} / {row['phased_us']:8.1f} / {row['per_kernel_us']:8.1f}"
              f"       {row['persistent_vs_twin']:.2e} / {row['per_kernel_vs_twin']:.2e}"
              f"   {row['persistent_equals_phased'] and row['repeats_equal']}")  # fmt: skip
    for key, row in report["rows"].items():
        if "timeline_us" in row:
            cells = "  ".join(f"{kind} {v['span']:.1f}/{v['work']:.1f}" for kind, v in row["timeline_us"].items())
            print(f"{key} phases, us span/slowest work (summed over the step): {cells}")
    print(f"failures: {failures or 'none'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
