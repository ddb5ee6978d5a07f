"""An engine that cannot start stops the server; one that dies after it served is restarted.

Real `python -m gateway` processes over real sockets. An engine that cannot start is the real engine given
an argument it rejects, or the fake engine told to fail at start (`--fail-start-on INDEX`); engines that
die after they were ready are killed with SIGKILL, or stalled with SIGSTOP past the heartbeat timeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import httpx

from gateway.settings import parse_settings
from tests.gateway.helpers import GatewayProcess, LiveClient, start_gateway

FAIL_FAST_S = 60
LONG_TEXT = "A context that is still speaking when its engine stops answering. " * 4


def engines_of(gateway_pid: int) -> list[int]:
    """Every live engine process a gateway started, even after the gateway itself is gone."""
    marker = f"@vivace-{gateway_pid}-".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return pids


def ready_status(server: GatewayProcess) -> tuple[int, dict] | None:
    try:
        response = server.get("/ready")
    except httpx.HTTPError:
        return None
    return response.status_code, response.json()


def wait_exit_sampling_ready(server: GatewayProcess, timeout_s: float) -> tuple[int, float, set[int]]:
    """Wait for the gateway to exit; returns (status, seconds taken, every /ready status seen)."""
    started = time.monotonic()
    seen: set[int] = set()
    while server.proc.poll() is None and time.monotonic() - started < timeout_s:
        answer = ready_status(server)
        if answer is not None:
            seen.add(answer[0])
        time.sleep(0.05)
    if server.proc.poll() is None:
        server.stop()
        raise AssertionError(f"the gateway still runs after {timeout_s} s:\n{server.log()[-4000:]}")
    return server.proc.returncode, time.monotonic() - started, seen


def test_a_real_engine_that_cannot_start_stops_the_server_with_its_error() -> None:
    server = start_gateway("--engine-arg=--no-such-flag", engine="real", wait=False)
    try:
        status, took, seen = wait_exit_sampling_ready(server, FAIL_FAST_S)
        log = server.log()
        assert status not in (0, None), log
        assert took < FAIL_FAST_S
        assert 200 not in seen
        assert log.count("starting engine 0") == 3, log
        summary = log[log.index("error: engine 0 failed to start 3 times") :]
        # the engine's own words, repeated
        assert "unrecognized arguments: --no-such-flag" in summary, summary
        assert not engines_of(server.proc.pid)
    finally:
        server.stop()


def test_with_two_engines_one_that_cannot_start_stops_the_server_and_the_other_engine() -> None:
    server = start_gateway("--engines=2", "--engine-arg=--fail-start-on=1", engine="fake", wait=False)
    try:
        status, took, seen = wait_exit_sampling_ready(server, FAIL_FAST_S)
        log = server.log()
        assert status not in (0, None), log
        assert took < FAIL_FAST_S
        assert 200 not in seen  # engine 0 was ready, but not every engine ever was
        summary = log[log.index("error: engine 1 failed to start 3 times") :]
        assert "engine 1 cannot start" in summary
        assert log.count("starting engine 0") == 1  # the healthy engine was never restarted
        assert not engines_of(server.proc.pid)
    finally:
        server.stop()


def test_an_engine_that_dies_after_it_served_is_restarted_however_often() -> None:
    server = start_gateway(engine="fake")
    try:
        for death in range(1, 5):  # more deaths than START_ATTEMPTS: they are not failed starts
            [pid] = server.engine_pids()
            os.kill(pid, signal.SIGKILL)
            server.wait_ready(timeout_s=5, status=503)
            server.wait_ready(timeout_s=30, status=200)
            assert server.engine_pids() != [pid]
            assert server.metrics()['vivace_engine_restarts_total{engine="0"}'] == death
        assert server.proc.poll() is None
    finally:
        server.stop()


def test_with_two_engines_ready_stays_200_while_one_restarts_and_says_which() -> None:
    server = start_gateway("--engines=2", engine="fake")
    try:
        first, second = server.engine_pids()
        os.kill(first, signal.SIGKILL)
        bodies = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            answer = ready_status(server)
            assert answer is not None and answer[0] == 200, answer
            bodies.append(answer[1])
            engines = {e["engine"]: e for e in answer[1]["engines"]}
            if all(e["ready"] for e in engines.values()) and engines[0]["restarts"] == 1:
                break
            time.sleep(0.01)
        else:
            raise AssertionError(f"engine 0 did not come back: {bodies[-1]}")
        partial = [b for b in bodies if [e["ready"] for e in b["engines"]] == [False, True]]
        assert partial, "no /ready answer showed engine 0 down and engine 1 serving"
        assert second in server.engine_pids() and first not in server.engine_pids()
    finally:
        server.stop()


async def test_a_stalled_engine_is_replaced_after_the_heartbeat_timeout() -> None:
    server = start_gateway("--heartbeat-timeout-s=1.5", engine="fake", ms_per_frame=20.0)
    try:
        [pid] = server.engine_pids()
        async with LiveClient.open(server.ws) as client:
            await client.send(type="input_text.append", context_id="stalled", text=LONG_TEXT)
            await client.send(type="input_text.end", context_id="stalled")
            while not client.frames:
                await client.receive()
            os.kill(pid, signal.SIGSTOP)
            stopped = time.monotonic()
            error = await client.until("error", "stalled", timeout_s=10)
            took = time.monotonic() - stopped
            assert error["error"]["code"] == "engine_died"
            assert took < 1.5 + 2.0, took  # the 10 s default would not have fired yet
            done = await client.until("context.done", "stalled")
            assert done["reason"] == "error"
        server.wait_ready(timeout_s=30, status=200)
        assert pid not in server.engine_pids()
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    finally:
        server.stop()


def test_the_heartbeat_timeout_is_a_flag_and_a_variable() -> None:
    assert parse_settings([], {}).engine_heartbeat_timeout_s == 10.0
    assert parse_settings(["--heartbeat-timeout-s", "2.5"], {}).engine_heartbeat_timeout_s == 2.5
    assert parse_settings([], {"VIVACE_HEARTBEAT_TIMEOUT_S": "4"}).engine_heartbeat_timeout_s == 4.0
