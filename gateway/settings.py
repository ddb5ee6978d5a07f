"""Gateway settings: one frozen dataclass built from the command line and `VIVACE_*` variables.

Built only in `gateway/__main__.py` (or directly by tests) and passed down; nothing else in the
gateway reads the environment. Every flag `--some-flag` also reads `VIVACE_SOME_FLAG`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gateway.gpus import visible_gpus
from gateway.limits import Limits
from gateway.protocol import MIN_MAX_LEAD_MS, valid_max_lead_ms

DEFAULT_MODEL = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = DEFAULT_MODEL
    download: bool = False
    load_format: str = "auto"
    device: str = "auto"
    engines: int = 1
    # The GPUs the server was given: CUDA_VISIBLE_DEVICES's entries; None when unset (every GPU of the host).
    gpus: tuple[str, ...] | None = None
    api_key: str | None = None
    metrics_need_key: bool = False  # /metrics behind --api-key too (Prometheus then sends the key)
    # Browser origins allowed on the WebSocket. Empty: localhost and same-origin only; "*": any.
    allowed_origins: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    fake_engine: bool = False  # hidden: the fake engine (engine.ipc.fake_engine), for benchmarks and tests
    engine_args: tuple[str, ...] = ()  # hidden: extra arguments appended to every engine command
    engine_start_timeout_s: float = 1800.0  # load + graph capture + warm-up of a real model
    engine_heartbeat_timeout_s: float = 10.0  # no heartbeat for this long: the engine is hung, restart it
    drain_timeout_s: float = 30.0  # SIGTERM: how long live contexts may take to finish
    # An idle HTTP/1.1 connection stays open this long. Longer than common clients' own idle expiry (httpx 5 s,
    # aiohttp 15 s), so the client, not the server, closes it: a request sent just as the server closes an
    # idle connection would otherwise fail with a read error before any response.
    keep_alive_s: float = 30.0
    max_lead_ms: int = 0  # every session's default pacing (session.update max_lead_ms); 0 = unpaced
    web_dir: Path = REPO_ROOT / "web"
    log_level: str = "info"
    voices_dir: str | None = None  # saved voices (engine/voice_store.py), shared with every engine; None: off
    voice_timeout_s: float = 300.0  # how long computing one uploaded voice may take (engine.voice_tool)

    def engine_command(self, python: str = sys.executable) -> list[str]:
        """The engine's argv without `--socket` (added per engine)."""
        if self.fake_engine:
            return [python, "-m", "engine.ipc.fake_engine", "--model", self.model, *self.engine_args]
        command = [python, "-m", "engine", "--model", self.model, "--load-format", self.load_format]
        command += ["--device", "cuda" if self.device == "auto" and self.engines > 1 else self.device]
        if self.download:
            command.append("--download")
        if self.voices_dir:
            command += ["--voices-dir", self.voices_dir]
        return command + list(self.engine_args)


