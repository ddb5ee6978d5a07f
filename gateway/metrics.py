"""Prometheus metrics through `prometheus_client`: the series the gateway exports and their exposition.

Conventions (ecosystem.md 5.1): snake_case, base units, `_total` on counters, low-cardinality
labels only (endpoint, code, engine, kind; never context or session ids); `_created` series off.
`Counter`, `Gauge` and `Histogram` keep the small call shape the gateway uses (label values
positional: `inc(*labels, amount=)`, `set(value, *labels)`, `observe(value, *labels)`); each
`GatewayMetrics` has its own registry, so several can live in one process (tests do).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest

from engine.gc_watch import process_watch

prometheus_client.disable_created_metrics()


class _Metric:
    def __init__(self, metric: Any, labels: Sequence[str]) -> None:
        self.metric = metric
        self.label_names = tuple(labels)

    def _child(self, labels: tuple[str, ...]) -> Any:
        return self.metric.labels(*labels) if self.label_names else self.metric


class Counter(_Metric):
    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        super().__init__(prometheus_client.Counter(name, help_text, tuple(labels), registry=None), labels)

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        """Counters never go down: a negative amount (a source that restarted) counts nothing."""
        self._child(labels).inc(max(amount, 0.0))


class Gauge(_Metric):
    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        super().__init__(prometheus_client.Gauge(name, help_text, tuple(labels), registry=None), labels)

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        self._child(labels).inc(amount)

    def dec(self, *labels: str, amount: float = 1.0) -> None:
        self._child(labels).dec(amount)

    def set(self, value: float, *labels: str) -> None:
        self._child(labels).set(value)


class Histogram(_Metric):
    def __init__(
        self, name: str, help_text: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> None:
        metric = prometheus_client.Histogram(
            name, help_text, tuple(labels), registry=None, buckets=tuple(buckets)
        )
        super().__init__(metric, labels)

    def observe(self, value: float, *labels: str) -> None:
        self._child(labels).observe(value)


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
            "Engine host time by activity: plan (the scheduler choosing batches), launch (queueing them on the device "
            "and completing those whose results stay there), wait_gpu (blocked on the device) and "
            "gc (paused in Python garbage collections).",
            ("engine", "activity"),
        )
        self.engine_codec_over_budget_total = Counter(
            "vivace_engine_codec_over_budget_total",
            "Codec plans whose device time exceeded the startup budget (4 ms) while a request awaited first audio, "
            "per lane (generation: newcomers' first chunks; codec: the codec stream's plans beside them).",
            ("engine", "lane"),
        )
        self.engine_admission = Gauge(
            "vivace_engine_admission",
            "Engine-reported admission measures: pressure (share of recent GPU time spent on playing streams near "
            "their deadlines) and utilization (GPU share keeping every generating stream real-time needs).",
            ("engine", "measure"),
        )
        self.engine_admission_limit = Gauge(
            "vivace_engine_admission_limit",
            "The limit past which the engine refuses newcomers, per admission measure.",
            ("engine", "measure"),
        )
        self.engine_slots_free = Gauge(
            "vivace_engine_slots_free", "Engine-reported free slots per resource pool.", ("engine", "pool")
        )
        self.engine_slots_total = Gauge(
            "vivace_engine_slots_total", "Engine-reported slots per resource pool.", ("engine", "pool")
        )
        self.gc_collections_total = Counter(
            "vivace_gateway_gc_collections_total", "Python garbage collections in the gateway process."
        )
        self.gc_pause_seconds_total = Counter(
            "vivace_gateway_gc_pause_seconds_total",
            "Time the gateway process stood still in Python garbage collections (engine/gc_watch.py).",
        )
        watch = process_watch("gateway")
        self._gc_seen = (watch.collections, watch.seconds)

    def render(self) -> str:
        """The /metrics body (Prometheus text exposition format 0.0.4)."""
        self._count_gc()
        registry = self.__dict__.get("_registry")
        if registry is None:  # every metric attribute, whoever added it, in one registry
            registry = CollectorRegistry(auto_describe=True)
            for metric in vars(self).values():
                if isinstance(metric, _Metric):
                    registry.register(metric.metric)
            self._registry = registry
        return generate_latest(registry).decode()

    def _count_gc(self) -> None:
        """The process's garbage collections since the last exposition (or since these metrics were made)."""
        watch = process_watch("gateway")
        collections, seconds = self._gc_seen
        self.gc_collections_total.inc(amount=watch.collections - collections)
        self.gc_pause_seconds_total.inc(amount=watch.seconds - seconds)
        self._gc_seen = (watch.collections, watch.seconds)
