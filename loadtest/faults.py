"""`python -m loadtest faults`: inject each fault into a loaded server; print what every request got.

One promise: for each fault below it starts a fresh server (`python -m gateway --model tiny --device cpu`,
or the fake engine where the fault needs an engine faster than a CPU), puts a steady mixed load on it
(loadtest/soak_clients.py), injects the fault, and reports: what every in-flight and later request got,
how long until a new request got audio again (from the fault, or from its end for a pause), and whether anything leaked (engine processes,
gateway descriptors, busy slots). A fault passes when every request completed or got a clear error, the
server serves again (or, for a stop, exits 0 having drained), and nothing leaked. Exit status 1 if any
fault failed; `--out` writes the table and the raw results as JSON.

    engine-kill       SIGKILL the engine, --engines 1
    engine-kill-2     SIGKILL one of two engines, --engines 2 (the other keeps serving)
    engine-stall      SIGSTOP the engine past --heartbeat-timeout-s 2 (it is killed and replaced)
    gateway-sigterm   SIGTERM the gateway: drain, refuse new work, exit 0, no engine left behind
    audio-ring-full   SIGSTOP the gateway 3 s while an instant (fake) engine keeps producing: its
                      8 MiB reply ring fills, the engine keeps the rest in its backlog, nothing is lost
    request-ring-full SIGSTOP the engine 3 s while clients append long texts: the 1 MiB request ring
                      fills; appends that do not fit get engine_busy
    shm-exhausted     start with a 1 MiB /dev/shm (own mount namespace; root): the server exits 1 with
                      the reason within 60 s
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loadtest import soak_clients as sc
from loadtest.procstat import sample
from loadtest.soak import (
    REPO,
    Server,
    free_port,
    in_flight,
    parse_metrics,
    slot_pools,
    start_server,
    stop_server,
)

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A steady voice keeps talking while the server is tested.",
    "Faults come and go; every request must still get an answer.",
    "One more sentence, long enough to be interrupted midway.",
]
FAKE = ("--fake-engine", "--engine-arg=--ms-per-frame=10")


@dataclass
class FaultResult:
    name: str
    outcomes: dict[str, int] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    back_in_s: float | None = None  # fault -> a new request completed (None: not applicable or never)
    exit_status: int | None = None  # for faults that stop the server
    leaks: list[str] = field(default_factory=list)
    notes: str = ""

    @property
    def passed(self) -> bool:
        return not self.failures and not self.leaks and "FAIL" not in self.notes


class Load:
    """A steady mix of clients until `stop()`; every outcome is kept."""

    def __init__(self, server: Server, rate: float, kinds: tuple[str, ...], seed: int = 0) -> None:
        self.server, self.rate, self.kinds = server, rate, kinds
        self.rng = random.Random(seed)
        self.outcomes: list[sc.Outcome] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = True

    def _make(self, kind: str, http: httpx.AsyncClient) -> Callable[[], Awaitable[str]]:
        text, deadline = self.rng.choice(TEXTS), time.monotonic() + 60
        if kind == "http":
            return lambda: sc.http_speech(http, text, "ryan", abandon=False)
        if kind == "ws_multi":
            return lambda: sc.ws_multi(self.server.ws, [text, *self.rng.sample(TEXTS, 2)], deadline)
        if kind == "ws_long":
            return lambda: _ws_long_appends(self.server.ws, deadline)
        return lambda: sc.ws_interrupted(self.server.ws, text, deadline, kind.removeprefix("ws_"))

    async def run(self) -> None:
        async with httpx.AsyncClient(base_url=self.server.base, timeout=60) as http:
            while self._running:
                kind = self.rng.choice(self.kinds)
                task = asyncio.create_task(self._one(kind, self._make(kind, http)))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                await asyncio.sleep(self.rng.expovariate(self.rate))
            if self._tasks:
                await asyncio.wait(set(self._tasks))

    async def _one(self, kind: str, make: Callable[[], Awaitable[str]]) -> None:
        self.outcomes.append(await sc.run_client(kind, make, 70))

    def stop(self) -> None:
        self._running = False


async def _ws_long_appends(url: str, deadline: float) -> str:
    """Appends of 1000 characters, 100 a second: fills a stalled engine's request ring quickly."""
    chunk = ("word " * 200)[:1000]
    async with sc.connect(url, subprotocols=[sc.PROTOCOL], max_size=None) as ws:  # type: ignore[list-item]
        sock = sc.LiveSocket(ws)
        for _ in range(30):
            if "c" in sock.done or sock.errors:
                break
            await sock.send(type="input_text.append", context_id="c", text=chunk)
            with contextlib.suppress(TimeoutError):
                await sock.receive(0.01)
        if "c" not in sock.done and not sock.errors:
            await sock.send(type="context.cancel", context_id="c")  # the text is long: do not wait for it
        await sock.until(lambda: "c" in sock.done, deadline)
        code = sc.first_error_code(sock, "c")
        if code is not None:
            raise sc.ServerError(code)
        return str(sock.done["c"]["reason"])


