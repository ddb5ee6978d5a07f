"""PNG charts from run directories: p95 TTFA vs RPS, underruns vs RPS, and the TTFA CDF of each run.

Each argument is a run directory (holding summary.json) or a sweep directory (holding run
directories); the runs of one argument form one labelled series, so several servers or
transports can be compared on one chart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402


def find_runs(path: Path) -> list[Path]:
    """Run directories under `path` (itself, or its children), sorted by RPS."""
    if (path / "summary.json").is_file():
        return [path]
    runs = [child for child in path.iterdir() if (child / "summary.json").is_file()] if path.is_dir() else []
    if not runs:
        raise FileNotFoundError(f"{path}: no summary.json here or in its subdirectories")
    return sorted(runs, key=lambda run: json.loads((run / "summary.json").read_text())["config"]["rps"])


def _ttfa_values(run: Path) -> list[float]:
    values: list[float] = []
    requests = run / "requests.jsonl"
    if requests.is_file():
        for line in requests.read_text().splitlines():
            row = json.loads(line)
            if row["phase"] == "measure" and row["ok"] and row["ttfa_ms"] is not None:
                values.append(row["ttfa_ms"])
    return sorted(values)


def plot_runs(paths: list[Path], output: Path, title: str | None = None) -> None:
    if not paths:
        raise ValueError("nothing to plot")
    fig, (ax_p95, ax_under, ax_cdf) = plt.subplots(1, 3, figsize=(16, 4.8))
    for path in paths:
        runs = find_runs(path)
        label = path.name or str(path)
        summaries: list[dict[str, Any]] = [json.loads((run / "summary.json").read_text()) for run in runs]
        rps = [s["config"]["rps"] for s in summaries]
        p95 = [s["latency_ms"]["ttfa"]["p95"] for s in summaries]
        ax_p95.plot(rps, [float("nan") if v is None else v for v in p95], marker="o", label=label)
        ax_under.plot(
            rps, [s["underruns"]["requests_with_underruns"] for s in summaries], marker="o", label=label
        )
        for run, summary in zip(runs, summaries, strict=True):
            values = _ttfa_values(run)
            if values:
                fractions = [(i + 1) / len(values) for i in range(len(values))]
                ax_cdf.step(
                    values, fractions, where="post", label=f"{label} @ {summary['config']['rps']:g} rps"
                )
    ax_p95.set(xlabel="offered RPS", ylabel="p95 audible TTFA (ms)", title="p95 TTFA vs load")
    ax_under.set(xlabel="offered RPS", ylabel="requests with underruns", title="Underruns vs load")
    ax_cdf.set(xlabel="audible TTFA (ms)", ylabel="fraction of requests", title="TTFA CDF", ylim=(0, 1.02))
    for ax in (ax_p95, ax_under, ax_cdf):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    ax_p95.set_ylim(bottom=0)
    ax_under.set_ylim(bottom=0)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)
