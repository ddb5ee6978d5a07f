"""One benchmark run end to end: options -> schedule -> open-loop run -> summary.json + requests.jsonl.

Output directory layout:

    DIR/summary.json     the summary (loadtest/summary.py), config included
    DIR/requests.jsonl   one RequestRecord per arrival, warm-up included (phase field)
    DIR/audio/N.wav      every request's audio, only with save_audio
"""

from __future__ import annotations

import asyncio
import json
import wave
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadtest.h1_client import FastHttpSpeechClient
from loadtest.http_client import HttpSpeechClient
from loadtest.prompts import DEFAULT_POOL, load_prompts
from loadtest.runner import SpeechTransport, run_schedule
from loadtest.schedule import build_schedule
from loadtest.summary import format_summary, summarize
from loadtest.trace import StreamTrace
from loadtest.ws_client import WsSpeechClient
from loadtest.ws_fast import FastWsSpeechClient


@dataclass(slots=True)
class RunOptions:
    url: str
    rps: float
    duration_s: float = 120.0
    warmup_s: float = 10.0
    transport: str = "http"  # "http" | "ws"
    client: str = "fast"  # "fast" (raw asyncio protocols) | "library" (httpx / websockets)
    seed: int = 0
    prompts: str = str(DEFAULT_POOL)
    out: str | None = None
    arrival: str = "poisson"  # "poisson" | "constant"
    voice: str = "ryan"
    language: str | None = "English"
    model: str = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
    sample_rate: int = 24_000
    ws_word_interval_ms: float = 50.0
    playback_reports: bool = False
    playback_report_ms: float = 200.0
    max_lead_ms: int | None = None  # WS: session.update max_lead_ms before each context (server pacing)
    gpu_hourly_usd: float | None = None
    max_concurrency: int = 4096
    timeout_s: float = 120.0
    api_key: str | None = field(default=None, repr=False)
    request_params: dict[str, Any] = field(default_factory=dict)
    save_audio: bool = False

    def public_config(self) -> dict[str, Any]:
        config = asdict(self)
        config["api_key"] = "***" if self.api_key else None
        return config


def make_transport(options: RunOptions) -> SpeechTransport:
    if options.max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {options.max_concurrency}")
    if options.client not in ("fast", "library"):
        raise ValueError(f"client must be 'fast' or 'library', got {options.client!r}")
    fast = options.client == "fast"
    if options.max_lead_ms is not None and options.transport != "ws":
        raise ValueError("max_lead_ms (server pacing) applies to the WS transport only")
    if options.transport == "http":
        http_class = FastHttpSpeechClient if fast else HttpSpeechClient
        return http_class(
            options.url,
            model=options.model,
            voice=options.voice,
            language=options.language,
            sample_rate=options.sample_rate,
            max_connections=options.max_concurrency,
            timeout_s=options.timeout_s,
            extra_params=options.request_params,
            api_key=options.api_key,
        )
    if options.transport == "ws":
        if options.request_params:
            raise ValueError("request params apply to the HTTP transport only")
        ws_class = FastWsSpeechClient if fast else WsSpeechClient
        return ws_class(
            options.url,
            voice=options.voice,
            language=options.language,
            sample_rate=options.sample_rate,
            word_interval_s=options.ws_word_interval_ms / 1000.0,
            playback_report_s=options.playback_report_ms / 1000.0 if options.playback_reports else None,
            timeout_s=options.timeout_s,
            api_key=options.api_key,
            max_lead_ms=options.max_lead_ms,
        )
    raise ValueError(f"transport must be 'http' or 'ws', got {options.transport!r}")


class _AudioSaver:
    """Wraps a transport to keep every request's PCM for listening afterwards."""

    def __init__(self, inner: SpeechTransport, directory: Path, sample_rate: int) -> None:
        self.inner, self.directory, self.sample_rate = inner, directory, sample_rate
        self.count = 0
        directory.mkdir(parents=True, exist_ok=True)

    async def synthesize(self, text: str, trace: StreamTrace) -> None:
        number = self.count
        self.count += 1
        try:
            await self.inner.synthesize(text, trace)
        finally:
            with wave.open(str(self.directory / f"{number}.wav"), "wb") as out:
                out.setnchannels(1)
                out.setsampwidth(2)
                out.setframerate(self.sample_rate)
                out.writeframes(bytes(trace.pcm[: trace.samples * 2]))

    async def close(self) -> None:
        await self.inner.close()


async def run_benchmark(options: RunOptions, *, echo: bool = True) -> dict[str, Any]:
    """Run the load and write the outputs (when `options.out` is set); return the summary."""
    prompts = load_prompts(options.prompts)
    schedule = build_schedule(
        prompts, options.rps, options.warmup_s, options.duration_s, options.seed, options.arrival
    )
    out = Path(options.out) if options.out else None
    transport = make_transport(options)
    if options.save_audio and out is not None:
        transport = _AudioSaver(transport, out / "audio", options.sample_rate)
    try:
        records, stats = await run_schedule(
            schedule,
            transport,
            sample_rate=options.sample_rate,
            timeout_s=options.timeout_s,
            max_concurrency=options.max_concurrency,
        )
    finally:
        await transport.close()
    summary = summarize(records, stats, options.public_config(), options.duration_s, options.gpu_hourly_usd)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        with (out / "requests.jsonl").open("w") as lines:
            for record in records:
                lines.write(json.dumps(record.to_json()) + "\n")
    if echo:
        print(format_summary(summary), flush=True)
    return summary


def run_benchmark_sync(options: RunOptions, *, echo: bool = True) -> dict[str, Any]:
    return asyncio.run(run_benchmark(options, echo=echo))
