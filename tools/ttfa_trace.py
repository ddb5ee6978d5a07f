"""Where a request's time to first audio goes inside the engine: each plan on its path, host launch and device span.

    python tools/ttfa_trace.py --requests 30 --rps 0 -- --model 1.7b --load-format dummy --device cuda
    python tools/ttfa_trace.py --requests 200 --rps 10 -- --model 1.7b --load-format dummy --device cuda

Builds the engine in this process exactly as `python -m engine` does (arguments after `--` are the engine's),
then submits the load test's prompts: one at a time with the engine idle in between (`--rps 0`), or as Poisson
arrivals. For each request, from the moment it is handed to the loop until its first Audio record is published:
every plan that ran for it (kind, rows, when the host launched it, when its kernels started and ended on the
device, from the plan's CUDA events placed on the host clock through one reference event) and the gaps between.
Prints the medians of each segment and the chain of the median request; `--out` writes every request's chain.
No gateway, no IPC, no HTTP: what remains of a client's TTFA beyond this is theirs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.__main__ import build
from engine.ipc.messages import Audio, Error, Submit
from engine.settings import parse_args
from loadtest.prompts import load_prompts

LINK = 1  # replies to any link but the internal one are kept (engine/loop.py)


@dataclass
class Trace:
    request_id: int
    chars: int
    submitted: float  # host seconds (perf_counter)
    engine_id: int | None = None  # the loop's own id (plans name rows by it); None: refused at once
    first_audio: float | None = None
    plans: list[dict[str, Any]] = field(default_factory=list)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(args: argparse.Namespace, engine_argv: list[str]) -> dict[str, Any]:
    loop = build(parse_args(["--socket", "unused-by-ttfa-trace", *engine_argv]))  # no link is served
    tokenizer = loop.executors.model.tokenizer
    speaker = loop.ready.speakers[0] if loop.ready.speakers else ""
    cuda = torch.cuda.is_available() and loop.executors.generation_stream is not None
    reference, reference_host = None, 0.0
    if cuda:  # device time -> host clock: one event recorded on an idle device
        torch.cuda.synchronize()
        reference = torch.cuda.Event(enable_timing=True)
        reference.record()
        reference.synchronize()
        reference_host = time.perf_counter()

    launched: list[tuple[float, Any]] = []
    add = loop.timeline.add

    def record(step: Any) -> None:
        launched.append((time.perf_counter(), step))
        add(step)

    loop.timeline.add = record  # type: ignore[method-assign]
    prompts = load_prompts(None)
    rng = random.Random(args.seed)
    reports = []
    for rps in args.rps:
        launched.clear()
        requests = args.requests if rps <= 0 else round(rps * args.duration_s)
        traces, refused = _drive(loop, rps, requests, prompts, rng, tokenizer, speaker)
        reports.append(_report(loop, rps, traces, refused, launched, reference, reference_host))
    return {"engine_argv": engine_argv, "points": reports}


def _drive(loop: Any, rps: float, requests: int, prompts: list, rng: random.Random, tokenizer: Any,
           speaker: str) -> tuple[dict[int, Trace], int]:  # fmt: skip
    """Submit `requests` prompts (Poisson at `rps`, or one at a time on an idle engine) and step the loop until
    each has its first audio; the engine is left idle."""
    base = loop._next_id * 1000  # gateway-side ids unique across points
    traces: dict[int, Trace] = {}
    next_arrival = time.perf_counter()
    submitted = refused = 0
    while submitted < requests or any(t.first_audio is None for t in traces.values()) or loop._routes:
        now = time.perf_counter()
        waiting = any(t.first_audio is None for t in traces.values())
        due = now >= next_arrival if rps > 0 else not waiting and not loop._routes
        if submitted < requests and due:
            text = rng.choice(prompts).text
            submitted += 1
            ids = tuple(tokenizer.target_ids(text))
            request_id = base + submitted
            loop.handle(LINK, Submit(request_id=request_id, speaker=speaker, language="auto", text_ids=ids,
                                     text_chars=len(text), text_ended=True), loop.clock())  # fmt: skip
            traces[request_id] = Trace(
                request_id, len(text), time.perf_counter(), loop._ids.get((LINK, request_id))
            )
            if rps > 0:
                next_arrival += rng.expovariate(rps)
        busy = loop.step()
        for _, msg in loop.take_replies():
            if isinstance(msg, Audio) and msg.first and msg.request_id in traces:
                traces[msg.request_id].first_audio = time.perf_counter()
            elif (
                isinstance(msg, Error)
                and msg.request_id in traces
                and traces[msg.request_id].first_audio is None
            ):
                del traces[msg.request_id]  # refused (overloaded) or failed before any audio
                refused += 1
        if not busy:
            time.sleep(0.0002)
    loop.drain_device()
    return traces, refused


def _report(loop: Any, rps: float, traces: dict[int, Trace], refused: int, launched: list, reference: Any,
            reference_host: float) -> dict[str, Any]:  # fmt: skip
    by_engine = {t.engine_id: t for t in traces.values() if t.engine_id is not None}
    for host, step in launched:
        for row in step.plan.rows:
            trace = by_engine.get(row.request_id)
            if trace is None or trace.first_audio is None or host > trace.first_audio:
                continue
            entry = {
                "kind": step.plan.kind.label,
                "rows": len(step.plan.rows),
                "launch_ms": (host - trace.submitted) * 1e3,
            }
            if reference is not None and step.start is not None:
                for name, event in (("start_ms", step.start), ("end_ms", step.end)):
                    entry[name] = (
                        reference_host + reference.elapsed_time(event) / 1e3 - trace.submitted
                    ) * 1e3
            trace.plans.append(entry)
    done = [t for t in traces.values() if t.first_audio is not None]
    ttfa = [(t.first_audio - t.submitted) * 1e3 for t in done]
    return {"rps": rps, "requests": len(done), "refused": refused, "engine_ttfa_ms": {"p50": statistics.median(ttfa),
            "p95": _percentile(ttfa, 0.95), "max": max(ttfa)},
            "traces": [{"request": t.request_id, "chars": t.chars, "ttfa_ms": (t.first_audio - t.submitted) * 1e3,
                        "plans": t.plans} for t in done]}  # fmt: skip


def table(report: dict[str, Any]) -> str:
    traces = sorted(report["traces"], key=lambda t: t["ttfa_ms"])
    t = report["engine_ttfa_ms"]
    lines = [f"rps {report['rps']}: {report['requests']} requests, engine TTFA p50 {t['p50']:.2f} ms, "
             f"p95 {t['p95']:.2f} ms, max {t['max']:.2f} ms"]  # fmt: skip
    kinds: dict[str, list[float]] = {}
    for trace in traces:
        for plan in trace["plans"]:
            if "start_ms" in plan:
                kinds.setdefault(plan["kind"], []).append(plan["end_ms"] - plan["start_ms"])
    for kind, spans in sorted(kinds.items()):
        lines.append(f"  {kind}: {len(spans)} plans on first-audio paths, device span p50 "
                     f"{statistics.median(spans):.2f} ms, p95 {_percentile(spans, 0.95):.2f} ms")  # fmt: skip
    for label, trace in (
        ("median", traces[len(traces) // 2]),
        ("p95", traces[round(0.95 * (len(traces) - 1))]),
    ):
        lines.append(f"  {label} request ({trace['ttfa_ms']:.2f} ms): kind rows launch / device start-end ms")
        for plan in trace["plans"]:
            device = f"{plan['start_ms']:.2f}-{plan['end_ms']:.2f}" if "start_ms" in plan else "-"
            lines.append(f"    {plan['kind']:<15} {plan['rows']:>3} {plan['launch_ms']:7.2f} / {device}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, engine_argv = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30, help="requests of an idle point (--rps 0)")
    parser.add_argument(
        "--rps",
        type=float,
        nargs="+",
        default=[0.0],
        help="one point per value, in order, on one engine: Poisson arrivals; 0: one at a time, idle",
    )
    parser.add_argument("--duration-s", type=float, default=10.0, help="arrivals per point with --rps > 0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(ours)
    report = run(args, engine_argv)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f)
    print("\n".join(table(point) for point in report["points"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
