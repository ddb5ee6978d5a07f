"""A torch-profiler Chrome trace reduced to a few small tables: where the GPU and host time went.

    python -m engine.profile_summary TRACE.json --out DIR [--meta JSON] [--top 30] [--delete-trace]

writes DIR/profile_summary.txt (human tables) and DIR/profile_summary.json (the same numbers; written
last, by rename, so its presence means the summary is complete). No torch needed: the trace is read
as JSON (Kineto's format: complete events, `ts`/`dur` in microseconds, GPU work correlated to the
host call that launched it through `args.correlation`). The tables:

- overview: the window, GPU busy time (union of kernels, copies and memsets over all streams);
- top CUDA kernels by total GPU time (name truncated, count, total ms, mean µs, % of kernel time);
- GPU activity by record_function label: every kernel/copy is attributed to the labels open on the
  host thread when it was launched (so a plan's asynchronous work counts for the plan, not for
  whichever later call waited for it); a label nested in another counts for both;
- calls that make the host wait for the GPU (stream/device/event synchronise, memcpy with its
  direction, `aten::item` and friends), with the label they ran under;
- GPU idle gaps: a histogram of the gaps between consecutive busy intervals;
- top CPU ops by self time (torch ops and CUDA runtime/driver calls; children's time excluded).

On a CPU-only trace the GPU tables are empty and the CPU tables still fill.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
HOST_OP_CATEGORIES = ("cpu_op", "cuda_runtime", "cuda_driver")
# Host calls that wait for the GPU (or may: a memcpy to pageable memory or a synchronous memcpy).
SYNC_CALLS = (
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpyAsync",
    "cudaMemcpy2D", "cudaMemcpy2DAsync", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
    "cuMemcpyDtoH_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpy", "cuMemcpyAsync",
)  # fmt: skip
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero", "aten::equal")
GAP_EDGES_US = (2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000)
NAME_CHARS = 100
NO_LABEL = "(no label)"


@dataclass(slots=True)
class Span:
    name: str
    ts: float  # µs
    dur: float  # µs
    thread: tuple[Any, Any] = ("", "")  # (pid, tid)
    correlation: int | None = None
    labels: tuple[str, ...] = ()
    child_us: float = 0.0

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass(slots=True)
class Trace:
    gpu: list[Span] = field(default_factory=list)
    gpu_category: dict[int, str] = field(default_factory=dict)  # id(span) -> category
    launches: list[Span] = field(default_factory=list)
    annotations: list[Span] = field(default_factory=list)
    host_ops: list[Span] = field(default_factory=list)
    other_sync: list[Span] = field(default_factory=list)  # category cuda_sync, where the profiler emits it
    first_ts: float | None = None
    last_end: float | None = None


def load_events(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:  # type: ignore[operator]
        document = json.load(handle)
    return document["traceEvents"] if isinstance(document, dict) else document


def collect(events: Iterable[dict[str, Any]]) -> Trace:
    trace = Trace()
    for event in events:
        if event.get("ph") != "X" or "ts" not in event:
            continue
        category = event.get("cat", "")
        args = event.get("args") or {}
        span = Span(str(event.get("name", "")), float(event["ts"]), float(event.get("dur", 0.0)),
                    (event.get("pid", ""), event.get("tid", "")), _int(args.get("correlation")))  # fmt: skip
        if category not in ("Trace", "python_function"):
            trace.first_ts = span.ts if trace.first_ts is None else min(trace.first_ts, span.ts)
            trace.last_end = span.end if trace.last_end is None else max(trace.last_end, span.end)
        if category in GPU_CATEGORIES:
            trace.gpu.append(span)
            trace.gpu_category[id(span)] = category
        elif category == "user_annotation":
            trace.annotations.append(span)
        elif (
            category == "cuda_sync"
        ):  # GPU-side sync records: "Stream Sync", "Event Sync", "Stream Wait Event"
            span.name = str(args.get("cuda_sync_kind") or span.name)
            trace.other_sync.append(span)
        if category in LAUNCH_CATEGORIES:
            trace.launches.append(span)
        if category in HOST_OP_CATEGORIES:
            trace.host_ops.append(span)
    return trace


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _by_thread(spans: Iterable[Span]) -> dict[tuple[Any, Any], list[Span]]:
    threads: dict[tuple[Any, Any], list[Span]] = defaultdict(list)
    for span in spans:
        threads[span.thread].append(span)
    return threads


def label_host_spans(annotations: list[Span], spans: list[Span]) -> None:
    """Set each span's `labels`: the record_function labels open on its thread when it started."""
    open_by_thread = _by_thread(annotations)
    for thread, members in _by_thread(spans).items():
        marks = sorted(open_by_thread.get(thread, []), key=lambda a: (a.ts, -a.dur))
        members.sort(key=lambda s: s.ts)
        stack: list[Span] = []
        index = 0
        for span in members:
            while index < len(marks) and marks[index].ts <= span.ts:
                while stack and stack[-1].end < marks[index].ts:
                    stack.pop()
                stack.append(marks[index])
                index += 1
            while stack and stack[-1].end < span.ts:
                stack.pop()
            span.labels = tuple(a.name for a in stack if a.end >= span.ts)


