"""The real voice-agent frameworks and SDKs, offline, against a gateway with the tiny model.

Pipecat's ElevenLabs, Cartesia and OpenAI services, LiveKit's elevenlabs, cartesia and openai
plugins, and the official `elevenlabs` and `cartesia` SDKs live in their own venv
(tests/compat/frameworks/setup.sh, run by scripts/test.sh) because their pins clash with ours. This
test starts the gateway and runs tests/compat/frameworks/check_*.py with that venv's Python.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.gateway.helpers import REPO, GatewayProcess

VENV_PYTHON = REPO / ".frameworks-venv" / "bin" / "python"
CHECKS = ("check_pipecat.py", "check_livekit.py", "check_sdks.py")


@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS)
def test_framework_clients_work_pointed_at_the_gateway(gateway: GatewayProcess, check: str) -> None:
    assert VENV_PYTHON.exists(), (
        "no frameworks venv: run bash tests/compat/frameworks/setup.sh (scripts/test.sh does)"
    )
    env = {**os.environ, "VIVACE_URL": gateway.http, "LOGURU_LEVEL": "WARNING"}  # Pipecat logs via loguru
    result = subprocess.run(
        [str(VENV_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "python_files=check_*.py", "--tb=short", "-rfE",
         f"tests/compat/frameworks/{check}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary and "skipped" not in summary, summary
