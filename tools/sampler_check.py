"""The one-kernel sampler on the GPU: same tokens as its twin, and its time per call.

For rows 1, 8 and 64 of the full-size code predictor's vocabulary (2048), every code group, random scores
with `cp_selfcheck.sampler_case`'s settings (a tie planted where thresholds fall, mixed top-k, greedy rows
and temperatures): `sampler.sample` against `sample_reference` (tokens must be identical; the embedding
accumulate within 1e-6). The same for the talker's draw (group 0, vocabulary 3072, whose control tokens
`talker_scores` masks to -inf: all but one of columns 2048 and up here). Then the kernel's time per call,
15 calls (one frame's groups) in a CUDA graph, CUDA-event median, at the default top-k 50.

    python tools/sampler_check.py [--radix-bits 2]      # GPU only; exit status 1 on any mismatch
    python tools/sampler_check.py --timeline            # also where a call's time goes, stage by stage

`--timeline` runs each of the 15 groups once more at 1 and 64 rows with the kernel's in-kernel clock on
(`sample(timeline=...)`: %globaltimer after each stage) and prints, per stage, the median over groups of the
slowest row's microseconds (stage boundaries as the compiler placed the clock reads: approximate), and the
top-k search's rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.fast.kernels.cp_selfcheck import sampler_case  # noqa: E402
from engine.fast.kernels.sampler import TIMELINE_NAMES, TIMELINE_STAGES, sample, sample_reference  # noqa: E402
from engine.fast.measure import graph_per_call_us, relative_l2  # noqa: E402

VOCAB, HIDDEN, CAP = 2048, 1024, 64
TALKER_VOCAB, TALKER_CODES = 3072, 2048  # the talker's codec vocabulary; ids from 2048 are control tokens
DEVICE = "cuda"


def inputs(rows: int, group: int, gen: torch.Generator, top_k_value: int | None = None, vocab: int = VOCAB) -> list:
    """`sample`'s positional arguments: random scores [rows, vocab] with `cp_selfcheck.sampler_case`'s settings
    (or, given `top_k_value`, that top-k on every row and no greedy row, as a timing case). The talker's
    vocabulary gets its control tokens masked to -inf but one (the end of speech)."""
    scores = torch.randn(rows, vocab, device=DEVICE, generator=gen) * 2.0
    if vocab == TALKER_VOCAB:
        scores[:, TALKER_CODES + 1 :] = float("-inf")
    greedy, temperature, top_k, cap, seeds, frames = sampler_case(scores, group, CAP)
    if top_k_value is not None:
        greedy, top_k = torch.zeros_like(greedy), torch.full_like(top_k, top_k_value)
    return [scores, greedy, temperature, top_k, cap, seeds, frames, group]


def stage_times(rows: int, gen: torch.Generator, radix_bits: int, table: torch.Tensor) -> str:
    """One line: per stage, the median over the 15 groups of the slowest row's us (top-k 50), and the search's
    rounds (median, max)."""
    spans: list[list[float]] = []
    rounds: list[int] = []
    for group in range(1, 16):
        case = inputs(rows, group, gen, top_k_value=50)
        acc = torch.zeros(rows, HIDDEN, device=DEVICE)
        sample(*case, table=table, acc=acc, radix_bits=radix_bits)  # compiled and warm
        stamps = torch.zeros(rows, TIMELINE_STAGES, dtype=torch.int64, device=DEVICE)
        sample(*case, table=table, acc=acc, radix_bits=radix_bits, timeline=stamps)
        torch.cuda.synchronize()
        ns = stamps[:, : len(TIMELINE_NAMES) + 1].diff(dim=1)  # [rows, stages]
        spans.append((ns.max(dim=0).values.float() / 1e3).tolist())
        rounds += stamps[:, -1].tolist()
    per_stage = torch.tensor(spans).median(dim=0).values.tolist()
    cells = ", ".join(f"{name} {us:.2f}" for name, us in zip(TIMELINE_NAMES, per_stage, strict=True))
    return f"{cells} us; search rounds median {statistics.median(rounds):.0f}, max {max(rounds)}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--radix-bits", type=int, default=2)
    p.add_argument("--smoke", action="store_true", help="CPU under TRITON_INTERPRET=1, tokens only (proves the script)")
    p.add_argument("--timeline", action="store_true", help="per-stage time of a call (in-kernel clock; GPU only)")
    args = p.parse_args(argv)
    global DEVICE
    if args.smoke:
        DEVICE = "cpu"
    elif not torch.cuda.is_available():
        p.error("needs a CUDA device")
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    table = torch.randn(VOCAB, HIDDEN, device=DEVICE, generator=gen).to(torch.bfloat16)
    mismatches, checked, acc_error = 0, 0, 0.0
    for rows in (1, 3) if args.smoke else (1, 8, 64):
        for group in (1, 8, 15) if args.smoke else range(1, 16):
            args_ = inputs(rows, group, gen)
            acc = torch.randn(rows, HIDDEN, device=DEVICE, generator=gen)
            acc_ref = acc.clone()
            tokens = sample(*args_, table=table, acc=acc, radix_bits=args.radix_bits)
            expected = sample_reference(*args_, table=table, acc=acc_ref)
            mismatches += int((tokens != expected).sum())
            checked += rows
            acc_error = max(acc_error, relative_l2(acc, acc_ref))
        for draw in range(3 if args.smoke else 20):  # the talker's draw: group 0, no embedding accumulate
            args_ = inputs(rows, 0, gen, vocab=TALKER_VOCAB)
            args_[6] = args_[6] + draw * 7919  # other frames, other uniforms
            mismatches += int((sample(*args_, radix_bits=args.radix_bits) != sample_reference(*args_)).sum())
            checked += rows
    times = {}
    for label, vocab, groups in (("", VOCAB, range(1, 16)), ("talker ", TALKER_VOCAB, [0] * 15)):
        for rows in () if args.smoke else (1, 64):  # 15 calls a graph: one frame's groups (or 15 talker draws)
            cases = [inputs(rows, group, gen, top_k_value=50, vocab=vocab) for group in groups]
            times[f"{label}{rows} rows"] = graph_per_call_us(
                [lambda case=case: sample(*case, radix_bits=args.radix_bits) for case in cases], repeats=50
            )
    if args.timeline and not args.smoke:
        for rows in (1, 64):
            print(f"{rows} rows: " + stage_times(rows, gen, args.radix_bits, table))
    print(f"tokens: {mismatches} of {checked} differ from the twin; embedding accumulate error {acc_error:.1e}")
    print("us per sampler call (top-k 50): " + ", ".join(f"{r} {t:.1f}" for r, t in times.items()))
    return 0 if mismatches == 0 and acc_error <= 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main())
