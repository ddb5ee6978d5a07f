"""`python -m loadtest soak`: a steady mixed load on a real server for a while; nothing may leak or hang.

One promise: starts `python -m gateway --model tiny --device cpu` (plus `--server-arg`s) on a free port,
warms it up, then for `--duration` sends a steady open-loop stream of mixed clients (loadtest/soak_clients.py:
HTTP, HTTP hung up mid-stream, WebSocket with three interleaved contexts, barge-in, dropped connections,
slow readers) while sampling every second the gateway's and each engine's RSS, open descriptors, threads
and mapped /dev/shm, and the engines' slot pools from /metrics. Then it stops the load, and fails (exit 1)
when:
  - any client got neither a completion nor a clear (structured) error;
  - a process's RSS at the end is more than 10 % above its RSS after the warm-up (private RSS: shared
    memory pages count only once touched, so the rings' pages are reported apart, bounded by their size);
  - a process's descriptors or threads are not back to their after-warm-up baseline +- 2;
  - its mapped /dev/shm changed, or an engine was restarted;
  - any slot of any pool is not free `--settle` (5 s) after the load stopped;
  - the server does not exit 0 on SIGTERM.
It prints a table of the figures and writes them, with every sample, to `--out` as JSON.

glibc: by default the server runs with fixed malloc thresholds (`GLIBC_FIXED`). With glibc's dynamic mmap
threshold a CPU engine's heap keeps freed tensor memory, so its RSS climbs to a high-water mark of
fragmentation that hides or fakes a leak; fixed thresholds return freed memory, so what still grows is
memory still referenced. `--malloc default` measures the server exactly as deployed (docs/reliability.md
has both figures).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loadtest import soak_clients as sc
from loadtest.procstat import ProcSample, children_with_arg, sample, shm_used_bytes
from loadtest.prompts import load_prompts

# kind -> weight in the mix
MIX: dict[str, int] = {
    "http": 3,
    "http_abandon": 1,
    "ws_multi": 2,
    "ws_cancel": 1,
    "ws_disconnect": 1,
    "ws_slow": 1,
}
REPO = Path(__file__).resolve().parent.parent
GLIBC_FIXED = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


@dataclass(frozen=True)
class SoakOptions:
    duration_s: float = 60.0
    warmup_s: float = 15.0
    rate: float = 0.5  # clients started per second (open loop, Poisson): within a 2-core CPU's means
    max_clients: int = 32  # arrivals beyond this many in flight are skipped (and counted)
    timeout_s: float = 120.0  # per client
    settle_s: float = 5.0
    max_rss_growth: float = 0.10
    slack: int = 2  # descriptors and threads may differ from the baseline by this much
    seed: int = 0
    malloc: str = "fixed"  # "fixed": GLIBC_FIXED in the server's environment; "default": glibc as it is
    max_chars: int = 90  # prompts are cut to this many characters (whole words)
    server_args: tuple[str, ...] = ()
    out: Path | None = None


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/audio/speech/live"

    def engines(self) -> list[int]:
        return children_with_arg(self.proc.pid, b"--socket")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(extra: tuple[str, ...], env_extra: dict[str, str], ready_within_s: float = 300.0) -> Server:
    port = free_port()
    fd, log_name = tempfile.mkstemp(prefix="vivace-soak-", suffix=".log")
    command = [
        sys.executable,
        "-m",
        "gateway",
        "--port",
        str(port),
        "--model",
        "tiny",
        "--device",
        "cpu",
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIVACE_")} | env_extra
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = Server(proc, port, Path(log_name))
    deadline = time.monotonic() + ready_within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"the server exited with {proc.returncode}:\n{server.log_path.read_text()[-3000:]}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.base + "/ready", timeout=5).status_code == 200:
                return server
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the server was not ready within {ready_within_s} s")


def stop_server(server: Server, timeout_s: float = 60.0) -> int | None:
    """SIGTERM (a drain), then the exit status; None if it had to be killed."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
        return None


