"""Start an engine process (the real one or the fake) on a control socket, and wait until it listens.

    proc = spawn_engine([sys.executable, "-m", "engine", "--model", "tiny", "--device", "cpu"], "@vivace-0")
    await wait_for_socket_async("@vivace-0", timeout_s=60, proc=proc)
    link = await EngineLink.connect("@vivace-0")

`spawn_engine` appends `--socket PATH` to `argv`. The engine process should call `die_with_parent()`
early so a gateway killed with SIGKILL cannot leave an orphan engine holding the GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

from engine.ipc.control import unix_address

_PR_SET_PDEATHSIG = 1


def engine_command(module: str = "engine", *args: str) -> list[str]:
    """`[python, -m, module, *args]` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def spawn_engine(
    argv: list[str], socket_path: str, env: dict[str, str] | None = None, stderr: int | None = None
) -> subprocess.Popen:
    """Start `argv + ["--socket", socket_path]` in its own process group; stdout is inherited.

    `env` replaces the environment (default: this process's); PYTHONUNBUFFERED is set so engine logs
    appear promptly. `stderr`: a file descriptor for the engine's stderr (default: inherited).
    """
    if not argv:
        raise ValueError("argv must name the engine command")
    unix_address(socket_path)  # validate before starting anything
    environment = dict(os.environ if env is None else env)
    environment.setdefault("PYTHONUNBUFFERED", "1")
    return subprocess.Popen(
        [*argv, "--socket", socket_path], env=environment, stderr=stderr, start_new_session=True
    )


def probe_socket(socket_path: str) -> bool:
    """True if something accepts connections on `socket_path` right now."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(0.5)
        probe.connect(unix_address(socket_path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _check_alive(proc: subprocess.Popen | None, socket_path: str) -> None:
    if proc is not None and proc.poll() is not None:
        raise RuntimeError(f"engine exited with status {proc.returncode} before listening on {socket_path!r}")


def wait_for_socket(socket_path: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Block until `socket_path` accepts connections; TimeoutError after `timeout_s`, RuntimeError if
    `proc` exits first."""
    deadline = time.monotonic() + timeout_s
    while not probe_socket(socket_path):
        _check_alive(proc, socket_path)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"nothing listened on {socket_path!r} within {timeout_s} s")
        time.sleep(0.02)


async def wait_for_socket_async(
    socket_path: str, timeout_s: float, proc: subprocess.Popen | None = None
) -> None:
    """`wait_for_socket` for an event loop (sleeps between probes instead of blocking)."""
    deadline = time.monotonic() + timeout_s
    while not probe_socket(socket_path):
        _check_alive(proc, socket_path)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"nothing listened on {socket_path!r} within {timeout_s} s")
        await asyncio.sleep(0.02)


def stop_engine(proc: subprocess.Popen, timeout_s: float = 5.0) -> int:
    """SIGTERM, wait up to `timeout_s`, then SIGKILL; returns the exit status."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask Linux to send `sig` to this process when its parent dies (prctl PR_SET_PDEATHSIG).

    Returns False where unsupported. Call it first thing in the engine's main.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    return True
