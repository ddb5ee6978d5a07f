"""Client efficiency: can this generator drive N RPS from one core without becoming the bottleneck?

Starts the fake server (loadtest/fake_server.py) in a child process on the other cores, pins the
generator to one core, runs a normal benchmark against it, and judges the generator by what it can
see of itself:

    scheduling lag p99   how late arrivals were dispatched      (must stay < 5 ms)
    event-loop lag p99   how late a 5 ms timer fired             (must stay < 5 ms)
    client CPU           generator CPU time / wall time          (must stay < 85% of its core)
    TTFA error p50       measured - known TTFA of the fake       (reported; includes the server's own lag)

The fake's audio is known exactly, so its true TTFA is ttfa_ms + leading_silence_ms.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from loadtest.bench import RunOptions, run_benchmark
from loadtest.fake_audio import FakeVoice

MAX_SCHEDULING_LAG_P99_MS = 5.0
MAX_LOOP_LAG_P99_MS = 5.0
MAX_CLIENT_CPU = 0.85


def start_fake_server(
    voice: FakeVoice, cpus: set[int] | None = None, timeout_s: float = 20.0
) -> tuple[subprocess.Popen[str], str]:
    """Start `python -m loadtest fake-server` as a child; return it and its base URL once it answers."""
    args = [sys.executable, "-m", "loadtest", "fake-server", "--port", "0"]
    args += [f"--ttfa-ms={voice.ttfa_ms}", f"--leading-silence-ms={voice.leading_silence_ms}"]
    args += [f"--chunk-ms={voice.chunk_ms}", f"--speed={voice.speed}", f"--fail-every={voice.fail_every}"]
    if voice.stall_at_ms is not None:
        args += [f"--stall-at-ms={voice.stall_at_ms}", f"--stall-ms={voice.stall_ms}"]
    preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    child = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=preexec,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    if "listening on" not in line:
        child.kill()
        raise RuntimeError(f"fake server did not start (said {line!r})")
    url = line.split("listening on", 1)[1].strip()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=1.0).status_code == 200:
                return child, url
        except httpx.HTTPError:
            time.sleep(0.05)
    child.kill()
    raise RuntimeError("fake server never became ready")


def stop(child: subprocess.Popen[str]) -> None:
    child.terminate()
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def verdict(summary: dict[str, Any], voice: FakeVoice) -> dict[str, Any]:
    lag_p99 = summary["latency_ms"]["scheduling_lag"]["p99"] or 0.0
    loop_p99 = summary["client"]["loop_lag_ms"]["p99"] or 0.0
    cpu = summary["client"]["cpu_utilization"]
    ttfa_p50 = summary["latency_ms"]["ttfa"]["p50"]
    return {
        "rps": summary["config"]["rps"],
        "transport": summary["config"]["transport"],
        "requests": summary["requests"],
        "errors": summary["errors"]["by_kind"],
        "scheduling_lag_p99_ms": lag_p99,
        "loop_lag_p99_ms": loop_p99,
        "client_cpu": cpu,
        "client_cpu_ms_per_request": summary["client"]["cpu_ms_per_request"],
        "chunks_per_s": summary["throughput"]["chunks_per_s"],
        "client_cpu_us_per_chunk": summary["client"]["cpu_s"]
        * 1e6
        / max(1.0, summary["throughput"]["chunks_per_s"] * summary["config"]["duration_s"]),
        "projected_cpu_at_200_rps": summary["client"]["cpu_ms_per_request"] * 200 / 1000.0,
        "peak_in_flight": summary["client"]["peak_in_flight"],
        "expected_ttfa_ms": voice.ttfa_ms + voice.leading_silence_ms,
        "ttfa_p50_ms": ttfa_p50,
        "ttfa_p99_ms": summary["latency_ms"]["ttfa"]["p99"],
        "requests_with_underruns": summary["underruns"]["requests_with_underruns"],
        "kept_up": lag_p99 < MAX_SCHEDULING_LAG_P99_MS
        and loop_p99 < MAX_LOOP_LAG_P99_MS
        and cpu < MAX_CLIENT_CPU
        and summary["errors"]["total"] == 0,
    }


def run_selfbench(
    base: RunOptions, transports: list[str], voice: FakeVoice, out: Path | None = None
) -> list[dict[str, Any]]:
    """One run per transport against a fresh fake server; writes out/<transport>/ and out/selfbench.json."""
    cores = sorted(os.sched_getaffinity(0))
    client_cpu = {cores[0]}
    server_cpus = set(cores[1:]) or None
    child, url = start_fake_server(voice, server_cpus)
    results = []
    try:
        os.sched_setaffinity(0, client_cpu)
        for transport in transports:
            run_dir = str(out / transport) if out is not None else None
            options = replace(base, url=url, transport=transport, out=run_dir)
            summary = asyncio.run(run_benchmark(options, echo=True))
            result = verdict(summary, voice)
            result["client_cores"], result["server_cores"] = (
                sorted(client_cpu),
                sorted(server_cpus or client_cpu),
            )
            print(json.dumps(result, indent=2), flush=True)
            results.append(result)
    finally:
        os.sched_setaffinity(0, set(cores))
        stop(child)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "selfbench.json").write_text(json.dumps(results, indent=2) + "\n")
    return results
