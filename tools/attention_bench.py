"""The talker's decode attention at the engine's shapes: split-kernel configurations, timed as the graph runs them.

The talker's decode step spends a third of its time at 64 rows in `decode_attention` (H200, 2026-12-02:
`_split_kernel` 0.93 ms of a 2.78 ms step, 28 calls). This script times every `SplitConfig` of a grid (keys per
split or interleaved programs per (row, kv head), keys per inner step, warps, pipelining stages) on the full-size talker's heads (16 query heads, 8 kv
heads, head dim 128, bf16, a 2048-position cache) for each batch size and context range, per call, inside one
CUDA graph of many calls that each read other cache slots, so every call streams its keys and values from HBM
(not the 60 MiB L2) as the 28 layers do, and prints each against the copy-bandwidth floor of what it reads (64
rows at contexts 256-511: 100 MB, 23.6 us). Every configuration's output is checked against the fp32 reference
first (relative L2 <= 1e-2), so a fast wrong configuration cannot win.

    python tools/attention_bench.py [--batches 1 4 16 64 128] [--contexts 32-255 256-511] [--out attention_bench.json]

Prints, per (context range, batch), the default configuration's time, the best one's and the copy-bandwidth
floor, last.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.fast.kernels.decode_attention import (  # noqa: E402
    SplitConfig,
    decode_attention,
    decode_attention_reference,
    default_split_config,
)
from engine.fast.measure import graph_per_call_us, relative_l2  # noqa: E402

COPY_BANDWIDTH = 4255e9  # B/s, h200-floors.md
HEADS, KV_HEADS, HEAD_DIM, CAPACITY = 16, 8, 128, 2048  # the full-size talker's attention
SLOTS = 1024  # cache slots the timed calls cycle through (8.6 GB of keys and values)
HBM_BYTES = 256 << 20  # each timed graph reads at least this much: > 4x L2


def configs() -> list[SplitConfig]:
    grid = [
        SplitConfig(keys_per_split=kps, block_n=64, num_warps=warps, num_stages=stages)
        for kps, warps, stages in itertools.product((64, 128, 256), (4, 8), (None, 2, 4))
    ]
    grid += [SplitConfig(keys_per_split=kps, block_n=32, num_warps=warps) for kps in (32, 64, 128) for warps in (4, 8)]
    # interleaved splits: P programs a (row, kv head), program p taking key blocks p, p + P, ...
    grid += [SplitConfig(programs=programs, block_n=block, num_warps=warps)
             for programs, block, warps in itertools.product((2, 4, 8, 16), (32, 64), (4, 8))]  # fmt: skip
    return grid


def bench(batches: list[int], contexts: list[tuple[int, int]]) -> dict[str, Any]:
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (SLOTS, KV_HEADS, CAPACITY, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    v_cache = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    grid = configs()
    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "points": []}

    # Correctness of every configuration first (it also compiles each): mixed lengths up to the capacity.
    rows = 16
    slots = torch.randperm(SLOTS, device=device)[:rows]
    lengths = torch.randint(1, CAPACITY + 1, (rows,), device=device)
    lengths[:4] = torch.tensor([1, 63, 64, CAPACITY], device=device)
    q = torch.randn(rows, HEADS, HEAD_DIM, generator=gen, device=device, dtype=torch.bfloat16)
    expected = decode_attention_reference(q.float(), k_cache[slots].float(), v_cache[slots].float(),
                                          torch.arange(rows, device=device), lengths)  # fmt: skip
    errors = {config: relative_l2(decode_attention(q, k_cache, v_cache, slots, lengths, config), expected)
              for config in grid}  # fmt: skip
    results["wrong"] = [{**asdict(config), "error": error} for config, error in errors.items() if not error <= 1e-2]
    grid = [config for config, error in errors.items() if error <= 1e-2]

    for (lo, hi), batch in itertools.product(contexts, batches):
        mean_bytes = batch * (lo + hi) / 2 * KV_HEADS * HEAD_DIM * 2 * 2  # keys + values, bf16
        calls_needed = max(8, min(SLOTS // batch, int(HBM_BYTES // mean_bytes) + 1))
        calls = []
        order = torch.randperm(SLOTS, device=device)
        for i in range(calls_needed):
            slot_rows = order[(i * batch) % SLOTS:][:batch]
            if slot_rows.numel() < batch:
                slot_rows = order[:batch]
            length_rows = torch.randint(lo, hi + 1, (batch,), device=device)
            query = torch.randn(batch, HEADS, HEAD_DIM, generator=gen, device=device, dtype=torch.bfloat16)
            calls.append((query, slot_rows, length_rows))
        read_bytes = sum(float(c[2].sum()) for c in calls) / len(calls) * KV_HEADS * HEAD_DIM * 2 * 2
        default = default_split_config(batch)
        us = {config: graph_per_call_us([lambda c=c, config=config: decode_attention(c[0], k_cache, v_cache, c[1],
                                                                                     c[2], config)
                                         for c in calls])
              for config in dict.fromkeys([*grid, default])}  # fmt: skip
        timings = sorted(({**asdict(config), "us": us[config]} for config in grid), key=lambda t: t["us"])
        results["points"].append({
            "batch": batch, "context": [lo, hi], "calls_per_graph": len(calls), "mb_per_call": read_bytes / 1e6,
            "floor_us": read_bytes / COPY_BANDWIDTH * 1e6, "default": {**asdict(default), "us": us[default]},
            "timings": timings,
        })  # fmt: skip
    return results


def describe(t: dict[str, Any]) -> str:
    stages = "-" if t["num_stages"] is None else t["num_stages"]
    if t.get("programs") is not None:
        return f"P {t['programs']:>2} interleaved bn {t['block_n']:>2} w{t['num_warps']} s{stages}"
    return f"kps {t['keys_per_split']:>3} bn {t['block_n']:>2} w{t['num_warps']} s{stages}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64, 128])
    parser.add_argument("--contexts", nargs="+", default=["32-255", "256-511"], help="key-count ranges lo-hi")
    parser.add_argument("--out", type=Path, default=Path("attention_bench.json"))
    args = parser.parse_args()
    contexts = [tuple(int(v) for v in text.split("-")) for text in args.contexts]
    results = bench(args.batches, contexts)  # type: ignore[arg-type]
    args.out.write_text(json.dumps(results, indent=1))
    if results["wrong"]:
        print("WRONG (excluded):", results["wrong"])
    print("context  B    MB/call floor us  default us  best us  best configuration       2nd / 3rd")
    for p in results["points"]:
        best = p["timings"][:3]
        print(f"{p['context'][0]:>3}-{p['context'][1]:<4} {p['batch']:>3} {p['mb_per_call']:8.2f} {p['floor_us']:8.1f} "
              f"{p['default']['us']:10.1f} {best[0]['us']:8.1f}  {describe(best[0])}  "
              f"{best[1]['us']:.1f} {describe(best[1])} / {best[2]['us']:.1f} {describe(best[2])}")  # fmt: skip
    return 1 if results["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
