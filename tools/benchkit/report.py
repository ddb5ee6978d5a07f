"""The benchmark's short markdown table: one row per point, from the points of bench.json.

Engine GPU time per work kind appears as a column when the server exports
`vivace_engine_gpu_seconds_total{engine,kind}`: GPU seconds per second of window, by kind; garbage-collection
pauses of the engine and the gateway over the window (engine/gc_watch.py) when either exports them; the engine
loop's host time (planning, launching, blocked on the GPU) per second of window when it exports them.
"""

from __future__ import annotations

from typing import Any

from engine.request import FRAMES_PER_SECOND

from .prom import label_values

GPU_SECONDS = "vivace_engine_gpu_seconds_total"
HOST_SECONDS = "vivace_engine_host_seconds_total"
GATEWAY_GC_SECONDS = "vivace_gateway_gc_pause_seconds_total"


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def gpu_share_by_kind(point: dict[str, Any]) -> dict[str, float]:
    """GPU seconds per second of window, by engine work kind (empty when not exported)."""
    metrics = point.get("metrics") or {}
    interval = metrics.get("interval_s") or 0.0
    if interval <= 0:
        return {}
    seconds = label_values(metrics.get("counters", {}), GPU_SECONDS, "kind")
    return {kind: value / interval for kind, value in sorted(seconds.items())}


def codec_frames_per_event_s(point: dict[str, Any]) -> float | None:
    """Frames the listeners received per second of codec-plan GPU (CUDA-event) time: issue 13's codec-efficiency
    figure (None when the codec's GPU seconds are not exported)."""
    codec = gpu_share_by_kind(point).get("codec_chunk")
    audio = point.get("audio_s_per_s")
    return audio * FRAMES_PER_SECOND / codec if codec and audio else None


def gc_pause_ms(point: dict[str, Any]) -> tuple[float, float] | None:
    """Milliseconds the engine and the gateway stood still in garbage collections over the window (None when
    neither exports it): a whole-server stall that no GPU figure explains shows here."""
    counters = (point.get("metrics") or {}).get("counters", {})
    engine = label_values(counters, HOST_SECONDS, "activity").get("gc")
    gateway = counters.get(GATEWAY_GC_SECONDS)
    if engine is None and gateway is None:
        return None
    return (engine or 0.0) * 1000, (gateway or 0.0) * 1000


HOST_ACTIVITIES = ("plan", "launch", "wait_gpu")


def host_share(point: dict[str, Any]) -> dict[str, float]:
    """The engine loop's host seconds per second of window: the scheduler's plan, the launches, the waits on the
    GPU (empty when not exported; engines before the fifteenth session counted launches under plan)."""
    metrics = point.get("metrics") or {}
    interval = metrics.get("interval_s") or 0.0
    if interval <= 0:
        return {}
    seconds = label_values(metrics.get("counters", {}), HOST_SECONDS, "activity")
    return {a: seconds[a] / interval for a in HOST_ACTIVITIES if a in seconds}


def table(points: list[dict[str, Any]]) -> str:
    with_kinds = any(gpu_share_by_kind(p) for p in points)
    with_sm = any((p.get("gpu") or {}).get("gpm") for p in points)
    head = ["point", "offered RPS", "achieved RPS", "TTFA p50 / p95 / p99 ms", "refused %", "errors",
            "underrun reqs", "audio s/s", "GPU util %"]  # fmt: skip
    head += ["SM active %"] if with_sm else []
    head += ["engine GPU s/s by kind", "codec frames per event-s"] if with_kinds else []
    with_gc = any(gc_pause_ms(p) for p in points)
    head += ["GC pause ms engine / gateway"] if with_gc else []
    with_host = any(host_share(p) for p in points)
    head += ["engine host s/s: plan / launch / wait"] if with_host else []
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for p in points:
        if p.get("status") != "ok":
            cells = [p["name"], _fmt(p.get("rps")), f"{p.get('status')}: {p.get('reason', '')}"]
            lines.append("| " + " | ".join(cells + [""] * (len(head) - len(cells))) + " |")
            continue
        ttfa = p["ttfa_ms"]
        errors = sum(p["errors_by_kind"].values())
        gpu = p.get("gpu") or {}
        cells = [
            p["name"], _fmt(p["offered_rps"]), _fmt(p["achieved_rps"]),
            f"{_fmt(ttfa['p50'])} / {_fmt(ttfa['p95'])} / {_fmt(ttfa['p99'])}",
            _fmt(p["refused_pct"]), str(errors), str(p["underruns"]["requests_with_underruns"]),
            _fmt(p["audio_s_per_s"]), _fmt(gpu.get("util_mean")),
        ]  # fmt: skip
        if with_sm:
            cells.append(_fmt((gpu.get("gpm") or {}).get("sm_util")))
        if with_kinds:
            share = gpu_share_by_kind(p)
            cells.append(" ".join(f"{k} {v:.2f}" for k, v in share.items()) or "–")
            rate = codec_frames_per_event_s(p)
            cells.append("–" if rate is None else f"{rate / 1000:.1f}k")
        if with_gc:
            pauses = gc_pause_ms(p)
            cells.append("–" if pauses is None else f"{pauses[0]:.0f} / {pauses[1]:.0f}")
        if with_host:
            host = host_share(p)
            cells.append(" / ".join(_fmt(host.get(a), 2) for a in HOST_ACTIVITIES))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
