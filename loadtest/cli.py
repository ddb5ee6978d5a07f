"""Command line: `python -m loadtest run | sweep | plot | fake-server | selfbench | soak`.

run        one RPS point against a server        -> DIR/summary.json, DIR/requests.jsonl
sweep      several RPS points, one after another  -> DIR/rps-*/, DIR/sweep.json, DIR/sweep.png
plot       PNG charts from run or sweep dirs
fake-server  the PCM-streaming fake used by tests and selfbench
selfbench  is the generator itself the bottleneck at N RPS on one core?
soak       a steady mixed load on a server it starts (tiny model); fails on leaks and hangs (loadtest/soak.py)
faults     engine kills and stalls, gateway SIGTERM, full rings, full /dev/shm under load (loadtest/faults.py)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

from loadtest.bench import RunOptions, run_benchmark
from loadtest.fake_audio import FakeVoice
from loadtest.fake_server import serve
from loadtest.prompts import DEFAULT_POOL

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """'120s', '2m', '500ms', '1.5h' or a bare number of seconds -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 120s, 2m, 500ms)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def parse_rps_list(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"RPS values must be positive: {text!r}")
    return values


def parse_param(text: str) -> tuple[str, Any]:
    """key=value with a JSON value (bare strings allowed): extra fields for the HTTP request body."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def _add_load_options(parser: argparse.ArgumentParser, *, needs_url: bool = True) -> None:
    if needs_url:
        parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument(
        "--duration", type=parse_duration, default=120.0, help="measurement window (default 120s)"
    )
    parser.add_argument("--warmup", type=parse_duration, default=10.0, help="warm-up, excluded (default 10s)")
    if needs_url:  # selfbench picks its own URL and runs every transport in --transports
        parser.add_argument("--transport", choices=("http", "ws"), default="http")
    parser.add_argument(
        "--client",
        choices=("fast", "library"),
        default="fast",
        help="fast: raw asyncio protocols (default, cheapest per chunk); library: httpx / websockets",
    )
    parser.add_argument("--seed", type=int, default=0, help="arrival and prompt-order seed (default 0)")
    parser.add_argument(
        "--prompts", default=str(DEFAULT_POOL), help="JSONL pool of {id, text} (default: Seed-TTS en)"
    )
    parser.add_argument("--arrival", choices=("poisson", "constant"), default="poisson")
    parser.add_argument("--voice", default="ryan")
    parser.add_argument("--language", default="English", help="sent as an extra field; '' to omit")
    parser.add_argument("--model", default="Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", help="HTTP 'model' field")
    parser.add_argument("--sample-rate", type=_positive(int), default=24_000)
    parser.add_argument(
        "--ws-word-interval-ms",
        type=float,
        default=50.0,
        help="WS: one word per append at this cadence; 0 sends the whole text at once",
    )
    parser.add_argument(
        "--playback-reports", action="store_true", help="WS: send playback.position like a player"
    )
    parser.add_argument("--playback-report-ms", type=_positive(float), default=200.0)
    parser.add_argument(
        "--max-lead-ms",
        type=int,
        default=None,
        help="WS: ask the server to pace each context this far ahead of its listener (session.update)",
    )
    parser.add_argument(
        "--gpu-hourly-usd", type=float, default=None, help="GPU price for cost per 1M characters"
    )
    parser.add_argument(
        "--max-concurrency",
        type=_positive(int),
        default=4096,
        help="in-flight cap; arrivals beyond it are dropped as errors, never delayed",
    )
    parser.add_argument(
        "--timeout", type=parse_duration, default=120.0, help="per-request limit (default 120s)"
    )
    parser.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer'")
    parser.add_argument(
        "--request-param",
        type=parse_param,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="HTTP: extra JSON body field (repeatable; value null drops a default field)",
    )
    parser.add_argument("--save-audio", action="store_true", help="write every request's audio to DIR/audio/")


def _options(args: argparse.Namespace, rps: float, url: str | None = None) -> RunOptions:
    return RunOptions(
        url=url or args.url,
        rps=rps,
        duration_s=args.duration,
        warmup_s=args.warmup,
        transport=getattr(args, "transport", "http"),
        client=args.client,
        seed=args.seed,
        prompts=args.prompts,
        out=getattr(args, "out", None),
        arrival=args.arrival,
        voice=args.voice,
        language=args.language or None,
        model=args.model,
        sample_rate=args.sample_rate,
        ws_word_interval_ms=args.ws_word_interval_ms,
        playback_reports=args.playback_reports,
        playback_report_ms=args.playback_report_ms,
        max_lead_ms=args.max_lead_ms,
        gpu_hourly_usd=args.gpu_hourly_usd,
        max_concurrency=args.max_concurrency,
        timeout_s=args.timeout,
        api_key=args.api_key,
        request_params=dict(args.request_param),
        save_audio=args.save_audio,
    )


def _add_fake_voice_options(parser: argparse.ArgumentParser) -> None:
    defaults = FakeVoice()
    parser.add_argument("--ttfa-ms", type=float, default=defaults.ttfa_ms)
    parser.add_argument("--leading-silence-ms", type=float, default=defaults.leading_silence_ms)
    parser.add_argument("--chunk-ms", type=_positive(float), default=defaults.chunk_ms)
    parser.add_argument("--speed", type=_positive(float), default=defaults.speed, help="x realtime")
    parser.add_argument("--stall-at-ms", type=float, default=None, help="pause once after this much audio")
    parser.add_argument("--stall-ms", type=float, default=0.0)
    parser.add_argument("--fail-every", type=int, default=0, help="every Nth request fails (0: never)")


def _fake_voice(args: argparse.Namespace) -> FakeVoice:
    return FakeVoice(
        ttfa_ms=args.ttfa_ms,
        leading_silence_ms=args.leading_silence_ms,
        chunk_ms=args.chunk_ms,
        speed=args.speed,
        stall_at_ms=args.stall_at_ms,
        stall_ms=args.stall_ms,
        fail_every=args.fail_every,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="one RPS point")
    _add_load_options(run)
    run.add_argument("--rps", type=_positive(float), required=True)
    run.add_argument("--out", default=None, help="output directory (summary.json, requests.jsonl)")

    sweep = commands.add_parser("sweep", help="several RPS points and a plot")
    _add_load_options(sweep)
    sweep.add_argument("--rps", type=parse_rps_list, required=True, help="e.g. 5,10,20,40")
    sweep.add_argument("--out", required=True)
    sweep.add_argument(
        "--cooldown", type=parse_duration, default=5.0, help="pause between points (default 5s)"
    )

    plot = commands.add_parser("plot", help="PNG charts from run or sweep directories")
    plot.add_argument("dirs", nargs="+", type=Path)
    plot.add_argument("-o", "--output", type=Path, required=True)
    plot.add_argument("--title", default=None)

    fake = commands.add_parser("fake-server", help="serve fake PCM over HTTP and WS (tests, selfbench)")
    fake.add_argument("--host", default="127.0.0.1")
    fake.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on the first line)")
    _add_fake_voice_options(fake)

    selfbench = commands.add_parser(
        "selfbench", help="is the generator the bottleneck? (fake server, one core)"
    )
    _add_load_options(selfbench, needs_url=False)
    selfbench.add_argument("--rps", type=_positive(float), default=200.0)
    selfbench.add_argument("--transports", default="http,ws")
    selfbench.add_argument(
        "--out", default=None, help="directory for selfbench.json (and per-transport runs)"
    )
    _add_fake_voice_options(selfbench)
    selfbench.set_defaults(duration=30.0, warmup=5.0)

    soak = commands.add_parser(
        "soak", help="steady mixed load on a tiny-model server; fails on leaks and hangs"
    )
    soak.add_argument("--duration", type=parse_duration, default=60.0, help="load time (default 60s)")
    soak.add_argument("--warmup", type=parse_duration, default=15.0, help="before the baseline (default 15s)")
    soak.add_argument(
        "--rate", type=_positive(float), default=0.5, help="clients started per second (default 0.5)"
    )
    soak.add_argument("--max-clients", type=_positive(int), default=32, help="in-flight cap")
    soak.add_argument("--timeout", type=parse_duration, default=120.0, help="per-client limit (default 120s)")
    soak.add_argument("--seed", type=int, default=0)
    soak.add_argument("--out", type=Path, default=None, help="JSON report with every sample")
    faults = commands.add_parser("faults", help="inject faults into a loaded server; print what requests got")
    faults.add_argument("names", nargs="*", help="faults to run (default: all; see loadtest/faults.py)")
    faults.add_argument("--out", type=Path, default=None, help="JSON with the table and raw results")
    soak.add_argument(
        "--malloc",
        choices=("fixed", "default"),
        default="fixed",
        help="fixed: glibc malloc thresholds pinned in the server (default; see loadtest/soak.py)",
    )
    soak.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for python -m gateway (repeatable), e.g. --server-arg=--engines=2",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        summary = asyncio.run(run_benchmark(_options(args, args.rps)))
        return 0 if summary["requests"]["ok"] or not summary["requests"]["scheduled"] else 1
    if args.command == "sweep":
        from loadtest.plot import plot_runs
        from loadtest.sweep import run_sweep

        out = Path(args.out)
        asyncio.run(run_sweep(_options(args, args.rps[0]), args.rps, out, args.cooldown))
        plot_runs([out], out / "sweep.png", title=f"{args.transport} {args.url}")
        print(f"wrote {out / 'sweep.json'} and {out / 'sweep.png'}")
        return 0
    if args.command == "plot":
        from loadtest.plot import plot_runs

        plot_runs(args.dirs, args.output, args.title)
        print(f"wrote {args.output}")
        return 0
    if args.command == "fake-server":
        asyncio.run(serve(_fake_voice(args), args.host, args.port))
        return 0
    if args.command == "selfbench":
        from loadtest.selfbench import run_selfbench

        transports = [t.strip() for t in args.transports.split(",") if t.strip()]
        options = _options(args, args.rps, url="http://unused")
        results = run_selfbench(options, transports, _fake_voice(args), Path(args.out) if args.out else None)
        return 0 if all(r["kept_up"] for r in results) else 1
    if args.command == "soak":
        from loadtest.soak import SoakOptions, run_soak

        return run_soak(
            SoakOptions(
                duration_s=args.duration,
                warmup_s=args.warmup,
                rate=args.rate,
                max_clients=args.max_clients,
                timeout_s=args.timeout,
                seed=args.seed,
                server_args=tuple(args.server_arg),
                out=args.out,
                malloc=args.malloc,
            )
        )
    if args.command == "faults":
        from loadtest.faults import FAULTS, run_faults

        unknown = [n for n in args.names if n not in FAULTS]
        if unknown:
            raise ValueError(f"unknown fault(s) {unknown}; choose from {list(FAULTS)}")
        return run_faults(args.names or list(FAULTS), args.out)
    raise AssertionError(args.command)