def compute_self_times(host_ops: list[Span]) -> None:
    """Children's time (nested host ops on the same thread) into each op's `child_us`."""
    for members in _by_thread(host_ops).values():
        members.sort(key=lambda s: (s.ts, -s.dur))
        stack: list[Span] = []
        for span in members:
            while stack and stack[-1].end <= span.ts:
                stack.pop()
            if stack:
                stack[-1].child_us += span.dur
            stack.append(span)


def busy_intervals(spans: list[Span]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for span in sorted(spans, key=lambda s: s.ts):
        if merged and span.ts <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], span.end))
        else:
            merged.append((span.ts, span.end))
    return merged


def _gap_bucket(gap_us: float) -> str:
    index = bisect.bisect_right(GAP_EDGES_US, gap_us)
    low = 0 if index == 0 else GAP_EDGES_US[index - 1]
    return (
        f">= {_us_text(low)}"
        if index == len(GAP_EDGES_US)
        else f"{_us_text(low)} - {_us_text(GAP_EDGES_US[index])}"
    )


def _us_text(us: float) -> str:
    return f"{us / 1000:g} ms" if us >= 1000 else f"{us:g} us"


def _rows(totals: dict[str, list[float]], top: int, total_us: float) -> list[dict[str, Any]]:
    """[count, total µs(, inclusive µs)] per name -> rows by total, the top `top` and the rest folded."""
    ordered = sorted(totals.items(), key=lambda item: -item[1][1])
    groups = [(name[:NAME_CHARS], values) for name, values in ordered[:top]]
    if ordered[top:]:
        rest = [values for _, values in ordered[top:]]
        groups.append((f"({len(rest)} others)", [sum(column) for column in zip(*rest, strict=True)]))
    rows = []
    for name, values in groups:
        count, total = values[0], values[1]
        row = {"name": name, "count": int(count), "total_ms": round(total / 1000, 3),
               "mean_us": round(total / count, 2) if count else 0.0,
               "pct": round(100 * total / total_us, 2) if total_us else 0.0}  # fmt: skip
        if len(values) > 2:
            row["total_incl_ms"] = round(values[2] / 1000, 3)
        rows.append(row)
    return rows


def summarize(trace: Trace, meta: dict[str, Any] | None = None, top: int = 30) -> dict[str, Any]:
    label_host_spans(trace.annotations, trace.launches + trace.host_ops)
    compute_self_times(trace.host_ops)
    window_us = (trace.last_end - trace.first_ts) if trace.first_ts is not None and trace.last_end else 0.0
    kernels = [s for s in trace.gpu if trace.gpu_category[id(s)] == "kernel"]
    kernel_us = sum(s.dur for s in kernels)
    gpu_us = sum(s.dur for s in trace.gpu)
    busy = busy_intervals(trace.gpu)
    span_us = busy[-1][1] - busy[0][0] if busy else 0.0
    busy_us = sum(end - start for start, end in busy)
    activity: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for span in trace.gpu:
        name = "kernels" if trace.gpu_category[id(span)] == "kernel" else span.name
        activity[name][0] += 1
        activity[name][1] += span.dur
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for span in kernels:
        per_kernel[span.name][0] += 1
        per_kernel[span.name][1] += span.dur
    return {
        "schema": "vivace.engine.profile_summary.v1",
        "meta": meta or {},
        "overview": {
            "window_ms": round(window_us / 1000, 3),
            "gpu_span_ms": round(span_us / 1000, 3),
            "gpu_busy_ms": round(busy_us / 1000, 3),
            "gpu_busy_pct_of_span": round(100 * busy_us / span_us, 2) if span_us else None,
            "gpu_busy_pct_of_window": round(100 * busy_us / window_us, 2) if window_us and busy else None,
            "kernels": len(kernels),
            "kernel_ms": round(kernel_us / 1000, 3),
            "streams": len({s.thread for s in trace.gpu}),
            "annotations": len(trace.annotations),
            "host_ops": len(trace.host_ops),
        },
        "gpu_activity": _rows(activity, top, gpu_us),
        "kernels": _rows(per_kernel, top, kernel_us),
        "labels": label_table(trace, gpu_us)[: top * 2],
        "syncs": sync_table(trace),
        "gaps": gap_table(busy, span_us),
        "cpu_ops": cpu_table(trace.host_ops, top),
    }