async def _serves_again(server: Server, since: float, limit_s: float = 60.0) -> float | None:
    """Seconds from `since` until a new HTTP request gets its first audio (None: not within limit_s)."""
    async with httpx.AsyncClient(base_url=server.base, timeout=30) as http:
        while time.monotonic() - since < limit_s:
            with contextlib.suppress(sc.ServerError, sc.Broken, httpx.HTTPError, OSError):
                if await sc.http_speech(http, "Back again.", "ryan", abandon=True) == "abandoned":
                    return time.monotonic() - since
            await asyncio.sleep(0.1)
    return None


async def _settled(server: Server, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    async with httpx.AsyncClient(base_url=server.base, timeout=10) as http:
        while time.monotonic() < deadline:
            metrics = parse_metrics((await http.get("/metrics")).text)
            pools = slot_pools(metrics)
            if in_flight(metrics) == 0 and all(free == total for free, total in pools.values()):
                return True
            await asyncio.sleep(0.25)
    return False


def _engines_of(gateway_pid: int) -> list[int]:
    """Every live engine a gateway started (children or orphans), found by its socket name."""
    marker = f"@vivace-{gateway_pid}-".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (
                    marker in (entry / "cmdline").read_bytes()
                    and "Z" not in (entry / "stat").read_text().split()[2]
                ):
                    found.append(int(entry.name))
    return found


def _record(result: FaultResult, outcomes: list[sc.Outcome]) -> None:
    result.outcomes = dict(Counter(o.result for o in outcomes))
    result.failures = [asdict(o) for o in outcomes if o.failed]


async def _with_load(
    server: Server,
    result: FaultResult,
    inject: Callable[[], Awaitable[float]],
    *,
    engines: int,
    kinds: tuple[str, ...] = ("http", "ws_multi", "ws_cancel", "ws_disconnect"),
    rate: float = 3.0,
) -> None:
    """Load, inject (returns the fault's moment), measure recovery, stop the load, check for leaks."""
    baseline = sample(server.proc.pid)
    load = Load(server, rate, kinds)
    runner = asyncio.create_task(load.run())
    await asyncio.sleep(3.0)
    fault_at = await inject()
    result.back_in_s = await _serves_again(server, fault_at)
    await asyncio.sleep(2.0)  # some load after the recovery too
    load.stop()
    await runner
    _record(result, load.outcomes)
    if not await _settled(server):
        result.leaks.append("slots or in-flight requests not free 10 s after the load")
    live = server.engines()
    if len(live) != engines or len(_engines_of(server.proc.pid)) != engines:
        result.leaks.append(
            f"{len(live)} engine children, {len(_engines_of(server.proc.pid))} engine processes"
        )
    await asyncio.sleep(1.0)
    after = sample(server.proc.pid)
    if baseline is not None and after is not None and abs(after.fds - baseline.fds) > 2:
        result.leaks.append(f"gateway descriptors {baseline.fds} -> {after.fds}")


# ------------------------------------------------------------------ the faults


async def engine_kill(engines: int) -> FaultResult:
    result = FaultResult("engine-kill" if engines == 1 else "engine-kill-2")
    server = start_server(("--engines", str(engines)), {})
    try:

        async def inject() -> float:
            os.kill(server.engines()[0], signal.SIGKILL)
            return time.monotonic()

        await _with_load(server, result, inject, engines=engines)
    finally:
        result.exit_status = stop_server(server)
    return result


async def engine_stall() -> FaultResult:
    result = FaultResult("engine-stall", notes="--heartbeat-timeout-s 2")
    server = start_server(("--heartbeat-timeout-s", "2"), {})
    try:
        stalled: list[int] = []

        async def inject() -> float:
            stalled.append(server.engines()[0])
            os.kill(stalled[0], signal.SIGSTOP)
            return time.monotonic()

        await _with_load(server, result, inject, engines=1)
        if stalled and _alive(stalled[0]):
            result.leaks.append(f"the stalled engine {stalled[0]} still exists")
    finally:
        result.exit_status = stop_server(server)
    return result


async def audio_ring_full() -> FaultResult:
    result = FaultResult("audio-ring-full", notes="fake engine, instant; gateway stopped 3 s")
    server = start_server(("--fake-engine", "--engine-arg=--ms-per-frame=0"), {})
    try:

        async def inject() -> float:
            os.kill(server.proc.pid, signal.SIGSTOP)
            await asyncio.sleep(3.0)
            os.kill(server.proc.pid, signal.SIGCONT)
            return time.monotonic()

        await _with_load(server, result, inject, engines=1, kinds=("http", "ws_multi"), rate=20.0)
        if result.outcomes.get("completed", 0) != sum(result.outcomes.values()):
            result.notes += "; FAIL: with no engine death every request must complete"
    finally:
        result.exit_status = stop_server(server)
    return result


async def request_ring_full() -> FaultResult:
    result = FaultResult("request-ring-full", notes="engine stopped 3 s under 1000-character appends")
    server = start_server(FAKE, {})
    try:

        async def inject() -> float:
            pid = server.engines()[0]
            os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(3.0)
            os.kill(pid, signal.SIGCONT)
            return time.monotonic()

        await _with_load(server, result, inject, engines=1, kinds=("ws_long", "http"), rate=8.0)
    finally:
        result.exit_status = stop_server(server)
    return result


async def gateway_sigterm() -> FaultResult:
    result = FaultResult("gateway-sigterm", notes="drain timeout 30 s")
    server = start_server((), {})
    load = Load(server, 3.0, ("http", "ws_multi", "ws_cancel"))
    runner = asyncio.create_task(load.run())
    await asyncio.sleep(3.0)
    engines = server.engines()
    server.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    await asyncio.sleep(1.0)  # new work now meets the drain
    load.stop()
    await runner
    try:  # not stop_server: a second SIGTERM would skip the drain
        status: int | None = await asyncio.to_thread(server.proc.wait, 60)
    except subprocess.TimeoutExpired:
        status = stop_server(server)
    result.exit_status = status
    result.notes += f"; exited {time.monotonic() - signalled:.1f} s after SIGTERM"
    _record(result, load.outcomes)
    if status != 0:
        result.notes += f"; FAIL: exit status {status}"
    left = [pid for pid in engines if _alive(pid)] + _engines_of(server.proc.pid)
    if left:
        result.leaks.append(f"engine processes left: {sorted(set(left))}")
    return result


async def shm_exhausted() -> FaultResult:
    result = FaultResult("shm-exhausted")
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--mount", "true"]).returncode != 0:
        result.notes = "skipped: needs root (unshare --mount)"
        return result
    gateway = f"exec {sys.executable} -m gateway --model tiny --device cpu --port {free_port()}"
    started = time.monotonic()
    proc = await asyncio.to_thread(
        subprocess.run,
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs -o size=1m tmpfs /dev/shm && {gateway}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    took = time.monotonic() - started
    result.exit_status = proc.returncode
    named = "/dev/shm has no room" in proc.stderr
    result.notes = f"exited {took:.1f} s after start; reason on stderr: {'yes' if named else 'no'}"
    if proc.returncode != 1 or not named or took > 60:
        result.notes += "; FAIL"
    return result


def _alive(pid: int) -> bool:
    return sample(pid) is not None


FAULTS: dict[str, Callable[[], Awaitable[FaultResult]]] = {
    "engine-kill": lambda: engine_kill(1),
    "engine-kill-2": lambda: engine_kill(2),
    "engine-stall": engine_stall,
    "gateway-sigterm": gateway_sigterm,
    "audio-ring-full": audio_ring_full,
    "request-ring-full": request_ring_full,
    "shm-exhausted": shm_exhausted,
}


def render(results: list[FaultResult]) -> str:
    lines = [
        "| fault | what the requests got | serving again after | exit | leaks | result |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        got = ", ".join(f"{k} {v}" for k, v in sorted(r.outcomes.items())) or "-"
        back = f"{r.back_in_s:.2f} s" if r.back_in_s is not None else "-"
        verdict = "pass" if r.passed else "FAIL"
        notes = f" ({r.notes})" if r.notes else ""
        lines.append(
            f"| {r.name} | {got} | {back} | {r.exit_status} | {'; '.join(r.leaks) or 'none'} | {verdict}{notes} |"
        )
    return "\n".join(lines)


def run_faults(names: list[str], out: Path | None) -> int:
    results = []
    for name in names:
        result = asyncio.run(FAULTS[name]())
        print(f"{name}: {'pass' if result.passed else 'FAIL'}", flush=True)
        results.append(result)
    table = render(results)
    print(table)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"table": table, "results": [asdict(r) for r in results]}, indent=1))
    return 0 if all(r.passed for r in results) else 1
