"""The run summary: nearest-rank percentiles of every latency, stalls, errors by kind, throughput, cost.

Only requests of the measurement phase count. Rates are per second of the measurement window:

    achieved_rps       successful measured requests / duration
    chars_per_s        characters of successful measured requests / duration
    usd_per_million_chars  GPU $/hour / 3600 / chars_per_s * 1e6   (what one GPU costs per 1M
                       characters at this load; meaningful near capacity, pessimistic below it)
"""

from __future__ import annotations

import math
import platform
import sys
from collections import Counter
from typing import Any

from loadtest.metrics import RequestRecord
from loadtest.runner import ClientStats

SUMMARY_SCHEMA = "vivace.loadtest.summary.v1"
PERCENTILES = (50, 90, 95, 99)
LATENCIES_MS = (
    "ttfa_ms",
    "first_playable_ms",
    "ttfb_ms",
    "e2e_ms",
    "leading_silence_ms",
    "connect_ms",
    "scheduling_lag_ms",
    "input_ingress_ms",
)


def nearest_rank(sorted_values: list[float], percentile: float) -> float:
    """The smallest value with at least `percentile`% of the values at or below it."""
    if not sorted_values:
        raise ValueError("no values")
    if not 0 < percentile <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {percentile}")
    rank = math.ceil(percentile / 100.0 * len(sorted_values))
    return sorted_values[rank - 1]


def distribution(values: list[float | None]) -> dict[str, Any]:
    """count, missing, mean, p50/p90/p95/p99, min, max (None where there are no values)."""
    present = sorted(v for v in values if v is not None)
    out: dict[str, Any] = {"count": len(present), "missing": len(values) - len(present)}
    if not present:
        return out | {"mean": None, "min": None, "max": None} | {f"p{p}": None for p in PERCENTILES}
    out |= {"mean": sum(present) / len(present), "min": present[0], "max": present[-1]}
    out |= {f"p{p}": nearest_rank(present, p) for p in PERCENTILES}
    return out


def summarize(
    records: list[RequestRecord],
    stats: ClientStats,
    config: dict[str, Any],
    duration_s: float,
    gpu_hourly_usd: float | None,
) -> dict[str, Any]:
    measured = [r for r in records if r.phase == "measure"]
    ok = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    with_audio = [r for r in measured if r.audio_s is not None]
    chars = sum(r.chars for r in ok)
    chars_per_s = chars / duration_s
    audio_s = sum(r.audio_s or 0.0 for r in ok)
    cost = None
    if gpu_hourly_usd is not None and chars_per_s > 0:
        cost = gpu_hourly_usd / 3600.0 / chars_per_s * 1e6
    kinds = Counter(r.error_kind for r in failed)
    examples: dict[str, str] = {}
    for r in failed:
        examples.setdefault(str(r.error_kind), str(r.error_message))
    return {
        "schema": SUMMARY_SCHEMA,
        "config": config,
        "requests": {
            "scheduled": len(measured),
            "ok": len(ok),
            "failed": len(failed),
            "warmup": len(records) - len(measured),
        },
        "offered_rps": len(measured) / duration_s,
        "achieved_rps": len(ok) / duration_s,
        "latency_ms": {
            name.removesuffix("_ms"): distribution([getattr(r, name) for r in ok]) for name in LATENCIES_MS
        },
        "rtf": distribution([r.rtf for r in ok]),
        "audio_s": distribution([r.audio_s for r in ok]),
        "underruns": {
            "requests_with_underruns": sum(1 for r in with_audio if r.underruns),
            "count": sum(r.underruns for r in with_audio),
            "total_stall_ms": sum(r.stall_total_ms for r in with_audio),
            "max_stall_ms": max((r.stall_max_ms for r in with_audio), default=0.0),
            "stall_failures": sum(1 for r in with_audio if r.stall_failure),
            "requests_with_audio": len(with_audio),
        },
        "errors": {"total": len(failed), "by_kind": dict(sorted(kinds.items())), "examples": examples},
        "throughput": {
            "chars_per_s": chars_per_s,
            "audio_s_per_s": audio_s / duration_s,
            "chunks_per_s": sum(r.chunks for r in measured) / duration_s,
            "chars_total": chars,
            "audio_s_total": audio_s,
        },
        "cost": {"gpu_hourly_usd": gpu_hourly_usd, "usd_per_million_chars": cost},
        "client": {
            "cpu_utilization": stats.cpu_utilization,
            "cpu_s": stats.cpu_s,
            # whole-run CPU (warm-up and tail included) per request sent
            "cpu_ms_per_request": stats.cpu_s
            * 1000.0
            / max(1, sum(1 for r in records if r.dispatch_s is not None)),
            "wall_s": stats.wall_s,
            "peak_in_flight": stats.peak_in_flight,
            "loop_lag_ms": distribution(list(stats.loop_lag_ms)),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
    }


def format_summary(summary: dict[str, Any]) -> str:
    """A short human-readable report of a summary."""
    cfg = summary["config"]
    req = summary["requests"]
    lines = [
        f"{cfg.get('transport')} {cfg.get('url')}  rps {cfg.get('rps')}  duration {cfg.get('duration_s')} s"
        f"  seed {cfg.get('seed')}",
        f"requests: {req['scheduled']} measured, {req['ok']} ok, {req['failed']} failed"
        f" (achieved {summary['achieved_rps']:.2f} rps)",
        f"{'metric':<18}{'p50':>10}{'p90':>10}{'p95':>10}{'p99':>10}{'max':>10}",
    ]
    for name, dist in summary["latency_ms"].items():
        if dist["count"]:
            values = "".join(f"{dist[k]:>10.1f}" for k in ("p50", "p90", "p95", "p99", "max"))
            lines.append(f"{name + ' ms':<18}{values}")
    rtf = summary["rtf"]
    if rtf["count"]:
        lines.append(
            f"{'rtf':<18}" + "".join(f"{rtf[k]:>10.3f}" for k in ("p50", "p90", "p95", "p99", "max"))
        )
    u = summary["underruns"]
    lines.append(
        f"underruns: {u['requests_with_underruns']} requests, {u['count']} stalls, "
        f"{u['total_stall_ms']:.0f} ms total, max {u['max_stall_ms']:.0f} ms, {u['stall_failures']} stall failures"
    )
    errors = summary["errors"]
    if errors["total"]:
        lines.append("errors: " + ", ".join(f"{k}={v}" for k, v in errors["by_kind"].items()))
        lines.extend(f"  {k}: {msg}" for k, msg in errors["examples"].items())
    t = summary["throughput"]
    lines.append(f"throughput: {t['chars_per_s']:.1f} chars/s, {t['audio_s_per_s']:.2f} audio s/s")
    if summary["cost"]["usd_per_million_chars"] is not None:
        lines.append(f"cost: ${summary['cost']['usd_per_million_chars']:.2f} per million characters")
    c = summary["client"]
    lines.append(
        f"client: cpu {c['cpu_utilization'] * 100:.0f}% ({c['cpu_ms_per_request']:.2f} ms/request), loop lag p99 {c['loop_lag_ms']['p99'] or 0:.2f} ms,"
        f" peak in flight {c['peak_in_flight']}"
    )
    return "\n".join(lines)
