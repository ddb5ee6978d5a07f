"""An RPS sweep: one run per RPS value, each in DIR/rps-<value>/, an index in DIR/sweep.json, a PNG.

The server is not restarted between points (the client cannot do that); for like-for-like numbers
restart it yourself between invocations of `run`, or leave a cool-down so queues drain.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtest.bench import RunOptions, run_benchmark


def point_dir(out: Path, rps: float) -> Path:
    return out / f"rps-{rps:g}"


async def run_sweep(
    base: RunOptions, rps_values: list[float], out: Path, cooldown_s: float
) -> dict[str, Any]:
    if not rps_values:
        raise ValueError("a sweep needs at least one RPS value")
    points: list[dict[str, Any]] = []
    for number, rps in enumerate(rps_values):
        if number and cooldown_s > 0:
            await asyncio.sleep(cooldown_s)
        print(f"=== rps {rps:g} ===", flush=True)
        directory = point_dir(out, rps)
        summary = await run_benchmark(replace(base, rps=rps, out=str(directory)))
        points.append(
            {
                "rps": rps,
                "dir": directory.name,
                "achieved_rps": summary["achieved_rps"],
                "ttfa_p95_ms": summary["latency_ms"]["ttfa"]["p95"],
                "requests_with_underruns": summary["underruns"]["requests_with_underruns"],
                "errors": summary["errors"]["total"],
            }
        )
    index = {
        "schema": "vivace.loadtest.sweep.v1",
        "transport": base.transport,
        "url": base.url,
        "points": points,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(index, indent=2) + "\n")
    return index
