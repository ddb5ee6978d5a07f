"""Fixtures for the IPC tests: unique control sockets, a fake engine process, and a /dev/shm audit."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from engine.ipc.process import engine_command, spawn_engine, stop_engine, wait_for_socket_async
from tests.ipc.helpers import shm_entries

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def socket_path() -> str:
    return f"@vivace-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def no_shm_leftovers() -> Iterator[None]:
    """Fails the test if /dev/shm holds any entry afterwards that it did not hold before."""
    before = shm_entries()
    yield
    assert shm_entries() - before == set(), "shared memory left behind in /dev/shm"


class FakeEngineProcess:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.proc: subprocess.Popen | None = None

    async def start(self, *args: str) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = spawn_engine(engine_command("engine.ipc.fake_engine", *args), self.socket_path, env=env)
        await wait_for_socket_async(self.socket_path, timeout_s=20, proc=self.proc)
        return self.proc


@pytest.fixture
async def fake_engine(socket_path: str) -> AsyncIterator[FakeEngineProcess]:
    engine = FakeEngineProcess(socket_path)
    yield engine
    if engine.proc is not None:
        stop_engine(engine.proc, timeout_s=5)
