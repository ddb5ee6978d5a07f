"""Prometheus metrics in the text exposition format, written by hand (no dependency).

Conventions (ecosystem.md 5.1): snake_case, base units, `_total` on counters, low-cardinality
labels only (endpoint, code, engine, kind; never context or session ids).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

LabelValues = tuple[str, ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: LabelValues, extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name = name
        self.help_text = help_text
        self.label_names = tuple(labels)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labels)
        self.values: dict[LabelValues, float] = {} if labels else {(): 0.0}

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def render(self) -> list[str]:
        return [
            f"{self.name}{_labels(self.label_names, k)} {_number(v)}" for k, v in sorted(self.values.items())
        ]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float, *labels: str) -> None:
        self.values[labels] = value

    def dec(self, *labels: str, amount: float = 1.0) -> None:
        self.inc(*labels, amount=-amount)


class Histogram(_Metric):
    kind = "histogram"

    def __init__(
        self, name: str, help_text: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> None:
        super().__init__(name, help_text, labels)
        self.buckets = tuple(sorted(buckets))
        self.series: dict[LabelValues, tuple[list[int], list[float]]] = {}

    def observe(self, value: float, *labels: str) -> None:
        counts, total = self.series.setdefault(labels, ([0] * (len(self.buckets) + 1), [0.0]))
        counts[bisect.bisect_left(self.buckets, value)] += 1
        total[0] += value

    def render(self) -> list[str]:
        lines = []
        for labels, (counts, total) in sorted(self.series.items()):
            running = 0
            for bound, count in zip((*self.buckets, math.inf), counts, strict=True):
                running += count
                le = f'le="{_number(bound)}"'
                lines.append(f"{self.name}_bucket{_labels(self.label_names, labels, le)} {running}")
            lines.append(f"{self.name}_sum{_labels(self.label_names, labels)} {_number(total[0])}")
            lines.append(f"{self.name}_count{_labels(self.label_names, labels)} {running}")
        return lines


LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
LEAD_BUCKETS = (-1.0, -0.1, 0.0, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class GatewayMetrics:
    """Every series the gateway exports; `render()` is the /metrics body."""

    def __init__(self) -> None:
        self.sessions_active = Gauge("vivace_sessions_active", "Open WebSocket sessions.")
        self.contexts_active = Gauge("vivace_contexts_active", "Live contexts (WebSocket) and HTTP requests.")
        self.requests_total = Counter(
            "vivace_requests_total", "Synthesis requests by endpoint and outcome.", ("endpoint", "outcome")
        )
        self.errors_total = Counter("vivace_errors_total", "Error events and responses by code.", ("code",))
        self.ttfa_seconds = Histogram(
            "vivace_ttfa_seconds",
            "Server-side time to first audio: request (first text) accepted to first audio byte sent.",
            LATENCY_BUCKETS,
            ("endpoint",),
        )
        self.audio_seconds_total = Counter("vivace_audio_seconds_total", "Audio sent.", ("endpoint",))
        self.outbound_bytes = Gauge("vivace_outbound_queued_bytes", "Bytes queued for WebSocket clients.")
        self.playback_reports_total = Counter(
            "vivace_playback_reports_total", "playback.position reports received."
        )
        self.client_underruns_total = Counter(
            "vivace_client_underruns_total", "Underruns reported by clients in playback.position."
        )
        self.deadline_lead_seconds = Histogram(
            "vivace_deadline_lead_seconds",
            "Audio the listener had ahead (deadline minus now) whenever a deadline was sent to the engine.",
            LEAD_BUCKETS,
            ("source",),
        )
        self.deadlines_total = Counter(
            "vivace_deadlines_sent_total",
            "Deadlines sent to engines, by source (report | server_model).",
            ("source",),
        )
        self.engine_ready = Gauge(
            "vivace_engine_ready", "1 when the engine is connected and warm.", ("engine",)
        )
        self.engine_restarts_total = Counter(
            "vivace_engine_restarts_total", "Engine process restarts.", ("engine",)
        )
        self.engine_in_flight = Gauge(
            "vivace_engine_requests_in_flight",
            "Requests sent to an engine and not yet finished.",
            ("engine",),
        )
        self.engine_active = Gauge(
            "vivace_engine_active_requests", "Engine-reported active requests.", ("engine",)
        )
        self.engine_queued = Gauge(
            "vivace_engine_queued_requests", "Engine-reported queued requests.", ("engine",)
        )
        self.engine_batch_size = Gauge(
            "vivace_engine_batch_size", "Engine-reported mean batch size per work kind.", ("engine", "kind")
        )
        self.engine_step_seconds = Gauge(
            "vivace_engine_step_seconds", "Engine-reported mean step time per work kind.", ("engine", "kind")
        )
        self.engine_gpu_seconds_total = Counter(
            "vivace_engine_gpu_seconds_total",
            "Device time of finished plans per work kind, from CUDA events around each plan (CPU: wall time).",
            ("engine", "kind"),
        )
        self.engine_plans_total = Counter(
            "vivace_engine_plans_total", "Plans finished per work kind.", ("engine", "kind")
        )
        self.engine_host_seconds_total = Counter(
            "vivace_engine_host_seconds_total",
            "Engine host time by activity: plan (scheduling and launching) and wait_gpu (blocked on the device).",
            ("engine", "activity"),
        )
        self.engine_codec_over_budget_total = Counter(
            "vivace_engine_codec_over_budget_total",
            "Codec plans whose device time exceeded the startup budget (4 ms) while a request awaited first audio.",
            ("engine",),
        )
        self.engine_slots_free = Gauge(
            "vivace_engine_slots_free", "Engine-reported free slots per resource pool.", ("engine", "pool")
        )
        self.engine_slots_total = Gauge(
            "vivace_engine_slots_total", "Engine-reported slots per resource pool.", ("engine", "pool")
        )

    def render(self) -> str:
        lines: list[str] = []
        for metric in vars(self).values():
            if isinstance(metric, _Metric):
                lines += metric.header() + metric.render()  # type: ignore[attr-defined]
        return "\n".join(lines) + "\n"
