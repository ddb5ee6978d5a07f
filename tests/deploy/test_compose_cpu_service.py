"""The `cpu` compose service, run without Docker: its exact command (the image's ENTRYPOINT plus the
service's `command`, if any) and its exact `environment` from compose.yaml, on this machine with the
tiny model; then its health-check command, run until it passes, as Docker would.

The only substitutions, each because a container would not need it: `python` is this interpreter
(in the image it is the venv's), the working directory is the repository (the image's /app), and
VIVACE_PORT is a free port (both the server and the health check read it from the environment).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.deploy.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

SERVICE = "vivace-cpu"
READY_WITHIN_S = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def image_entrypoint() -> list[str]:
    lines = [line.strip() for line in (REPO_ROOT / "Dockerfile").read_text().splitlines()]
    return json.loads(
        [line for line in lines if line.startswith("ENTRYPOINT ")][-1].removeprefix("ENTRYPOINT ")
    )


def local(argv: list[str]) -> list[str]:
    return [sys.executable if argv[0] == "python" else argv[0], *argv[1:]]


def duration_s(text: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for suffix in ("ms", "s", "m", "h"):
        if text.endswith(suffix):
            return float(text.removesuffix(suffix)) * units[suffix]
    raise ValueError(text)


def test_cpu_service_starts_from_its_compose_definition_and_passes_its_health_check(
    compose_interpolated: dict[str, Any],
) -> None:
    if not all((REPO_ROOT / pkg / "__main__.py").is_file() for pkg in ("gateway", "engine")):
        pytest.skip("`python -m gateway` and `python -m engine` are not both in this checkout yet")
    service = compose_interpolated["services"][SERVICE]
    assert "entrypoint" not in service, (
        "the test runs the image's ENTRYPOINT; keep compose from overriding it"
    )
    command = local(image_entrypoint() + list(service.get("command") or []))
    check = service["healthcheck"]["test"]
    assert check[0] == "CMD"
    check_command = local(check[1:])

    port = free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("VIVACE_")}
    environment |= {k: str(v) for k, v in service["environment"].items()}
    assert environment["VIVACE_MODEL"] == "tiny" and environment["VIVACE_DEVICE"] == "cpu"
    environment["VIVACE_PORT"] = str(port)

    # The health check fails while nothing answers (so a pass below means the server is ready).
    idle = subprocess.run(check_command, env=environment, capture_output=True, timeout=30)
    assert idle.returncode != 0

    server = subprocess.Popen(command, cwd=REPO_ROOT, env=environment, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + READY_WITHIN_S
        interval = duration_s(service["healthcheck"]["start_interval"])
        timeout = duration_s(service["healthcheck"]["timeout"])
        while True:
            assert server.poll() is None, f"the cpu service exited with {server.returncode}"
            result = subprocess.run(check_command, env=environment, capture_output=True, timeout=timeout + 10)
            if result.returncode == 0:
                break
            assert time.monotonic() < deadline, f"health check still failing after {READY_WITHIN_S} s"
            time.sleep(min(interval, 1.0))
        # Docker stops a service with SIGTERM and kills it after stop_grace_period: it must exit in time.
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=duration_s(service["stop_grace_period"]))
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)
        output = server.stdout.read().decode(errors="replace") if server.stdout else ""
        print(output[-4000:])