def label_table(trace: Trace, gpu_us: float) -> list[dict[str, Any]]:
    """Per record_function label: calls, host time, and the GPU work launched inside it."""
    launch_of = {s.correlation: s for s in trace.launches if s.correlation is not None}
    per_label: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0.0])  # calls, host µs, gpu n, gpu µs
    for mark in trace.annotations:
        per_label[mark.name][0] += 1
        per_label[mark.name][1] += mark.dur
    for span in trace.gpu:
        launch = launch_of.get(span.correlation)
        for label in set(launch.labels) if launch is not None and launch.labels else (NO_LABEL,):
            per_label[label][2] += 1
            per_label[label][3] += span.dur
    return [
        {"label": name[:NAME_CHARS], "calls": int(v[0]), "host_ms": round(v[1] / 1000, 3), "gpu_items": int(v[2]),
         "gpu_ms": round(v[3] / 1000, 3), "gpu_us_per_call": round(v[3] / v[0], 1) if v[0] else None,
         "gpu_pct": round(100 * v[3] / gpu_us, 2) if gpu_us else 0.0}
        for name, v in sorted(per_label.items(), key=lambda item: (-item[1][3], -item[1][1]))
    ]  # fmt: skip


def sync_table(trace: Trace) -> list[dict[str, Any]]:
    """Host waits: sync calls (a memcpy with the direction of the copy it launched) and sync ops."""
    copy_of = {s.correlation: s.name for s in trace.gpu if trace.gpu_category[id(s)] == "gpu_memcpy"}
    waits: dict[str, list[Any]] = {}

    def add(name: str, span: Span, host: bool = True) -> None:
        row = waits.setdefault(name, [0, 0.0, 0.0, Counter()])
        row[0] += 1
        row[1] += span.dur
        row[2] = max(row[2], span.dur)
        if host:  # where it waited: the innermost label open on the host thread
            row[3][span.labels[-1] if span.labels else NO_LABEL] += 1

    for span in trace.host_ops:
        if span.name in SYNC_CALLS:
            copy = copy_of.get(span.correlation) if "emcpy" in span.name else None
            add(f"{span.name} [{copy}]" if copy else span.name, span)
        elif span.name in SYNC_OPS:
            add(span.name, span)
    for span in trace.other_sync:
        add(f"cuda_sync: {span.name}", span, host=False)
    return [
        {"call": name[:NAME_CHARS], "count": v[0], "total_ms": round(v[1] / 1000, 3),
         "mean_us": round(v[1] / v[0], 2), "max_us": round(v[2], 1),
         "where": ", ".join(f"{label} x{n}" for label, n in v[3].most_common(3))}
        for name, v in sorted(waits.items(), key=lambda item: -item[1][1])
    ]  # fmt: skip


def gap_table(busy: list[tuple[float, float]], span_us: float) -> list[dict[str, Any]]:
    """Histogram of the idle gaps between consecutive GPU busy intervals (all streams merged)."""
    gaps: dict[str, list[float]] = {}
    for (_, end), (start, _) in zip(busy, busy[1:], strict=False):
        bucket = gaps.setdefault(_gap_bucket(start - end), [0, 0.0])
        bucket[0] += 1
        bucket[1] += start - end
    order = {_gap_bucket(edge): n for n, edge in enumerate((0, *GAP_EDGES_US))}
    return [{"gap": name, "count": int(v[0]), "total_ms": round(v[1] / 1000, 3),
             "pct_of_span": round(100 * v[1] / span_us, 2) if span_us else 0.0}
            for name, v in sorted(gaps.items(), key=lambda item: order.get(item[0], 99))]  # fmt: skip


