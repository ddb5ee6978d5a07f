"""Where a frame step's GPU time goes: talker decode and code-predictor frame per kernel variant (GPU only).

    python tools/frame_profile.py [--batches 1 64] [--variants defaults pdl norms_apart ...] [--out frame_profile.json]
    python tools/frame_profile.py --dry-run --batches 1 64 --context 16 --variants ...   # CPU: the variants' plumbing

On the full-size model with random bf16 weights, the engine's talker graphs and each variant's code-predictor
graphs are built at the given batch sizes, all before any timing, then timed round-robin (CUDA-event medians of
replays in each of five rounds, the median of the rounds; talker contexts drawn from 256..511, as
`loadtest.gpu_check` does; `--context N` draws them from N/2..N-1, and `--exact-context` puts every row at N: the
floors of ../shared/reference/h200-floors.md, against which the frame-step targets are set, are at context 128).
Building and timing one variant after another biased the later ones: on 2026-12-02 the second variant built
measured 5-10 % slower in the talker, whose graphs it had not changed. Variants change the code predictor's
`FrameKernels`, or (`sixteenth`, `talker_*`, `tattn_*`) the talker's decode options: `tools/frame_variants.py`
names them (`--help` lists them), knockouts included, which capture a graph without one kind of kernel.

The variants in `frame_variants.BITWISE` must draw bitwise the same codes, hidden states and caches as `defaults`
(checked over three frame steps; exit status 1 if one differs; the others report whether theirs agree). Then the
kernels of one replay of each (torch profiler): calls, microseconds, and the replay's span minus its kernels' time
(the gaps between kernels). Prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.fast.measure import cuda_median_ms  # noqa: E402
from tools import frame_variants  # noqa: E402
from tools.codec_profile import kernel_table as codec_kernel_table  # noqa: E402
from tools.frame_variants import BITWISE, VARIANTS, attention_config, frame_kernels, knocked_out, talker_key  # noqa: E402

CONTEXT = 512
ROUNDS = 5


def build(model: Any, variants: list[str], batches: list[int], context: int) -> dict[str, Any]:
    """One talker graph set and one code-predictor graph set per variant, all over the same slots and caches,
    all captured before anything is timed (so no variant is timed on a device that has aged differently)."""
    from engine.executors.slots import GenerationSlots, new_code_buffer
    from engine.fast.code_predictor_graph import CodePredictorGraphs
    from engine.fast.talker_graph import TalkerGraphs

    c = model.config.talker
    slots = GenerationSlots(max(batches), c.hidden_size, c.vocab_size, device=model.device, dtype=model.dtype)
    cache = model.talker.new_cache(max(batches), context + 8)
    codes = new_code_buffer(max(batches), 64, model.device)
    talkers = {}  # one graph set per talker configuration the variants use
    for key in dict.fromkeys(talker_key(v) for v in variants):
        rows, rope, chain, tiles, attention, draw, knockout = key
        with attention_config(attention), knocked_out(knockout, "ko_talker_"):
            talkers[key] = TalkerGraphs(model, slots, cache, batches, gemv_max_rows=rows, fused_rope=rope,
                                        chain_rows=chain, fused_draw=draw,
                                        chain_tiles=frame_variants.graph_tiles(tiles))  # fmt: skip
            talkers[key].decode_steps.capture()
    predictors = {}
    for variant in variants:
        started = time.perf_counter()
        predictors[variant] = CodePredictorGraphs(model, slots, codes, batches, kernels=frame_kernels(variant))
        with knocked_out(variant, "ko_cp_"):
            predictors[variant].capture()
        progress(f"built {variant} in {time.perf_counter() - started:.0f} s")
    return dict(model=model, slots=slots, cache=cache, codes=codes, talkers=talkers, predictors=predictors)


def load(env: dict[str, Any], variant: str, b: int, lengths: list[int]) -> None:
    from loadtest.gpu_check import fill_state, load_talker_step

    fill_state(env, lengths + [0] * (env["slots"].hidden.shape[0] - b))
    rows = list(range(b))
    talker = env["talkers"][talker_key(variant)]
    load_talker_step(talker, b, lengths)
    env["predictors"][variant].inputs.load(b, kv_slot=rows, stream=rows, frame=[0] * b)


def outputs(env: dict[str, Any], variant: str, b: int, lengths: list[int]) -> list[torch.Tensor]:
    """Three frame steps (talker decode, then the variant's frame) from one fixed state."""
    load(env, variant, b, lengths)
    seen = []
    for _ in range(3):
        env["talkers"][talker_key(variant)].decode_steps.replay(b)
        env["predictors"][variant].steps.replay(b)
        seen += [
            env["slots"].hidden[:b].clone(),
            env["codes"][:b, 0].clone(),
            env["slots"].frame_embed[:b].clone(),
        ]
    if env["cache"].kv.is_cuda:
        torch.cuda.synchronize()
    seen.append(env["cache"].kv[:, :, :b].clone())
    return seen


def dry_run(args: argparse.Namespace) -> int:
    """The variants on the CPU with the tiny fp32 model, through the kernels' twins: each one built and run for
    three frame steps, no timings; the `BITWISE` ones must equal the defaults. Proves the variants' plumbing before
    device time is spent (the tiles themselves only matter to Triton on a GPU)."""
    from engine.model.weights import load_model
    from loadtest import gpu_check

    gpu_check.DEVICE = "cpu"  # (its fill_state draws the slots' random state there)
    torch.manual_seed(0)
    model = load_model("tiny", device="cpu", dtype=torch.float32)
    names = list(dict.fromkeys(["defaults", *args.variants]))
    with torch.inference_mode():
        env = build(model, names, args.batches, args.context)
        seen = {name: {b: outputs(env, name, b, [args.context] * b) for b in args.batches} for name in names}
    differ = []
    for name in names[1:]:
        equal = all(torch.equal(x, y) for b in args.batches for x, y in zip(seen[name][b], seen["defaults"][b],
                                                                              strict=True))  # fmt: skip
        note = " (a knockout acts in captured graphs only)" if "ko_" in name else ""
        print(f"{name:<40} ran; bitwise the defaults' on the CPU twins: {equal}{note}")
        if name in BITWISE and not equal:
            differ.append(name)
    return 1 if differ else 0


def progress(line: str) -> None:
    """A progress line on stderr, at once: a run cut short by its time limit still shows how far it got."""
    print(line, file=sys.stderr, flush=True)


def kernel_table(fn: Any, replays: int = 5) -> dict[str, Any]:
    """Kernels of `replays` replays (`tools.codec_profile.kernel_table`): per name calls and us per replay, their
    total and count."""
    launches, rows = codec_kernel_table(fn, replays)
    return {"kernels": rows, "kernel_us": sum(r["us"] for r in rows), "launches": launches}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=f"{__doc__}\n{frame_variants.__doc__}",
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS),
                   help="names below, or several joined by + (e.g. attn_late+split4+talker_chain_all)")
    p.add_argument("--context", type=int, default=CONTEXT, help="talker contexts drawn from N/2..N-1")
    p.add_argument("--exact-context", action="store_true", help="every talker row at exactly --context")
    p.add_argument("--teacher-forced", action="store_true",
                   help="also each variant's 15 steps' logits, teacher-forced, against an fp32 code predictor at "
                        "every batch size: error / the plain bf16 predictor's <= 1.1 (`tools/cp_kernels_check.py`)")
    p.add_argument("--out", default="frame_profile.json")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU, tiny fp32 model: build and run every variant through the kernels' twins, no timings")
    args = p.parse_args(argv)
    for variant in args.variants:
        if problem := frame_variants.refusal(variant):
            p.error(problem)
    if args.dry_run:
        return dry_run(args)
    if not torch.cuda.is_available():
        p.error("needs a CUDA device (or --dry-run on the CPU)")
    from engine.model.weights import load_model

    torch.manual_seed(0)
    model = load_model("1.7b", device="cuda", dtype=torch.bfloat16)
    progress("model loaded")
    gen = torch.Generator().manual_seed(1)
    contexts = {b: [args.context] * b if args.exact_context else
                torch.randint(args.context // 2, args.context, (b,), generator=gen).tolist() for b in args.batches}
    report: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "context": args.context if args.exact_context else f"{args.context // 2}..{args.context - 1}",
        "variants": {},
    }
    with torch.inference_mode():
        env = build(model, args.variants, args.batches, args.context)
        if args.teacher_forced:
            from tools.cp_kernels_check import teacher_forced

            ratios = {}
            for b in args.batches:
                forced = teacher_forced({"model": model}, env["predictors"], batch=b)
                ratios[b] = forced["max_ratio_vs_plain"]
                progress(f"teacher-forced B={b}: error / plain bf16's " + json.dumps(ratios[b]))
            report["teacher_forced_ratio"] = ratios
        seen = {name: {b: outputs(env, name, b, contexts[b]) for b in args.batches} for name in args.variants}
        # Round-robin timing: every round times the talker and each variant's frame once per batch size, so a
        # device that slows as it warms weighs on every variant alike; the medians of the rounds are reported.
        times: dict[str, dict[int, dict[str, list[float]]]] = {
            name: {b: {"talker_ms": [], "cp_ms": []} for b in args.batches} for name in args.variants
        }
        for round_number in range(ROUNDS):
            for name in args.variants:
                predictor, talker = env["predictors"][name], env["talkers"][talker_key(name)]
                for b in args.batches:
                    load(env, name, b, contexts[b])
                    times[name][b]["talker_ms"].append(
                        cuda_median_ms(lambda b=b, t=talker: t.decode_steps.replay(b), repeats=20, warmup=3))
                    times[name][b]["cp_ms"].append(
                        cuda_median_ms(lambda b=b, c=predictor: c.steps.replay(b), repeats=20, warmup=3))
                    progress(f"round {round_number} {name} B={b}: talker {times[name][b]['talker_ms'][-1]:.3f} "
                             f"CP {times[name][b]['cp_ms'][-1]:.3f} ms")  # fmt: skip
        for name in args.variants:
            predictor, talker = env["predictors"][name], env["talkers"][talker_key(name)]
            result: dict[str, Any] = {}
            for b in args.batches:
                talker_ms, cp_ms = (statistics.median(times[name][b][k]) for k in ("talker_ms", "cp_ms"))
                result[b] = {"talker_ms": talker_ms, "cp_ms": cp_ms, "frame_ms": talker_ms + cp_ms}
            profiles = {}
            for b in args.batches:
                load(env, name, b, contexts[b])
                profiles[f"talker_{b}"] = kernel_table(lambda b=b, t=talker: t.decode_steps.replay(b))
                profiles[f"cp_{b}"] = kernel_table(lambda b=b, c=predictor: c.steps.replay(b))
                for key, kind in ((f"talker_{b}", "talker_ms"), (f"cp_{b}", "cp_ms")):
                    profiles[key]["span_us"] = result[b][kind] * 1000
                    profiles[key]["gap_us"] = profiles[key]["span_us"] - profiles[key]["kernel_us"]
            result["profiles"] = profiles
            if name != "defaults" and "defaults" in seen:
                result["bitwise_equal"] = all(torch.equal(x, y) for b in args.batches
                                              for x, y in zip(seen[name][b], seen["defaults"][b], strict=True))  # fmt: skip
                # codes of the three frames (every third output from the second) that equal the defaults'
                result["codes_agree"] = {b: statistics.mean(
                    torch.eq(seen[name][b][i], seen["defaults"][b][i]).float().mean().item() for i in (1, 4, 7))
                    for b in args.batches}  # fmt: skip
            report["variants"][name] = result
            print(name, json.dumps({b: result[b] for b in args.batches}), flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    for name in dict.fromkeys((args.variants[0], args.variants[-1])):
        for key, prof in report["variants"][name]["profiles"].items():
            print(f"\n{key} ({name}): span {prof['span_us']:.0f} us, kernels {prof['kernel_us']:.0f} us in "
                  f"{prof['launches']:.0f} launches, gaps {prof['gap_us']:.0f} us; heaviest:")  # fmt: skip
            for row in prof["kernels"][:6]:
                print(f"  {row['us']:8.1f} us  {row['calls']:5.0f} x  {row['name'][:70]}")
    print("\nvariant    " + "  ".join(f"B={b}: talker / CP / frame ms" for b in args.batches) + "  bitwise")
    for name, result in report["variants"].items():
        cells = "  ".join(f"{result[b]['talker_ms']:6.3f} / {result[b]['cp_ms']:6.3f} / {result[b]['frame_ms']:6.3f}"
                          for b in args.batches)  # fmt: skip
        agree = " ".join(f"{v:.3f}" for v in result.get("codes_agree", {}).values())
        print(f"{name:<10} {cells}  {result.get('bitwise_equal', '-')} {agree}")
    for b, ratios in report.get("teacher_forced_ratio", {}).items():
        print(f"teacher-forced B={b}, error / plain bf16's (<= 1.1): "
              + ", ".join(f"{name} {ratio:.3f}" for name, ratio in ratios.items()))  # fmt: skip
    forced_ok = all(r <= 1.1 for ratios in report.get("teacher_forced_ratio", {}).values() for r in ratios.values())
    return 0 if forced_ok and all(report["variants"].get(v, {}).get("bitwise_equal", True) for v in BITWISE) else 1


if __name__ == "__main__":
    sys.exit(main())
