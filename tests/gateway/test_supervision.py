"""Process-level behaviour: engine death and restart, several engines, SIGTERM drain, no torch in the
gateway, and a clear exit when the model is missing."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.protocol import PROTOCOL
from tests.gateway.helpers import REPO, GatewayProcess, LiveClient, expected_samples, speak, start_gateway

LONG_TEXT = "This context is still speaking when its engine goes away. " * 4


def mapped_files(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


async def start_context(gateway: GatewayProcess, client: LiveClient, context_id: str) -> None:
    await client.send(type="input_text.append", context_id=context_id, text=LONG_TEXT)
    await client.send(type="input_text.end", context_id=context_id)
    while not client.frames:
        await client.receive()


async def test_engine_death_fails_its_contexts_then_the_engine_restarts(engine_kind: str) -> None:
    server = start_gateway(engine=engine_kind, ms_per_frame=20.0)
    try:
        [engine_pid] = server.engine_pids()
        async with LiveClient.open(server.ws) as client:
            await start_context(server, client, "doomed")
            os.kill(engine_pid, signal.SIGKILL)
            error = await client.until("error", "doomed", timeout_s=10)
            assert error["error"]["code"] == "engine_died"
            done = await client.until("context.done", "doomed")
            assert done["reason"] == "error" and done["samples"] < expected_samples(len(LONG_TEXT))
            await client.send(type="ping", id=1)  # the socket itself lives on
            await client.until("pong")
        server.wait_ready(timeout_s=5, status=503)
        server.wait_ready(timeout_s=60, status=200)
        assert server.engine_pids() != [engine_pid]
        assert server.metrics()['vivace_engine_restarts_total{engine="0"}'] == 1
        done, _ = await speak(server.ws, "After the restart new sessions work.")
        assert done["reason"] == "completed"
    finally:
        server.stop()


async def test_a_context_cancelled_before_its_engine_dies_still_ends_cancelled(engine_kind: str) -> None:
    server = start_gateway(engine=engine_kind, ms_per_frame=20.0)
    try:
        [engine_pid] = server.engine_pids()
        async with LiveClient.open(server.ws) as client:
            await start_context(server, client, "stopped")
            os.kill(engine_pid, signal.SIGSTOP)  # the engine cannot confirm the cancel...
            await client.send(type="context.cancel", context_id="stopped")
            await client.until("context.cancelled", "stopped")
            os.kill(engine_pid, signal.SIGKILL)  # ...and dies with the request still running
            done = await client.until("context.done", "stopped", timeout_s=10)
            assert done["reason"] == "cancelled"
            assert not [e for e in client.events if e["type"] == "error" and e.get("context_id") == "stopped"]
        server.wait_ready(timeout_s=60, status=200)
    finally:
        server.stop()


async def test_with_two_engines_killing_one_fails_only_its_own_contexts(engine_kind: str) -> None:
    server = start_gateway("--engines=2", engine=engine_kind, ms_per_frame=20.0)
    try:
        pids = server.engine_pids()
        assert len(pids) == 2
        async with LiveClient.open(server.ws) as first, LiveClient.open(server.ws) as second:
            await start_context(server, first, "one")  # least-loaded routing: one context per engine
            await start_context(server, second, "two")
            os.kill(pids[0], signal.SIGKILL)
            results = await asyncio.gather(
                first.until("context.done", "one"), second.until("context.done", "two")
            )
        reasons = sorted(r["reason"] for r in results)
        assert reasons == ["completed", "error"], results
        completed = next(r for r in results if r["reason"] == "completed")
        assert completed["samples"] == expected_samples(len(LONG_TEXT))
        done, _ = await speak(server.ws, "The surviving engine keeps serving.")
        assert done["reason"] == "completed"
    finally:
        server.stop()


async def test_sigterm_drains_live_contexts_refuses_new_sessions_then_closes_1001(engine_kind: str) -> None:
    server = start_gateway("--drain-timeout=20", engine=engine_kind, ms_per_frame=10.0)
    try:
        async with LiveClient.open(server.ws) as client:
            await start_context(server, client, "live")
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(server.wait_ready, 5, 503)
            with pytest.raises(InvalidStatus) as info:
                async with connect(server.ws, subprotocols=[PROTOCOL]):
                    pass
            assert info.value.response.status_code == 503
            done = await client.until("context.done", "live", timeout_s=30)
            assert done["reason"] == "completed" and done["samples"] == expected_samples(len(LONG_TEXT))
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await client.receive(timeout_s=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert await asyncio.to_thread(server.proc.wait, 30) == 0
        assert not server.engine_pids()
    finally:
        server.stop()


def test_gateway_process_never_loads_torch(engine_kind: str) -> None:
    server = start_gateway(engine=engine_kind)
    try:
        [engine_pid] = server.engine_pids()
        asyncio.run(speak(server.ws, "Speak once so every code path is loaded."))
        assert "torch" not in mapped_files(server.proc.pid), "the gateway process mapped a torch library"
        assert engine_pid != server.proc.pid
        if engine_kind == "real":
            assert "libtorch" in mapped_files(engine_pid)
    finally:
        server.stop()
    modules = [m for m in ("gateway.app", "gateway.session", "gateway.http_api", "gateway.engines") if m]
    probe = "import sys, " + ", ".join(modules) + "; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_missing_weights_exit_with_instructions(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIVACE_")} | {"HF_HOME": str(tmp_path)}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "gateway"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "--download" in result.stderr and "--model tiny" in result.stderr
    assert time.monotonic() - started < 30
