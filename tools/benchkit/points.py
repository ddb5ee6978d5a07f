"""Load points: parse `transport:rps[@window_s][/VOICE]`, run one through `python -m loadtest run` in
a child process, and condense its summary.json into the benchmark's per-point record.

The child prints its CLOCK_MONOTONIC (shared by every process on Linux) just before the load test
starts, so the parent can scrape /metrics and read the GPU samples over exactly the measurement
window: from t0 + warm-up to t0 + warm-up + window.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.voice_store import check_name  # torch-free: metadata only

# Runs the load test exactly as `python -m loadtest ARGS...`, after announcing its start time.
_CHILD = (
    "import sys, time\n"
    "from loadtest.cli import main\n"
    "print('BENCH_T0', time.monotonic(), flush=True)\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
# The load test's own start-up after BENCH_T0 (prompt pool, schedule, then a 50 ms lead).
_SCHEDULE_LEAD_S = 0.1
REFUSAL_KINDS = ("http_503", "http_429", "ws_overloaded")


@dataclass(frozen=True, slots=True)
class Point:
    transport: str  # "http" | "ws"
    rps: float
    window_s: float
    voice: str | None = None  # sent by every request (`--voice`); None: the load test's default

    @property
    def name(self) -> str:
        return f"{self.transport}-{self.rps:g}" + (f"-{self.voice}" if self.voice else "")

    @property
    def spec(self) -> str:
        """The point written back as `transport:rps@window_s[/VOICE]`."""
        return f"{self.transport}:{self.rps:g}@{self.window_s:g}" + (f"/{self.voice}" if self.voice else "")


def parse_points(text: str, default_window_s: float) -> list[Point]:
    """'http:1@60,http:10,ws:40/my-voice' -> points; a window after '@' overrides the default, a voice
    after '/' is named by every request of that point (a saved voice or a built-in speaker)."""
    points: list[Point] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        spec, slash, voice = part.partition("/")
        spec, _, window = spec.partition("@")
        transport, sep, rps = spec.partition(":")
        if not sep or transport not in ("http", "ws"):
            raise ValueError(f"point {part!r}: expected http:RPS or ws:RPS, optionally @WINDOW_S and /VOICE")
        if slash:
            try:  # the server's own rule for voice names (built-in speakers' names pass it too)
                check_name(voice)
            except ValueError as error:
                raise ValueError(f"point {part!r}: {error}") from None
        try:
            point = Point(transport, float(rps), float(window) if window else default_window_s, voice or None)
        except ValueError:
            raise ValueError(f"point {part!r}: RPS and window must be numbers") from None
        if point.rps <= 0 or point.window_s <= 0:
            raise ValueError(f"point {part!r}: RPS and window must be positive")
        points.append(point)
    if not points:
        raise ValueError("no points given")
    return points


def loadtest_args(point: Point, url: str, out: Path, *, warmup_s: float, timeout_s: float, seed: int,
                  extra: list[str]) -> list[str]:  # fmt: skip
    """The `python -m loadtest` arguments of one point (WS points send playback reports, a point with a
    voice names it)."""
    args = ["run", "--url", url, "--transport", point.transport, "--rps", f"{point.rps:g}",
            "--duration", f"{point.window_s:g}s", "--warmup", f"{warmup_s:g}s", "--timeout", f"{timeout_s:g}s",
            "--seed", str(seed), "--out", str(out)]  # fmt: skip
    if point.transport == "ws":
        args.append("--playback-reports")
    # The point's voice comes last: it wins over a --voice in `extra` (which applies to every point).
    return args + extra + (["--voice", point.voice] if point.voice else [])


class LoadRun:
    """One `python -m loadtest` child; its output goes to `log_path`."""

    def __init__(self, args: list[str], log_path: Path, cwd: Path) -> None:
        self.args, self.log_path = args, log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-c", _CHILD, *args], cwd=cwd, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.t0: float | None = None
        self._started = threading.Event()
        self._reader = threading.Thread(target=self._pump, name="loadtest-log", daemon=True)
        self._reader.start()

    @property
    def command(self) -> str:
        return "python -m loadtest " + " ".join(self.args)

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if self.t0 is None and line.startswith("BENCH_T0 "):
                self.t0 = float(line.split()[1]) + _SCHEDULE_LEAD_S
                self._started.set()
                continue
            self._log.write(line)
        self._started.set()  # exited without starting: wake the waiter

    def wait_started(self, timeout_s: float) -> float | None:
        """The moment the schedule starts (monotonic), or None if the child died first."""
        self._started.wait(timeout_s)
        return self.t0

    def sleep_until(self, moment: float) -> bool:
        """Sleep until `moment`; False as soon as the child has exited before it. A child that ends at the window's
        end (a light point, nothing left in flight) may exit while this sleeps past `moment`: the window was
        reached all the same, so that is True."""
        while (left := moment - time.monotonic()) > 0:
            if self.process.poll() is not None:
                return False
            time.sleep(min(left, 0.05))
        return True

    def finish(self, timeout_s: float) -> int:
        """Wait for the child (kill it past `timeout_s`); its exit code (-9 when killed)."""
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            code = -9
        self._reader.join(5)
        self._log.close()
        return code

    def log_tail(self, chars: int = 1500) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def _round(value: Any, digits: int = 2) -> Any:
    return round(value, digits) if isinstance(value, float) else value


def condense(summary: dict[str, Any], window_s: float) -> dict[str, Any]:
    """The benchmark's fields from a loadtest summary.json."""
    requests = summary["requests"]
    errors = summary["errors"]
    refused = sum(n for kind, n in errors["by_kind"].items() if kind in REFUSAL_KINDS)
    ttfa = summary["latency_ms"]["ttfa"]
    underruns = summary["underruns"]
    client = summary["client"]
    return {
        "offered_rps": _round(requests["scheduled"] / window_s),
        "achieved_rps": _round(summary["achieved_rps"]),
        "requests": requests,
        "ttfa_ms": {k: _round(ttfa[k], 1) for k in ("p50", "p95", "p99", "max", "count")},
        "e2e_ms_p50": _round(summary["latency_ms"]["e2e"]["p50"], 1),
        "refused_pct": _round(100.0 * refused / requests["scheduled"]) if requests["scheduled"] else 0.0,
        "errors_by_kind": errors["by_kind"],
        "error_examples": {k: str(v)[:200] for k, v in errors["examples"].items()},
        "underruns": {
            k: _round(underruns[k], 1)
            for k in ("requests_with_underruns", "count", "max_stall_ms", "stall_failures")
        },  # fmt: skip
        "audio_s_per_s": _round(summary["throughput"]["audio_s_per_s"]),
        "client": {
            "cpu_utilization": _round(client["cpu_utilization"]),
            "loop_lag_p99_ms": _round(client["loop_lag_ms"]["p99"]),
            # A stall of the client's own loop looks like a stall of every stream the server sends: the largest
            # lag says whether underruns that hit many requests at once could be the client's.
            "loop_lag_max_ms": _round(client["loop_lag_ms"]["max"]),
            "scheduling_lag_p99_ms": _round(summary["latency_ms"]["scheduling_lag"]["p99"]),
            "peak_in_flight": client["peak_in_flight"],
        },
    }


def read_summary(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
