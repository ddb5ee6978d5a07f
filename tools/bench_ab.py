"""A/B of server configurations: a fresh server per run, runs interleaved and repeated, one table.

    python tools/bench_ab.py --out DIR --repeat 3 --points http:80@20,http:100@20 \\
        --config off:--engine-arg=--codec-fill-frames=0 --config on:--engine-arg=--codec-fill-frames=4 \\
        [--budget-per-run 150] [-- GATEWAY ARGS OF EVERY RUN]

Single 20 s windows at 80-100 RPS differ by several points between runs of the same code, and a server can fail
in one run of five (docs/benchmarks.md, tenth session): an A/B needs repeats, each on a fresh server. This runs
`tools/bench_h200.py` once per (repeat, configuration), in the order A B A B ..., so drift of the machine falls on
both alike. A configuration is `LABEL:ARGS`, ARGS one shell-quoted string of gateway arguments appended to the
common ones. Outputs in --out: ab.json (every run's bench.json under its label), ab.md (the table, also printed
last: per point and configuration, each run's p95 TTFA, refused %, requests lost otherwise, underrunning requests
and audio s/s), and, for a run that lost requests to anything but refusals (timeouts, `engine_died`, transport
errors) or did not finish, its gateway log's tail as LABEL-REPEAT.log, where a stalled engine's stack dump is.
The exit code is 0 only when every run finished every point.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCHEMA = "vivace.bench.ab.v1"
REFUSALS = frozenset({"http_503", "http_429", "ws_overloaded"})  # bench_h200's refused_pct counts these
LOG_TAIL_BYTES = 4 << 20


def parse_config(spec: str) -> tuple[str, list[str]]:
    """'LABEL:ARGS' -> (label, gateway arguments)."""
    label, sep, args = spec.partition(":")
    if not sep or not label or not label.replace("-", "").replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"a configuration is LABEL:ARGS with a plain label, got {spec!r}")
    return label, shlex.split(args)


def lost_requests(point: dict[str, Any]) -> int:
    """Requests of a point that failed for another reason than a refusal (an engine that died answers 503 too)."""
    errors = point.get("errors_by_kind") or {}
    lost = sum(n for kind, n in errors.items() if kind not in REFUSALS)
    died = "engine_died" in str((point.get("error_examples") or {}).get("http_503", ""))
    return lost + (errors.get("http_503", 0) if died else 0)


def run_finished(record: dict[str, Any]) -> bool:
    """bench_h200 ran every point of the run."""
    points = record.get("points") or []
    return record.get("exit_code") == 0 and bool(points) and all(p.get("status") == "ok" for p in points)


def keeps_log(record: dict[str, Any]) -> bool:
    """A run worth reading the server log of: unfinished, or requests lost to something other than refusals."""
    return not run_finished(record) or any(lost_requests(p) for p in record.get("points") or [])


def _cell(point: dict[str, Any] | None) -> str:
    if point is None:
        return "missing"
    if point.get("status") != "ok":
        return f"{point.get('status')}: {point.get('reason', '')}"
    return (f"{point['ttfa_ms'].get('p95') or '–'} ms, {point['refused_pct']:.1f} %, {lost_requests(point)} lost, "
            f"{point['underruns']['requests_with_underruns']} underrun, {point['audio_s_per_s']:.0f} s/s")


def table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """Per point and configuration: every run's p95 / refused / lost / underrun requests / audio s/s, then the
    median p95 and refused % of the runs that measured the point."""
    repeats = max((len(records) for records in runs.values()), default=0)
    names = list(dict.fromkeys(p["name"] for records in runs.values() for r in records for p in r.get("points", [])))
    head = ["point", "config", *(f"run {i + 1}: p95, refused, lost, underrun, audio" for i in range(repeats)),
            "median p95 ms / refused %"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    for name in names:
        for label, records in runs.items():
            points = [next((p for p in r.get("points", []) if p["name"] == name), None) for r in records]
            ok = [p for p in points if p is not None and p.get("status") == "ok" and p["ttfa_ms"].get("p95")]
            median = (f"{statistics.median(p['ttfa_ms']['p95'] for p in ok):.1f} / "
                      f"{statistics.median(p['refused_pct'] for p in ok):.1f}") if ok else "–"  # fmt: skip
            cells = [name, label, *(_cell(p) for p in points), *([""] * (repeats - len(points))), median]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_once(label: str, repeat: int, config_args: list[str], args: argparse.Namespace,
             gateway_args: list[str]) -> dict[str, Any]:  # fmt: skip
    """One bench_h200 run on a fresh server; -> its bench.json (or a stub saying why there is none)."""
    work = Path(tempfile.mkdtemp(prefix=f"vivace-ab-{label}-"))
    command = [sys.executable, "tools/bench_h200.py", "--out", str(work), "--points", args.points,
               "--budget", str(args.budget_per_run), "--ready-timeout", str(args.ready_timeout),
               *shlex.split(args.bench_args), "--", *gateway_args, *config_args]  # fmt: skip
    print(f"[{label} #{repeat}] {shlex.join(command)}", flush=True)
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    try:
        record = json.loads((work / "bench.json").read_text())
    except (OSError, ValueError):
        record = {"points": [], "stderr_tail": done.stderr[-4000:]}
    record["exit_code"] = done.returncode
    log = work / "gateway.log"
    if keeps_log(record) and log.exists():
        with open(log, "rb") as f:
            f.seek(max(0, log.stat().st_size - LOG_TAIL_BYTES))
            (args.out / f"{label}-{repeat}.log").write_bytes(f.read())
    shutil.rmtree(work, ignore_errors=True)
    print(f"[{label} #{repeat}] " + ("; ".join(f"{p['name']}: {_cell(p)}" for p in record["points"]) or
                                     f"no result (exit {done.returncode})"), flush=True)  # fmt: skip
    return record


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    gateway_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python tools/bench_ab.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", type=parse_config, action="append", required=True,
                        help="LABEL:ARGS, gateway arguments of one configuration (give two or more)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration")
    parser.add_argument("--points", default="http:80@20,http:100@20", help="bench_h200 points of every run")
    parser.add_argument("--budget-per-run", type=float, default=150.0, help="bench_h200 --budget of each run (s)")
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds to wait for /ready (the full-size engine on an H200: ~215 s)")
    parser.add_argument("--bench-args", default="", help="more bench_h200 arguments, one shell-quoted string")
    args = parser.parse_args(own)
    labels = [label for label, _ in args.config]
    if len(set(labels)) != len(labels) or args.repeat < 1:
        parser.error("configuration labels must differ and --repeat must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
    for repeat in range(1, args.repeat + 1):
        for label, config_args in args.config:
            runs[label].append(run_once(label, repeat, config_args, args, gateway_args))
            (args.out / "ab.json").write_text(json.dumps({
                "schema": SCHEMA, "command": "python tools/bench_ab.py " + shlex.join(argv),
                "configs": {label: shlex.join(a) for label, a in args.config}, "runs": runs}, indent=1))  # fmt: skip
    text = table(runs)
    (args.out / "ab.md").write_text(text + "\n")
    print("\n" + text)
    return 0 if all(run_finished(r) for records in runs.values() for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