def cpu_table(host_ops: list[Span], top: int) -> list[dict[str, Any]]:
    """Host ops (torch ops, CUDA runtime and driver calls) by self time."""
    per_op: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # count, self µs, inclusive µs
    for span in host_ops:
        per_op[span.name][0] += 1
        per_op[span.name][1] += max(0.0, span.dur - span.child_us)
        per_op[span.name][2] += span.dur
    rows = _rows(per_op, top, sum(v[1] for v in per_op.values()))
    for row in rows:
        row["self_ms"] = row.pop("total_ms")
        row["mean_self_us"] = row.pop("mean_us")
    return rows


# (summary key, title, ((row key, column header), ...)) of the text tables, in order.
TABLES = (
    ("gpu_activity", "GPU activity",
     (("name", "activity"), ("count", "count"), ("total_ms", "total ms"), ("mean_us", "mean us"), ("pct", "% GPU"))),
    ("kernels", "top CUDA kernels by GPU time",
     (("name", "kernel"), ("count", "count"), ("total_ms", "total ms"), ("mean_us", "mean us"), ("pct", "% kernel"))),
    ("labels", "GPU time by record_function label (launched inside it)",
     (("label", "label"), ("calls", "calls"), ("host_ms", "host ms"), ("gpu_items", "GPU items"),
      ("gpu_ms", "GPU ms"), ("gpu_us_per_call", "GPU us/call"), ("gpu_pct", "% GPU"))),
    ("syncs", "host calls that wait for the GPU",
     (("call", "call"), ("count", "count"), ("total_ms", "total ms"), ("mean_us", "mean us"),
      ("max_us", "max us"), ("where", "innermost label"))),
    ("gaps", "GPU idle gaps (all streams merged)",
     (("gap", "gap"), ("count", "count"), ("total_ms", "total ms"), ("pct_of_span", "% of GPU span"))),
    ("cpu_ops", "top CPU ops by self time",
     (("name", "op"), ("count", "count"), ("self_ms", "self ms"), ("mean_self_us", "mean self us"),
      ("total_incl_ms", "incl ms"), ("pct", "% host self"))),
)  # fmt: skip


def _table(title: str, rows: list[dict[str, Any]], columns: tuple[tuple[str, str], ...]) -> list[str]:
    lines = ["", f"== {title} =="]
    if not rows:
        return [*lines, "(none)"]
    grid = [[header for _, header in columns]] + [[_cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(line[n]) for line in grid) for n in range(len(columns))]
    for line in grid:
        lines.append(
            "  ".join(
                c.ljust(w) if n == 0 else c.rjust(w)
                for n, (c, w) in enumerate(zip(line, widths, strict=True))
            )
        )
    return lines


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if value % 1 else f"{value:,.0f}"
    return str(value)


def format_summary(summary: dict[str, Any]) -> str:
    lines = ["profile summary (engine.profile_summary)"]
    lines += [f"  {key}: {value}" for key, value in summary["meta"].items()]
    lines += [f"  {key}: {_cell(value)}" for key, value in summary["overview"].items()]
    for key, title, columns in TABLES:
        lines += _table(title, summary[key], columns)
    return "\n".join(lines) + "\n"


def write_summary(summary: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """profile_summary.txt, then profile_summary.json by rename (its presence means done)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    text_path, json_path = out_dir / "profile_summary.txt", out_dir / "profile_summary.json"
    text_path.write_text(format_summary(summary))
    partial = json_path.with_suffix(".json.partial")
    partial.write_text(json.dumps(summary, indent=1) + "\n")
    os.replace(partial, json_path)
    return text_path, json_path


def summarize_file(
    trace_path: Path, out_dir: Path, meta: dict[str, Any] | None = None, top: int = 30
) -> dict[str, Any]:
    summary = summarize(collect(load_events(trace_path)), meta, top)
    write_summary(summary, out_dir)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.profile_summary", description=__doc__.split("\n")[0]
    )
    parser.add_argument("trace", type=Path, help="Chrome trace from torch.profiler (.json or .json.gz)")
    parser.add_argument("--out", type=Path, required=True, help="directory for profile_summary.{txt,json}")
    parser.add_argument("--meta", default="{}", help="JSON object recorded as the summary's meta")
    parser.add_argument("--top", type=int, default=30, help="rows per table (default 30)")
    parser.add_argument("--delete-trace", action="store_true", help="remove the trace once summarised")
    args = parser.parse_args(argv)
    try:
        summarize_file(args.trace, args.out, json.loads(args.meta), args.top)
    finally:
        if args.delete_trace:
            args.trace.unlink(missing_ok=True)
    print(f"wrote {args.out / 'profile_summary.txt'} and {args.out / 'profile_summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