def _env_default(environ: Mapping[str, str], flag: str, default: str | None) -> str | None:
    return environ.get("VIVACE_" + flag.upper().replace("-", "_"), default)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    def env(flag: str, default: str | None = None) -> str | None:
        return _env_default(environ, flag, default)

    parser = argparse.ArgumentParser(
        prog="python -m gateway",
        description="Vivace: realtime Qwen3-TTS server (WebSocket vivace.speech.v1 and OpenAI-compatible HTTP). "
        "Every flag can also be set as an environment variable VIVACE_<FLAG> (e.g. VIVACE_PORT=9000).",
    )
    parser.add_argument("--host", default=env("host", "127.0.0.1"), help="bind address (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=int(env("port", "8000") or 8000), help="TCP port (default 8000)"
    )
    parser.add_argument(
        "--model",
        default=env("model", DEFAULT_MODEL),
        help=f"checkpoint directory, Hugging Face id, or the built-in preset 'tiny' (default {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--download",
        action="store_true",
        default=_truthy(env("download")),
        help="allow fetching weights from the Hugging Face Hub (off by default)",
    )
    parser.add_argument(
        "--load-format",
        choices=("auto", "dummy"),
        default=env("load-format", "auto"),
        help="auto: load weights; dummy: full-size random weights built on the device (benchmarks)",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=env("device", "auto"))
    parser.add_argument(
        "--engines",
        type=int,
        default=int(env("engines", "1") or 1),
        help="engine processes, one per GPU: engine i runs on the i-th GPU of CUDA_VISIBLE_DEVICES, or of the "
        "host when that is unset (default 1)",
    )
    parser.add_argument(
        "--api-key",
        default=env("api-key"),
        help="require this key: 'Authorization: Bearer <key>', or for browsers the WebSocket subprotocol "
        "'vivace.auth.<key>' next to 'vivace.speech.v1'",
    )
    parser.add_argument(
        "--metrics-need-key",
        action="store_true",
        default=_truthy(env("metrics-need-key")),
        help="with --api-key, /metrics needs the key too (default: open, for scrapers on a private network)",
    )
    parser.add_argument(
        "--allowed-origins",
        default=env("allowed-origins", ""),
        help="comma-separated browser origins allowed on the WebSocket ('*' for any); "
        "default: localhost and the server's own origin",
    )
    parser.add_argument(
        "--limit",
        action="append",
        default=[x for x in (env("limit") or "").split(",") if x.strip()],
        metavar="NAME=VALUE",
        help="override a session limit (repeatable; see docs/protocol.md), e.g. max_contexts=16",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=float(env("drain-timeout", "30") or 30),
        help="on SIGTERM, seconds live contexts may take to finish before their sockets close 1001",
    )
    parser.add_argument(
        "--max-lead-ms",
        type=int,
        default=int(env("max-lead-ms", "0") or 0),
        help="pace every WebSocket session this far ahead of its listener by default (0: unpaced; clients "
        "may change it with session.update; at least 200)",
    )
    parser.add_argument(
        "--heartbeat-timeout-s",
        type=float,
        default=float(env("heartbeat-timeout-s", "10") or 10),
        help="an engine silent this long (no heartbeat; engines send one per second) is taken as hung: "
        "its requests fail and it is restarted (default 10)",
    )
    parser.add_argument(
        "--keep-alive-s",
        type=float,
        default=float(env("keep-alive-s", "30") or 30),
        help="an idle HTTP/1.1 keep-alive connection is closed after this long (default 30: longer than clients' "
        "own idle expiry, so a reused connection is never closed under a request just sent)",
    )
    parser.add_argument("--log-level", default=env("log-level", "info"))
    parser.add_argument(
        "--voices-dir",
        default=env("voices-dir"),
        help="directory of saved voices (POST /v1/audio/voices), shared with every engine; Base models "
        "speak with them (default: off)",
    )
    parser.add_argument("--voice-timeout-s", type=float, default=300.0, help=argparse.SUPPRESS)
    # Hidden: for tests and the gateway overhead benchmark only.
    parser.add_argument(
        "--fake-engine", action="store_true", default=_truthy(env("fake-engine")), help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="pass ARG to every engine process (repeatable), e.g. --engine-arg=--kv-slots=32; "
        "see python -m engine --help",
    )
    parser.add_argument("--engine-start-timeout", type=float, default=1800.0, help=argparse.SUPPRESS)
    return parser


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    parser = build_parser(environ)
    args = parser.parse_args(list(argv))
    if args.engines < 1:
        parser.error("--engines must be at least 1")
    if not args.heartbeat_timeout_s > 0:
        parser.error("--heartbeat-timeout-s must be positive")
    if not args.keep_alive_s > 0:
        parser.error("--keep-alive-s must be positive")
    if not valid_max_lead_ms(args.max_lead_ms):
        parser.error(f"--max-lead-ms must be 0 (unpaced) or at least {MIN_MAX_LEAD_MS}")
    try:
        limits = Limits.parse_overrides(args.limit)
    except ValueError as exc:
        parser.error(str(exc))
    origins = tuple(o.strip().rstrip("/") for o in args.allowed_origins.split(",") if o.strip())
    return Settings(
        host=args.host,
        port=args.port,
        model=args.model,
        download=args.download,
        load_format=args.load_format,
        device=args.device,
        engines=args.engines,
        gpus=visible_gpus(environ.get("CUDA_VISIBLE_DEVICES")),
        api_key=args.api_key or None,
        metrics_need_key=args.metrics_need_key,
        allowed_origins=origins,
        limits=limits,
        fake_engine=args.fake_engine,
        engine_args=tuple(args.engine_arg),
        engine_start_timeout_s=args.engine_start_timeout,
        engine_heartbeat_timeout_s=args.heartbeat_timeout_s,
        drain_timeout_s=args.drain_timeout,
        keep_alive_s=args.keep_alive_s,
        max_lead_ms=args.max_lead_ms,
        log_level=args.log_level,
        voices_dir=args.voices_dir or None,
        voice_timeout_s=args.voice_timeout_s,
    )