def parse_metrics(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                values[name] = float(value)
    return values


def slot_pools(metrics: dict[str, float]) -> dict[str, tuple[float, float]]:
    """`engine/pool` -> (free, total) from vivace_engine_slots_free / _total."""
    pools = {}
    for name, total in metrics.items():
        if name.startswith("vivace_engine_slots_total{"):
            labels = name[name.index("{") :]
            free = metrics.get("vivace_engine_slots_free" + labels, -1.0)
            pools[labels] = (free, total)
    return pools


def in_flight(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("vivace_engine_requests_in_flight"))


# ------------------------------------------------------------------ load


@dataclass
class Load:
    options: SoakOptions
    server: Server
    texts: list[str]
    rng: random.Random
    outcomes: list[tuple[str, sc.Outcome]] = field(default_factory=list)  # (phase, outcome)
    skipped: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def _text(self) -> str:
        return self.rng.choice(self.texts)

    def _client(self, kind: str, http: httpx.AsyncClient) -> Any:
        deadline = time.monotonic() + self.options.timeout_s
        voice = self.rng.choice(["ryan", "serena", "aiden", "vivian"])
        text = self._text()
        ws = self.server.ws
        if kind == "http":
            return lambda: sc.http_speech(http, text, voice, abandon=False)
        if kind == "http_abandon":
            return lambda: sc.http_speech(http, text, voice, abandon=True)
        if kind == "ws_multi":
            texts = [text, self._text(), self._text()]
            return lambda: sc.ws_multi(ws, texts, deadline)
        how = kind.removeprefix("ws_")
        return lambda: sc.ws_interrupted(ws, text, deadline, how)

    async def run(self, phase: str, seconds: float, http: httpx.AsyncClient) -> None:
        kinds, weights = list(MIX), list(MIX.values())
        end = time.monotonic() + seconds
        next_at = time.monotonic()
        while next_at < end:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += self.rng.expovariate(self.options.rate)
            if len(self._tasks) >= self.options.max_clients:
                self.skipped += 1
                continue
            kind = self.rng.choices(kinds, weights)[0]
            task = asyncio.create_task(self._one(phase, kind, self._client(kind, http)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await asyncio.sleep(max(0.0, end - time.monotonic()))  # the window lasts its full length

    async def _one(self, phase: str, kind: str, make: Any) -> None:
        self.outcomes.append((phase, await sc.run_client(kind, make, self.options.timeout_s + 5)))

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks))


# ------------------------------------------------------------------ sampling


def _sample_all(server: Server) -> dict[str, ProcSample | None]:
    found: dict[str, ProcSample | None] = {"gateway": sample(server.proc.pid)}
    for pid in server.engines():
        found[f"engine:{pid}"] = sample(pid)
    return found


async def _sampler(server: Server, samples: list[dict[str, Any]], phase: list[str], every_s: float) -> None:
    started = time.monotonic()
    while True:
        reading = await asyncio.to_thread(_sample_all, server)
        samples.append(
            {
                "t": round(time.monotonic() - started, 2),
                "phase": phase[0],
                "shm_used_bytes": shm_used_bytes(),
                **{name: asdict(s) for name, s in reading.items() if s is not None},
            }
        )
        await asyncio.sleep(every_s)


async def _metrics(base: str) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=10) as client:
        return parse_metrics((await client.get(base + "/metrics")).text)


async def _settle(server: Server, settle_s: float) -> tuple[float | None, dict[str, tuple[float, float]]]:
    """Seconds until every slot is free and nothing is in flight (None: not within settle_s)."""
    started = time.monotonic()
    pools: dict[str, tuple[float, float]] = {}
    while True:
        metrics = await _metrics(server.base)
        pools = slot_pools(metrics)
        if all(free == total for free, total in pools.values()) and in_flight(metrics) == 0:
            return time.monotonic() - started, pools
        if time.monotonic() - started > settle_s:
            return None, pools
        await asyncio.sleep(0.25)


