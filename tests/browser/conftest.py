"""Fixtures for the browser tests: a server that serves web/ (switchable), and headless Chromium.

Which server, by `VIVACE_WEB_TEST_SERVER`:
  gateway              the real `python -m gateway --model tiny --device cpu` (real engine process,
                       tiny random-weight model): what the suite runs.
  gateway-fake-engine  the real gateway with its hidden `--fake-engine` (a tone, no torch): quick checks.
  standin              tests/browser/standin_server.py, the same protocol with synthetic audio and
                       no gateway at all (how web/ was developed before the gateway existed).
Unset, `gateway` is used whenever both `gateway/__main__.py` and `engine/__main__.py` exist, the
stand-in otherwise; the choice is printed in the test report header and recorded as a junit
property on every browser test.

Chromium: Debian's /usr/bin/chromium driven by Playwright (no browser download). Where Playwright
or Chromium is missing the tests skip, except under CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "test-artifacts"
CHROMIUM = os.environ.get("VIVACE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
]
# Chromium's fake microphone (a beeping tone) granted without a prompt: for recording a reference voice.
FAKE_MICROPHONE_ARGS = ["--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"]
KINDS = ("gateway", "gateway-fake-engine", "standin")
READY_TIMEOUT_S = {"gateway": 600.0, "gateway-fake-engine": 60.0, "standin": 30.0}


def server_kind() -> str:
    chosen = os.environ.get("VIVACE_WEB_TEST_SERVER", "").strip().lower()
    if chosen in KINDS:
        return chosen
    if chosen:
        raise pytest.UsageError(f"VIVACE_WEB_TEST_SERVER must be one of {', '.join(KINDS)}, got {chosen!r}")
    real = all((REPO_ROOT / package / "__main__.py").is_file() for package in ("gateway", "engine"))
    return "gateway" if real else "standin"


def pytest_report_header(config: pytest.Config) -> str:
    return f"browser tests serve web/ from: {server_kind()} (set VIVACE_WEB_TEST_SERVER to choose)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (required under CI)")
    pytest.skip(reason)


@dataclass
class WebServer:
    kind: str
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def playback_reports_received(self) -> int:
        """How many playback.position events the server has received, all sessions together."""
        if self.kind == "standin":
            import json

            return sum(
                1 for e in json.loads(self.get("/_standin/received")[1]) if e["type"] == "playback.position"
            )
        status, text = self.get("/metrics")
        assert status == 200, f"/metrics answered {status}"
        match = re.search(r"^vivace_playback_reports_total(?:\{\})? ([0-9.e+]+)$", text, re.M)
        return int(float(match.group(1))) if match else 0

    def received_events(self) -> list[dict] | None:
        """The stand-in's exact record of playback.position/context.cancel events; None for the gateway."""
        if self.kind != "standin":
            return None
        import json

        return json.loads(self.get("/_standin/received")[1])

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


@pytest.fixture(scope="module")
def web_server() -> Iterator[WebServer]:
    kind = server_kind()
    port = free_port()
    if kind == "gateway":
        command = [sys.executable, "-m", "gateway", "--model", "tiny", "--device", "cpu", "--port", str(port)]
    elif kind == "gateway-fake-engine":
        command = [sys.executable, "-m", "gateway", "--model", "tiny", "--fake-engine", "--port", str(port)]
    else:
        command = [sys.executable, "-m", "tests.browser.standin_server", "--port", str(port)]
    yield from serve(kind, command, f"browser-{kind}-server.log", READY_TIMEOUT_S[kind])


def serve(kind: str, command: list[str], log_name: str, ready_timeout_s: float) -> Iterator[WebServer]:
    """Run `command` (a server on the port its `--port` names) with its output in test-artifacts/`log_name`,
    yield it once /ready answers 200, stop it afterwards (a fixture's body: `yield from serve(...)`)."""
    port = command[command.index("--port") + 1]
    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / log_name
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIVACE_")}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = WebServer(kind, f"http://127.0.0.1:{port}", process, log_path)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                pytest.fail(f"{' '.join(command)} exited with {process.returncode}:\n{server.log_tail()}")
            with contextlib.suppress(OSError):
                if server.get("/ready")[0] == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"{kind} server not ready within {ready_timeout_s} s:\n{server.log_tail()}")
            time.sleep(0.2)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def playwright_driver() -> Iterator[object]:
    """One Playwright driver per module (its sync API allows only one at a time), shared by the browsers."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("the Python package 'playwright' is not installed")
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        missing(f"no Chromium at {CHROMIUM} (Debian package 'chromium')")
    with sync_playwright() as p:
        yield p


def launch_chromium(driver: object, extra_args: tuple[str, ...] = ()) -> Iterator[object]:
    browser = driver.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, *extra_args])  # type: ignore[attr-defined]
    try:
        yield browser
    finally:
        browser.close()


@pytest.fixture(scope="module")
def chromium(playwright_driver: object) -> Iterator[object]:
    yield from launch_chromium(playwright_driver)


@pytest.fixture(scope="module")
def chromium_with_microphone(playwright_driver: object) -> Iterator[object]:
    """Chromium whose microphone is the fake device (`FAKE_MICROPHONE_ARGS`), permission granted."""
    yield from launch_chromium(playwright_driver, tuple(FAKE_MICROPHONE_ARGS))


@pytest.fixture(autouse=True)
def _record_server_kind(request: pytest.FixtureRequest, record_property) -> None:
    record_property("web_server", server_kind())
