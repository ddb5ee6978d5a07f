"""Test plumbing: run `python -m gateway` as a real process, talk to it over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect

from gateway.protocol import PROTOCOL, parse_audio_frame

REPO = Path(__file__).resolve().parents[2]
SAMPLES_PER_FRAME = 1920


def expected_samples(chars: int) -> int:
    """The random-weight length model (fake and tiny engines): frames = ceil(12.5 * chars / 14)."""
    return math.ceil(12.5 * chars / 14) * SAMPLES_PER_FRAME


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_flags(engine: str, ms_per_frame: float = 0.0) -> list[str]:
    """Flags selecting the engine: "fake" (engine.ipc.fake_engine) or "real" (python -m engine, tiny model)."""
    if engine == "fake":
        return ["--fake-engine", f"--engine-arg=--ms-per-frame={ms_per_frame}"]
    assert engine == "real", engine
    return []


@dataclass
class GatewayProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/audio/speech/live"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(self.http + path, timeout=10, **kw)

    def metrics(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for line in self.get("/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def engine_pids(self) -> list[int]:
        """Engine processes: children of the gateway started with `--socket`."""
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    stat = (entry / "stat").read_text()
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    if int(stat.rsplit(")", 1)[1].split()[1]) == self.proc.pid and b"--socket" in argv:
                        pids.append(int(entry.name))
        return sorted(pids)

    def wait_ready(self, timeout_s: float = 120.0, status: int = 200) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"gateway exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if self.get("/ready").status_code == status:
                    return
            time.sleep(0.05)
        raise AssertionError(f"/ready never answered {status} within {timeout_s} s:\n{self.log()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.send_signal(signal.SIGINT)  # second signal: skip the drain
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_path.unlink(missing_ok=True)


def start_gateway(
    *args: str,
    engine: str = "fake",
    ms_per_frame: float = 0.0,
    wait: bool = True,
    env_extra: dict[str, str] | None = None,
) -> GatewayProcess:
    port = free_port()
    fd, log_name = tempfile.mkstemp(prefix="vivace-gateway-", suffix=".log")
    cmd = [sys.executable, "-m", "gateway", "--port", str(port), "--model", "tiny", "--device", "cpu",
           *engine_flags(engine, ms_per_frame), *args]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIVACE_")} | (env_extra or {})
    with os.fdopen(fd, "wb") as log_file:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    gateway = GatewayProcess(proc, port, Path(log_name))
    if wait:
        try:
            gateway.wait_ready()
        except BaseException:
            gateway.stop()
            raise
    return gateway


class LiveClient:
    """A `vivace.speech.v1` client over a real socket that sorts what arrives."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.frames: list[tuple[int, int, int, int, bytes]] = []  # (flags, stream, sequence, start, payload)
        self.arrivals: list[float] = []  # time.monotonic() at which each of `frames` arrived
        self.order: list[
            tuple[str, Any]
        ] = []  # ("event", type/context) or ("audio", stream), in arrival order

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, url: str, **kw: Any):  # type: ignore[no-untyped-def]
        kw.setdefault("subprotocols", [PROTOCOL])
        async with connect(url, max_size=None, **kw) as ws:
            client = cls(ws)
            created = await client.next_event()
            assert created["type"] == "session.created", created
            client.created = created
            yield client

    async def send(self, **event: Any) -> None:
        await self.ws.send(orjson.dumps(event).decode())

    async def receive(self, timeout_s: float = 30.0) -> dict[str, Any] | tuple[int, int, int, int, bytes]:
        message = await asyncio.wait_for(self.ws.recv(), timeout_s)
        if isinstance(message, bytes):
            frame = parse_audio_frame(message)
            self.frames.append(frame)
            self.arrivals.append(time.monotonic())
            self.order.append(("audio", frame[1]))
            return frame
        event = orjson.loads(message)
        self.events.append(event)
        self.order.append(("event", (event["type"], event.get("context_id"))))
        return event

    async def next_event(self, timeout_s: float = 30.0) -> dict[str, Any]:
        while True:
            item = await self.receive(timeout_s)
            if isinstance(item, dict):
                return item

    async def until(
        self, kind: str, context_id: str | None = None, timeout_s: float = 60.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            event = await self.next_event(max(0.01, deadline - time.monotonic()))
            if event["type"] == kind and (context_id is None or event.get("context_id") == context_id):
                return event

    def audio(self, stream: int) -> bytes:
        return b"".join(f[4] for f in self.frames if f[1] == stream)

    def stream_frames(self, stream: int) -> list[tuple[int, int, int, int, bytes]]:
        return [f for f in self.frames if f[1] == stream]


async def speak(
    url: str, text: str, context_id: str = "c", **create: Any
) -> tuple[dict[str, Any], LiveClient]:
    """One complete healthy context on its own socket: the control group of every fault test."""
    async with LiveClient.open(url) as client:
        if create:
            await client.send(type="context.create", context_id=context_id, **create)
        await client.send(type="input_text.append", context_id=context_id, text=text)
        await client.send(type="input_text.end", context_id=context_id)
        done = await client.until("context.done", context_id)
        return done, client