# ------------------------------------------------------------------ the soak


async def _soak(options: SoakOptions, server: Server) -> dict[str, Any]:
    rng = random.Random(options.seed)
    texts = [_cut(p.text, options.max_chars) for p in load_prompts()]
    load = Load(options, server, texts, rng)
    samples: list[dict[str, Any]] = []
    phase = ["warmup"]
    sampler = asyncio.create_task(_sampler(server, samples, phase, 1.0))
    engines_at_start = server.engines()
    limits = httpx.Limits(max_connections=options.max_clients * 2)
    # One HTTP client per phase, closed before each sample: its pooled keep-alive connections are not leaks.
    async with httpx.AsyncClient(base_url=server.base, timeout=options.timeout_s, limits=limits) as http:
        await load.run("warmup", options.warmup_s, http)
        await load.drain()
    settled_warm, _ = await _settle(server, options.timeout_s)
    await asyncio.sleep(1.0)  # let closed sockets' descriptors go
    baseline = await asyncio.to_thread(_sample_all, server)
    phase[0] = "load"
    load_started = time.monotonic()
    async with httpx.AsyncClient(base_url=server.base, timeout=options.timeout_s, limits=limits) as http:
        await load.run("load", options.duration_s, http)
        load_ended = time.monotonic()
        phase[0] = "drain"
        await load.drain()
    phase[0] = "settle"
    settled_s, pools = await _settle(server, options.settle_s)
    await asyncio.sleep(1.0)
    final = await asyncio.to_thread(_sample_all, server)
    engines_at_end = server.engines()
    sampler.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampler
    return {
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
        "load_seconds": round(load_ended - load_started, 1),
        "warmup_settled": settled_warm is not None,
        "settled_seconds": None if settled_s is None else round(settled_s, 2),
        "slot_pools_after_settle": {k: list(v) for k, v in pools.items()},
        "engines": {"at_start": engines_at_start, "at_end": engines_at_end},
        "baseline": {k: asdict(v) for k, v in baseline.items() if v is not None},
        "final": {k: asdict(v) for k, v in final.items() if v is not None},
        "peak_private": _peaks(samples, "private_bytes"),
        "outcomes": _count(load.outcomes),
        "seconds": _durations(load.outcomes),
        "failures": [asdict(o) | {"phase": p} for p, o in load.outcomes if o.failed][:50],
        "clients": len(load.outcomes),
        "skipped_arrivals": load.skipped,
        "samples": samples,
    }


