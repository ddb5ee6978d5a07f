"""Where the talker's fused-rope decode attention spends a call, program by program (in-kernel clock; GPU only).

    python tools/attention_timeline.py [--batches 1 4 16 64] [--context 128] [--calls 5] [--out timeline.json]
    python tools/attention_timeline.py --chained [--batches 16 64] [--context 128]   # inside the talker's step

For each batch, the full-size talker's attention (16 query heads, 8 kv heads, head dim 128, bf16, the engine's
`default_split_config`) runs `--calls` times on other cache slots, each after a 256 MiB read that evicts the L2 (in
the talker's step, 28 layers' keys and values pass between two calls of one layer), once with every program's
stamps (`decode_attention_rope(timeline=...)`: %globaltimer at its start, after the PDL wait, once its queries are
normed, once the new key is in the cache, after its key loop, after its partial's store; and its SM). Prints the
split kernel's span (first program's start to last program's end), the median and 90th percentile of each stage,
how many programs an SM ran and how many started after the first had finished (a second wave), and the whole call
(split + merge kernels) timed with CUDA events without the stamps. Standalone, so no PDL: the wait stage is ~0.

`--chained`: the same stamps from inside the talker's captured decode step (the full-size model, random weights, the
engine's talker options, every row at `--context`), where each layer's attention is a programmatic dependent of its
qkv product: its programs start during the product's tail and wait (the wait stage), so the span that counts is
from the first program's release (the product done) to the last program's end (`after release`), per layer; the
medians over the 28 layers of one replay are printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.fast.kernels.decode_attention import (  # noqa: E402
    TIMELINE_NAMES,
    TIMELINE_STAGES,
    decode_attention_rope,
    default_split_config,
    split_layout,
)

HEADS, KV_HEADS, HEAD_DIM, CAPACITY, SLOTS = 16, 8, 128, 2048, 256  # a 2048-position cache, as tools/attention_bench.py
FLUSH_BYTES = 256 << 20


def stage_table(stamps: torch.Tensor) -> dict[str, Any]:
    """stamps int64 [programs, TIMELINE_STAGES] of one launch (rows of programs that ran) -> its summary."""
    t = stamps[:, :6].double() / 1e3  # us
    t = t - t[:, 0].min()
    span = float(t[:, 5].max())
    stages = {}
    for i, name in enumerate(TIMELINE_NAMES):
        d = t[:, i + 1] - t[:, i]
        stages[name] = {"median_us": float(d.quantile(0.5)), "p90_us": float(d.quantile(0.9))}
    per_sm = torch.bincount(stamps[:, 6])
    first_end = float(t[:, 5].min())
    return {"programs": int(stamps.shape[0]), "span_us": span, "stages": stages,
            "program_us_median": float((t[:, 5] - t[:, 0]).quantile(0.5)),
            "last_start_us": float(t[:, 0].max()), "started_after_first_end": int((t[:, 0] > first_end).sum()),
            "sms": int((per_sm > 0).sum()), "programs_per_sm_max": int(per_sm.max())}  # fmt: skip


def run(batch: int, context: int, calls: int) -> dict[str, Any]:
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (SLOTS, KV_HEADS, CAPACITY, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    v_cache = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    flush = torch.empty(FLUSH_BYTES // 4, device=device)
    width = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    config = default_split_config(batch)
    splits, _ = split_layout(CAPACITY, config)
    lengths = torch.full((batch,), context, device=device, dtype=torch.int64)
    weights = 1 + 0.1 * torch.randn(2, HEAD_DIM, generator=gen, device=device, dtype=torch.bfloat16)
    launches, whole_us = [], []
    for call in range(calls + 1):  # the first compiles
        slots = torch.arange(call * batch, (call + 1) * batch, device=device) % SLOTS
        qkv = torch.randn(batch, width, generator=gen, device=device, dtype=torch.bfloat16)
        cos, sin = torch.randn(2, batch, HEAD_DIM, generator=gen, device=device, dtype=torch.bfloat16)
        args = (qkv, cos, sin, weights[0], weights[1], 1e-6, k_cache, v_cache, slots, lengths, HEADS, KV_HEADS)
        flush.add_(1.0)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        decode_attention_rope(*args, config=config)
        end.record()
        stamps = torch.zeros(batch, KV_HEADS, splits, TIMELINE_STAGES, dtype=torch.int64, device=device)
        flush.add_(1.0)
        decode_attention_rope(*args, config=config, timeline=stamps)
        torch.cuda.synchronize()
        if call:
            rows = stamps.view(-1, TIMELINE_STAGES)
            launches.append(stage_table(rows[rows[:, 0] > 0].cpu()))
            whole_us.append(start.elapsed_time(end) * 1e3)
    middle = sorted(launches, key=lambda launch: launch["span_us"])[len(launches) // 2]
    return {"batch": batch, "context": context, "config": repr(config), "whole_call_us": sorted(whole_us),
            "median_launch": middle, "launches": launches}  # fmt: skip


def chained(batches: list[int], context: int, replays: int = 3) -> list[dict[str, Any]]:
    """The stamps of every layer's attention in the talker's captured decode step at each batch (`--chained`)."""
    from engine.executors.slots import GenerationSlots
    from engine.fast import talker_graph
    from engine.model.weights import load_model
    from loadtest.gpu_check import fill_state, load_talker_step
    from tools.frame_variants import talker_options

    model = load_model("1.7b", device="cuda", dtype=torch.bfloat16)
    c = model.config.talker
    slots = GenerationSlots(max(batches), c.hidden_size, c.vocab_size, device=model.device, dtype=model.dtype)
    cache = model.talker.new_cache(max(batches), context + 8)
    captured: dict[int, list[torch.Tensor]] = {b: [] for b in batches}  # per batch, each layer's stamps buffer
    original = talker_graph.decode_attention_rope

    def stamped(*args: Any, **kwargs: Any) -> torch.Tensor:
        qkv, k_cache, num_kv_heads = args[0], args[6], args[11]
        splits, _ = split_layout(k_cache.shape[2], kwargs.get("config") or default_split_config(qkv.shape[0]))
        stamps = torch.zeros(qkv.shape[0], num_kv_heads, splits, TIMELINE_STAGES, dtype=torch.int64,
                             device=qkv.device)  # fmt: skip
        if torch.cuda.is_current_stream_capturing():  # (the warm-up runs' buffers are dropped)
            captured[qkv.shape[0]].append(stamps)
        return original(*args, **kwargs, timeline=stamps)

    rows, rope, chain, tiles = talker_options("defaults")
    talker_graph.decode_attention_rope = stamped
    try:
        graphs = talker_graph.TalkerGraphs(model, slots, cache, batches, gemv_max_rows=rows, fused_rope=rope,
                                           chain_rows=chain, chain_tiles=tiles)  # fmt: skip
        graphs.decode_steps.capture()
    finally:
        talker_graph.decode_attention_rope = original
    points = []
    for b in batches:
        fill_state({"model": model, "slots": slots, "cache": cache}, [context] * b + [0] * (max(batches) - b))
        load_talker_step(graphs, b, [context] * b)
        for _ in range(replays):
            graphs.decode_steps.replay(b)
        torch.cuda.synchronize()
        layers = []
        for stamps in captured[b]:
            rows_ = stamps.view(-1, TIMELINE_STAGES)
            ran = rows_[rows_[:, 0] > 0].cpu()
            summary = stage_table(ran)
            release = ran[:, 1].min()  # the first program past its wait: the qkv product has completed
            summary["after_release_us"] = float(ran[:, 5].max() - release) / 1e3
            summary["started_before_release"] = int((ran[:, 0] < release).sum())
            layers.append(summary)
        points.append({"batch": b, "context": context, "layers": layers})
    return points


def print_chained(gpu: str, context: int, points: list[dict[str, Any]]) -> None:
    print(f"{gpu}, talker step at context {context}; medians over layers (stage: median / p90 us of a program)")
    print(f"{'B':>3} {'span us':>8} {'after release':>13} {'early progs':>11} {'progs':>6}  "
          + "  ".join(f"{name:>15}" for name in TIMELINE_NAMES))  # fmt: skip
    for point in points:
        layers = point["layers"]
        stages = "  ".join(f"{median_over(layers, name, 'median_us'):6.2f} / {median_over(layers, name, 'p90_us'):6.2f}"
                           for name in TIMELINE_NAMES)  # fmt: skip
        print(f"{point['batch']:>3} {median_over(layers, 'span_us'):8.1f} {median_over(layers, 'after_release_us'):13.1f} "
              f"{median_over(layers, 'started_before_release'):11.0f} {median_over(layers, 'programs'):6.0f}  {stages}")  # fmt: skip


def median_over(layers: list[dict[str, Any]], key: str, stage_key: str | None = None) -> float:
    """The median over layers of a summary's `key`, or (with `stage_key`) of stage `key`'s `stage_key`."""
    values = [float(layer[key] if stage_key is None else layer["stages"][key][stage_key]) for layer in layers]
    return float(torch.tensor(values).quantile(0.5))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--context", type=int, default=128, help="every row's length (keys, the new one included)")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("attention_timeline.json"))
    parser.add_argument("--chained", action="store_true", help="inside the talker's captured decode step")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("attention_timeline: needs a CUDA GPU (the in-kernel clock is inline PTX)", file=sys.stderr)
        return 2
    if args.chained:
        points = chained(args.batches, args.context)
        args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "chained": True, "points": points}, indent=1))  # fmt: skip
        print_chained(torch.cuda.get_device_name(), args.context, points)
        return 0
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "points": [run(b, args.context, args.calls) for b in args.batches]}  # fmt: skip
    args.out.write_text(json.dumps(results, indent=1))
    print(f"{results['gpu']}, context {args.context}; per stage: median / p90 us of a program (median launch)")
    print(f"{'B':>3} {'call us':>8} {'span us':>8} {'progs':>6} {'/SM max':>7} {'2nd wave':>8} {'program':>8}  "
          + "  ".join(f"{name:>15}" for name in TIMELINE_NAMES))  # fmt: skip
    for point in results["points"]:
        m = point["median_launch"]
        call_us = point["whole_call_us"][len(point["whole_call_us"]) // 2]
        stages = "  ".join(f"{s['median_us']:6.2f} / {s['p90_us']:6.2f}" for s in m["stages"].values())
        print(f"{point['batch']:>3} {call_us:8.1f} {m['span_us']:8.1f} {m['programs']:>6} {m['programs_per_sm_max']:>7} "
              f"{m['started_after_first_end']:>8} {m['program_us_median']:8.2f}  {stages}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
