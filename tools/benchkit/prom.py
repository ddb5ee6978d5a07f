"""Prometheus text exposition format -> flat samples, and the difference of two scrapes.

Generic on purpose: every series the server exports (today's and any added later, such as
`vivace_engine_gpu_seconds_total{engine,kind}`) appears in the diff without code changes here.
Counters and the `_sum`/`_count` of histograms and summaries are differenced; gauges are reported
as their value after; histogram buckets are left out (they would dominate the output).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Scrape:
    """One /metrics body: series key (`name{a="x",b="y"}`, labels sorted) -> (family type, value)."""

    samples: dict[str, tuple[str, float]]


def _family_type(name: str, types: dict[str, str]) -> tuple[str, str]:
    """(type, role) of a sample name: role is 'value', 'sum', 'count', 'bucket' or 'created'."""
    if name in types:
        return types[name], "value"
    for suffix in ("_bucket", "_sum", "_count", "_created", "_total"):
        base = name.removesuffix(suffix)
        if base != name and base in types:
            return types[base], suffix[1:] if suffix != "_total" else "value"
    return "untyped", "value"


def _number(text: str) -> float:
    lowered = text.lower()
    if lowered in ("+inf", "inf"):
        return math.inf
    if lowered == "-inf":
        return -math.inf
    return float(text)


def parse(text: str) -> Scrape:
    types: dict[str, str] = {}
    samples: dict[str, tuple[str, float]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) == 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        kind, role = _family_type(name, types)
        if role in ("bucket", "created"):
            continue
        pairs = sorted(_LABEL.findall(labels or ""))
        key = name + ("{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}" if pairs else "")
        try:
            number = _number(value)
        except ValueError:
            continue
        samples[key] = ("counter" if role in ("sum", "count") else kind, number)
    return Scrape(samples)


def diff(before: Scrape, after: Scrape, interval_s: float) -> dict[str, object]:
    """Counter deltas (missing before = 0; zero deltas dropped) and gauges' values after."""
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    for key, (kind, value) in sorted(after.samples.items()):
        if kind == "counter":
            delta = value - before.samples.get(key, (kind, 0.0))[1]
            if delta < 0:  # a reset (the server restarted its engine): report what we can see
                delta = value
            if delta:
                counters[key] = round(delta, 6)
        elif math.isfinite(value):
            gauges[key] = round(value, 6)
    return {"interval_s": round(interval_s, 3), "counters": counters, "gauges": gauges}


def label_values(series: dict[str, float], name: str, label: str) -> dict[str, float]:
    """Sum the series of family `name` by one label: e.g. GPU seconds per `kind`."""
    out: dict[str, float] = {}
    for key, value in series.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        labels = dict(_LABEL.findall(rest))
        if label in labels:
            out[labels[label]] = out.get(labels[label], 0.0) + value
    return out
