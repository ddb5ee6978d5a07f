"""The whole-server benchmark of issue 13 in one command: start the gateway, load it at every point,
record latency, refusals, underruns, /metrics deltas and GPU activity, stop it, write one JSON.

    python tools/bench_h200.py [--out DIR] [--quick] [--points http:1@60,http:10,...,ws:40] [--clone-voices]
                               [-- GATEWAY ARGS]

Default server: `python -m gateway --model 1.7b --device cuda --load-format dummy` (full-size random
weights); `--model tiny --device cpu` runs it on a CPU, `--url` uses a server already running.
Default points (one server for all, in this order): HTTP at 1 RPS (60 s window: p95 needs samples),
10, 20, 40, 60, 80, 100 RPS (20 s windows), then WebSocket at 10 and 40 RPS with playback reports;
each after a `--warmup` and followed by a `--cooldown`. Every point runs `python -m loadtest run`
(Poisson arrivals, Seed-TTS pool, seed 0) in a child process; over exactly its measurement window
the parent scrapes /metrics (counter deltas, gauges after) and samples the GPU (NVML or nvidia-smi
every 250 ms; null without a GPU). The whole run is held inside `--budget` seconds (default 540,
for a 10-minute command limit): a point that would not fit is skipped and says so.

A point is `transport:rps[@window_s][/VOICE]`: with `/VOICE` every request of the point names that
voice (`--voice` of the load test; a saved voice on a Base model, a built-in speaker otherwise) and
the point is named e.g. `http-10-bench-xvector`. `--clone-voices` measures voice cloning on a Base
checkpoint: once the server is ready, the bench writes a synthetic 5 s reference recording
(voice-reference.wav) and saves two voices from it through `POST /v1/audio/voices`, `bench-xvector`
(no transcript: x-vector only) and `bench-in-context` (with a transcript: in-context cloning); the
server it starts gets `--voices-dir OUT/voices` (a server given with --url needs its own --voices-dir).
Each save's status, seconds and answer go to bench.json's "voices" (the seconds count in the budget);
a point naming a bench voice that was not saved is skipped ("voice not saved"). For example, x-vector
and in-context cloning on the full-size Base model with dummy weights:

    python tools/bench_h200.py --model 1.7b-base --clone-voices \\
        --points http:10@20/bench-xvector,http:10@20/bench-in-context -- --heartbeat-timeout-s 60

and the same points with the CustomVoice model (`--model 1.7b`, no suffix) for the comparison.

Outputs in --out: bench.json (rewritten after every point), bench.md (the table), gateway.log.
Each point's raw loadtest output (summary.json, requests.jsonl, log) is kept only with --raw-dir.
The table is printed last on stdout; the exit code is 0 only when every point ran.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from loadtest.revision import git_head  # noqa: E402
from tools.benchkit import prom  # noqa: E402
from tools.benchkit.gpu import GpuSampler  # noqa: E402
from tools.benchkit.points import LoadRun, Point, condense, loadtest_args, parse_points, read_summary  # noqa: E402
from tools.benchkit.report import table  # noqa: E402
from tools.benchkit.server import Gateway, ServerFailed, http_get  # noqa: E402
from tools.benchkit.voices import BENCH_VOICES, save_voice, write_reference  # noqa: E402

SCHEMA = "vivace.bench.server.v1"
DEFAULT_POINTS = "http:1@60,http:10,http:20,http:40,http:60,http:80,http:100,ws:10,ws:40"
QUICK_POINTS = "http:2@5,ws:2@5"
CHILD_START_S = 2.0  # interpreter and loadtest import before a point's schedule starts
TAIL_ALLOWANCE_S = 8.0  # requests still in flight after the window, for the budget estimate
STOP_RESERVE_S = 25.0  # kept for stopping the server
LOG_CAP_BYTES = 8 << 20  # gateway.log is cut to its tail beyond this (device files are capped)
VOICE_SAVE_S = 180.0  # one voice save: the voice tool runs full-size encoders on the CPU
REFERENCE_FILE = "voice-reference.wav"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python tools/bench_h200.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default /tmp/vivace-bench-<time>)"
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"smoke run: points {QUICK_POINTS}, 1 s warm-up, 1 s cool-down"
    )
    parser.add_argument(
        "--points",
        default=None,
        help=f"comma-separated transport:rps[@window_s][/VOICE] (default {DEFAULT_POINTS})",
    )
    parser.add_argument(
        "--window", type=float, default=20.0, help="measurement window of points without @ (s)"
    )
    parser.add_argument(
        "--warmup", type=float, default=None, help="warm-up per point, excluded (default 4 s)"
    )
    parser.add_argument("--cooldown", type=float, default=None, help="pause between points (default 3 s)")
    parser.add_argument(
        "--request-timeout", type=float, default=20.0, help="per-request limit (s), bounds tails"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--budget",
        type=float,
        default=540.0,
        help="seconds for the whole run, server start and stop included; points that would "
        "not fit are skipped (default 540)",
    )
    parser.add_argument(
        "--loadtest-args", default="", help="extra arguments for every `python -m loadtest run`"
    )
    voices = " and ".join(voice.name for voice in BENCH_VOICES)
    parser.add_argument(
        "--clone-voices",
        action="store_true",
        help=f"after /ready, save the voices {voices} from a synthetic reference through POST "
        "/v1/audio/voices (for a Base model; the server started gets --voices-dir OUT/voices)",
    )
    server = parser.add_argument_group("server (ignored with --url)")
    server.add_argument("--url", default=None, help="benchmark this running server instead of starting one")
    server.add_argument("--model", default="1.7b")
    server.add_argument("--device", default="cuda")
    server.add_argument("--load-format", default="dummy")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=0, help="0: a free port")
    server.add_argument(
        "--server-args",
        default="",
        help="extra gateway arguments, one shell-quoted string (the arguments after -- are appended too)",
    )
    server.add_argument("--ready-timeout", type=float, default=300.0, help="seconds to wait for /ready (the full-size engine on an H200: ~215 s)")
    parser.add_argument("--gpu-index", type=int, default=0)
    parser.add_argument("--gpu-period", type=float, default=0.25, help="GPU sampling period (s)")
    parser.add_argument(
        "--git-sha",
        default=os.environ.get("VIVACE_GIT_SHA"),
        help="recorded commit (default: $VIVACE_GIT_SHA, else git rev-parse HEAD)",
    )
    parser.add_argument("--raw-dir", type=Path, default=None, help="keep each point's loadtest output here")
    return parser  # fmt: skip


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(benchmark arguments, gateway arguments after the first '--')."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def git_info(explicit: str | None) -> dict[str, Any]:
    if explicit:
        return {"sha": explicit, "dirty": None, "source": "given"}
    head = git_head()
    if head is None:
        return {"sha": None, "dirty": None, "source": "unavailable (pass --git-sha)"}
    return {"sha": head[0], "dirty": head[1], "source": "git"}


def host_info(gpu: GpuSampler) -> dict[str, Any]:
    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch": version("torch"),
        "triton": version("triton"),
        "gpu": gpu.name,
        "gpu_sampler": gpu.source,
    }


class Bench:
    """One benchmark run: the state that bench.json is written from."""

    def __init__(self, args: argparse.Namespace, gateway_args: list[str], argv: list[str]) -> None:
        self.args = args
        self.started = time.monotonic()
        self.out: Path = args.out or Path(tempfile.gettempdir()) / time.strftime("vivace-bench-%Y%m%d-%H%M%S")
        self.keep_raw = args.raw_dir is not None
        self.raw: Path = args.raw_dir or Path(tempfile.mkdtemp(prefix="vivace-bench-raw-"))
        self.points = parse_points(
            args.points or (QUICK_POINTS if args.quick else DEFAULT_POINTS), args.window
        )
        self.warmup = args.warmup if args.warmup is not None else (1.0 if args.quick else 4.0)
        self.cooldown = args.cooldown if args.cooldown is not None else (1.0 if args.quick else 3.0)
        self.gpu = GpuSampler(args.gpu_index, args.gpu_period)
        self.gateway: Gateway | None = None
        self.url = args.url
        if self.url is None:
            port = args.port or free_port(args.host)
            self.url = f"http://{args.host}:{port}"
            # The bench's --voices-dir comes before the user's arguments, which may override it.
            voices = ["--voices-dir", str(self.out / "voices")] if args.clone_voices else []
            command = [sys.executable, "-m", "gateway", "--model", args.model, "--device", args.device,
                       "--load-format", args.load_format, "--host", args.host, "--port", str(port),
                       *voices, *shlex.split(args.server_args), *gateway_args]  # fmt: skip
            self.gateway = Gateway(command, self.url, self.out / "gateway.log", REPO)
        self.unsaved: set[str] = set()  # bench voices whose save failed: their points are skipped
        self.record: dict[str, Any] = {
            "schema": SCHEMA,
            "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": shlex.join(["python", "tools/bench_h200.py", *argv]),
            "git": git_info(args.git_sha),
            "server": {
                "command": shlex.join(["python", *self.gateway.command[1:]]) if self.gateway else None,
                "url": self.url,
            },
            "config": {
                "points": [p.spec for p in self.points],
                "clone_voices": args.clone_voices,
                "warmup_s": self.warmup,
                "cooldown_s": self.cooldown,
                "request_timeout_s": args.request_timeout,
                "seed": args.seed,
                "budget_s": args.budget,
                "loadtest_args": args.loadtest_args,
                "gpu_period_s": args.gpu_period,
            },  # fmt: skip
            "host": None,
            "voices": [],
            "points": [],
        }

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def log(self, message: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {message}", flush=True)

    def save(self) -> None:
        self.record["wall_s"] = round(self.elapsed(), 1)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "bench.json").write_text(json.dumps(self.record, indent=1) + "\n")

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        self.gpu.start()
        self.record["host"] = host_info(self.gpu)
        code = 0
        load_s = sum(self.estimate(p) for p in self.points) + self.cooldown * (len(self.points) - 1)
        saves = f" and {len(BENCH_VOICES)} voice saves" if self.args.clone_voices else ""
        self.log(f"plan: {len(self.points)} points, ~{load_s:.0f} s of load after the server is ready{saves}, "
                 f"budget {self.args.budget:.0f} s in all")  # fmt: skip
        try:
            if self.gateway is not None:
                self.log(f"starting {self.record['server']['command']}")
                self.gateway.start()
                ready_s = self.gateway.wait_ready(
                    min(self.args.ready_timeout, self.args.budget - STOP_RESERVE_S)
                )
                self.record["server"]["ready_s"] = round(ready_s, 1)
                self.log(f"server ready after {ready_s:.1f} s")
            if self.args.clone_voices:
                self.clone_voices()
            for number, point in enumerate(self.points):
                if number and self.cooldown > 0:
                    time.sleep(self.cooldown)
                self.record["points"].append(self.run_point(point))
                self.save()
        except ServerFailed as exc:
            self.record["server"]["error"] = str(exc)[-4000:]
            print(exc, flush=True)
            for point in self.points[len(self.record["points"]) :]:
                self.record["points"].append(
                    self.point_base(point) | {"status": "skipped", "reason": "no server"}
                )
            code = 1
        except KeyboardInterrupt:
            code = 130
        finally:
            if self.gateway is not None:
                self.record["server"]["exit_code"] = self.gateway.stop()
                self.log(f"server stopped (exit code {self.record['server']['exit_code']})")
                cap_log(self.gateway.log_path)
            self.gpu.stop()
            self.record["table"] = table(self.record["points"])
            self.save()
            (self.out / "bench.md").write_text(self.report() + "\n")
        failed = [p for p in self.record["points"] if p["status"] != "ok"]
        if self.keep_raw:
            print(f"\nraw loadtest output in {self.raw}")
        else:
            shutil.rmtree(self.raw, ignore_errors=True)
        print(f"\nwrote {self.out / 'bench.json'}, {self.out / 'bench.md'}\n")
        print(self.report(), flush=True)
        return code or (1 if failed else 0)

    def report(self) -> str:
        git = self.record["git"]
        head = (f"commit {git['sha'] or 'unknown'}{' (dirty)' if git.get('dirty') else ''}, "
                f"{self.record['host']['gpu'] if self.record['host'] else None}, "
                f"wall {self.record.get('wall_s', self.elapsed()):.0f} s")  # fmt: skip
        return f"`{self.record['command']}`\n\n{head}\n\n{self.record['table']}"

    def estimate(self, point: Point) -> float:
        """Expected seconds for one point (its cool-down not included)."""
        return CHILD_START_S + self.warmup + point.window_s + min(TAIL_ALLOWANCE_S, self.args.request_timeout)

    def point_base(self, point: Point) -> dict[str, Any]:
        return {"name": point.name, "transport": point.transport, "rps": point.rps,
                "window_s": point.window_s, "voice": point.voice, "warmup_s": self.warmup}  # fmt: skip

    def clone_voices(self) -> None:
        """Write the reference recording and save the bench voices from it, one record each."""
        reference = self.out / REFERENCE_FILE
        described = write_reference(reference, self.args.seed)
        for voice in BENCH_VOICES:
            timeout_s = min(VOICE_SAVE_S, self.args.budget - STOP_RESERVE_S - self.elapsed())
            if timeout_s < 5.0:
                saved = {"name": voice.name, "transcript": voice.transcript, "status": 0, "seconds": 0.0,
                         "ok": False, "error": "budget"}  # fmt: skip
            else:
                self.log(f"saving voice {voice.name} ({'with' if voice.transcript else 'no'} transcript)")
                saved = save_voice(self.url, voice, reference, timeout_s)
            saved["reference"] = described
            self.record["voices"].append(saved)
            if not saved["ok"]:
                self.unsaved.add(voice.name)
            answer = saved.get("response", saved.get("error"))
            self.log(f"voice {voice.name}: status {saved['status']} after {saved['seconds']:.1f} s"
                     + ("" if saved["ok"] else f": {str(answer)[:300]}"))  # fmt: skip
            self.save()

    def run_point(self, point: Point) -> dict[str, Any]:
        base = self.point_base(point)
        if point.voice in self.unsaved:
            self.log(f"{point.name}: skipped (voice {point.voice} was not saved)")
            return base | {"status": "skipped", "reason": "voice not saved"}
        estimate = self.estimate(point)
        if self.elapsed() + estimate + STOP_RESERVE_S > self.args.budget:
            self.log(
                f"{point.name}: skipped (needs ~{estimate:.0f} s, budget left {self.args.budget - self.elapsed():.0f} s)"
            )
            return base | {"status": "skipped", "reason": "budget"}
        if self.gateway is not None and not self.gateway.alive():
            return base | {"status": "skipped", "reason": "server exited"}
        out = self.raw / point.name
        args = loadtest_args(point, self.url, out, warmup_s=self.warmup, timeout_s=self.args.request_timeout,
                             seed=self.args.seed, extra=shlex.split(self.args.loadtest_args))  # fmt: skip
        self.log(f"{point.name}: {point.rps:g} RPS over {point.transport}, {point.window_s:g} s window")
        child = LoadRun(args, out / "loadtest.log", REPO)
        base["loadtest_command"] = child.command
        measured = self.measure_window(child, point)
        finish_s = max(
            5.0, min(self.args.request_timeout + 15.0, self.args.budget - STOP_RESERVE_S - self.elapsed())
        )
        exit_code = child.finish(finish_s)
        summary = read_summary(out)
        if summary is None:
            reason = f"loadtest exit code {exit_code}, no summary: {child.log_tail(400)}"
            self.log(f"{point.name}: failed ({reason})")
            return base | {"status": "failed", "reason": reason, "loadtest_exit_code": exit_code} | measured
        result = base | {"status": "ok", "loadtest_exit_code": exit_code} | condense(summary, point.window_s)
        result |= measured
        ttfa = result["ttfa_ms"]
        self.log(f"{point.name}: achieved {result['achieved_rps']} RPS, TTFA p50/p95/p99 {ttfa['p50']}/"
                 f"{ttfa['p95']}/{ttfa['p99']} ms, refused {result['refused_pct']} %, "
                 f"underrun requests {result['underruns']['requests_with_underruns']}, "
                 f"GPU util {result['gpu_util_mean']}")  # fmt: skip
        return result

    def measure_window(self, child: LoadRun, point: Point) -> dict[str, Any]:
        """/metrics deltas and GPU activity over the point's measurement window."""
        empty: dict[str, Any] = {"metrics": None, "gpu": None, "gpu_util_mean": None}
        t0 = child.wait_started(60.0)
        if t0 is None:
            return empty
        window_start, window_end = t0 + self.warmup, t0 + self.warmup + point.window_s
        if not child.sleep_until(window_start):
            return empty
        before, gpm_first = self.scrape(), self.gpu.gpm_sample()
        started = time.monotonic()
        if not child.sleep_until(window_end):
            self.gpu.window_gpm(gpm_first, None)
            return empty
        after, gpm_second = self.scrape(), self.gpu.gpm_sample()
        interval = time.monotonic() - started
        metrics = prom.diff(before, after, interval) if before and after else None
        gpu = self.gpu.window(window_start, window_end)
        if gpu is not None:
            gpu["gpm"] = self.gpu.window_gpm(gpm_first, gpm_second)
        return {"metrics": metrics, "gpu": gpu, "gpu_util_mean": gpu["util_mean"] if gpu else None}

    def scrape(self) -> prom.Scrape | None:
        status, body = http_get(f"{self.url}/metrics")
        return prom.parse(body) if status == 200 else None


def cap_log(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.stat().st_size > LOG_CAP_BYTES:
            with path.open("rb") as log:
                log.seek(-LOG_CAP_BYTES, os.SEEK_END)
                tail = log.read()
            path.write_bytes(b"(cut: only the log's tail is kept)\n" + tail)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, gateway_args = split_argv(argv)
    parser = build_parser()
    args = parser.parse_args(own)
    try:
        bench = Bench(args, gateway_args, argv)
    except ValueError as exc:
        parser.error(str(exc))
    return bench.run()


if __name__ == "__main__":
    sys.exit(main())
