"""The gateway under test as a child process: start it, wait (bounded) for /ready, scrape /metrics,
stop it (SIGTERM to its process group, then SIGKILL), and read the tail of its log."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


class ServerFailed(RuntimeError):
    """The server died or never became ready; the message carries its log tail."""


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return 0, ""


class Gateway:
    """`python -m gateway ...` in its own process group, its output in `log_path`."""

    def __init__(self, command: list[str], url: str, log_path: Path, cwd: Path) -> None:
        self.command, self.url, self.log_path, self.cwd = command, url, log_path, cwd
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.started_at = time.monotonic()

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds from start to the first 200 from /ready; ServerFailed on exit or timeout."""
        assert self.process is not None
        deadline = self.started_at + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerFailed(f"the gateway exited with code {self.process.returncode} before it was "
                                   f"ready\n{self.log_tail()}")  # fmt: skip
            if http_get(self.url + "/ready", timeout_s=2.0)[0] == 200:
                return time.monotonic() - self.started_at
            time.sleep(0.5)
        raise ServerFailed(f"the gateway was not ready within {timeout_s:.0f} s\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def metrics(self) -> str | None:
        status, body = http_get(self.url + "/metrics")
        return body if status == 200 else None

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM the gateway (it shuts its engines down), SIGKILL its whole process group after
        `grace_s` or once it has exited (no engine outlives it); its exit code (None: never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        return self.process.returncode

    def log_tail(self, chars: int = 4000) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - chars))
                text = log.read().decode("utf-8", "replace")
        except OSError:
            return "(no server log)"
        return f"--- server log tail ({self.log_path}) ---\n{text}"