def _cut(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return text[:max_chars].rsplit(" ", 1)[0]


def _peaks(samples: list[dict[str, Any]], key: str) -> dict[str, int]:
    peaks: dict[str, int] = {}
    for s in samples:
        for name, value in s.items():
            if isinstance(value, dict) and key in value:
                peaks[name] = max(peaks.get(name, 0), value[key])
    return peaks


def _count(outcomes: list[tuple[str, sc.Outcome]]) -> dict[str, dict[str, int]]:
    table: dict[str, Counter[str]] = {}
    for _, outcome in outcomes:
        table.setdefault(outcome.kind, Counter())[outcome.result] += 1
    return {kind: dict(counter) for kind, counter in sorted(table.items())}


def _durations(outcomes: list[tuple[str, sc.Outcome]]) -> dict[str, dict[str, float]]:
    """Per client kind: median and longest time from start to the final answer, in seconds."""
    by_kind: dict[str, list[float]] = {}
    for _, outcome in outcomes:
        by_kind.setdefault(outcome.kind, []).append(outcome.seconds)
    return {
        kind: {"p50": round(sorted(values)[len(values) // 2], 2), "max": round(max(values), 2)}
        for kind, values in sorted(by_kind.items())
    }


def check(report: dict[str, Any], options: SoakOptions) -> list[str]:
    """Every broken rule, in words (empty: the soak passed)."""
    problems = []
    if report["failures"]:
        problems.append(f"{len(report['failures'])} client(s) got neither a completion nor a clear error")
    if report["engines"]["at_start"] != report["engines"]["at_end"]:
        problems.append(f"engines changed: {report['engines']}")
    if report["settled_seconds"] is None:
        problems.append(
            f"slots not all free {options.settle_s} s after the load: {report['slot_pools_after_settle']}"
        )
    for name, before in report["baseline"].items():
        after = report["final"].get(name)
        if after is None:
            problems.append(f"{name} is gone")
            continue
        if after["private_bytes"] > before["private_bytes"] * (1 + options.max_rss_growth):
            growth = after["private_bytes"] / before["private_bytes"] - 1
            problems.append(f"{name} private RSS grew {growth:.1%} after the warm-up")
        for key in ("fds", "threads"):
            if abs(after[key] - before[key]) > options.slack:
                problems.append(f"{name} {key}: {before[key]} after the warm-up, {after[key]} at the end")
        if after["shm_bytes"] != before["shm_bytes"]:
            problems.append(f"{name} mapped /dev/shm: {before['shm_bytes']} -> {after['shm_bytes']} bytes")
    if report["exit_status"] != 0:
        problems.append(f"the server's exit status after SIGTERM was {report['exit_status']}")
    return problems


def render(report: dict[str, Any], problems: list[str]) -> str:
    mib = 1 << 20
    lines = [
        f"soak: {report['load_seconds']} s of load at {report['options']['rate']} clients/s "
        f"(glibc malloc {report['options']['malloc']}), "
        f"{report['clients']} clients ({report['skipped_arrivals']} arrivals skipped at the in-flight cap)",
        "",
        "| process | private RSS after warm-up | at end | peak | fds | threads | shm resident | mapped /dev/shm |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, before in report["baseline"].items():
        after = report["final"].get(name, {})
        lines.append(
            f"| {name.split(':')[0]} | {before['private_bytes'] / mib:.1f} MiB "
            f"| {after.get('private_bytes', 0) / mib:.1f} MiB | {report['peak_private'].get(name, 0) / mib:.1f} MiB "
            f"| {before['fds']} -> {after.get('fds')} | {before['threads']} -> {after.get('threads')} "
            f"| {before['rss_shmem_bytes'] / mib:.1f} -> {after.get('rss_shmem_bytes', 0) / mib:.1f} MiB "
            f"| {before['shm_bytes'] / mib:.1f} -> {after.get('shm_bytes', 0) / mib:.1f} MiB |"
        )
    lines += ["", "| client | results | seconds p50 / max |", "|---|---|---|"]
    for kind, results in report["outcomes"].items():
        took = report["seconds"][kind]
        counts = ", ".join(f"{r} {n}" for r, n in sorted(results.items()))
        lines.append(f"| {kind} | {counts} | {took['p50']:.1f} / {took['max']:.1f} |")
    settled = report["settled_seconds"]
    lines += [
        "",
        f"slots all free {settled:.2f} s after the load" if settled is not None else "slots NOT all free",
        f"server exit status after SIGTERM: {report['exit_status']}",
        "PASS" if not problems else "FAIL:\n  - " + "\n  - ".join(problems),
    ]
    return "\n".join(lines)


def run_soak(options: SoakOptions) -> int:
    server = start_server(options.server_args, GLIBC_FIXED if options.malloc == "fixed" else {})
    try:
        report = asyncio.run(_soak(options, server))
    finally:
        status = stop_server(server)
    report["exit_status"] = status
    problems = check(report, options)
    report["problems"] = problems
    if problems:
        report["server_log_tail"] = server.log_path.read_text(errors="replace")[-4000:]
    server.log_path.unlink(missing_ok=True)
    print(render(report, problems))
    if options.out is not None:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(json.dumps(report, indent=1))
        print(f"wrote {options.out}")
    return 0 if not problems else 1
