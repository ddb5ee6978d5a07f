"""`python -m loadtest faults`, fault by fault: the invariants, not the timings.

Each fault runs against a fresh loaded server (loadtest/faults.py says how). For every one: every request
completed or got a clear error, nothing leaked, and the server served again (or, when it was stopped,
exited as documented).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.faults import FAULTS
from tests.gateway.helpers import REPO

pytestmark = pytest.mark.slow

SERVES_AGAIN = {"engine-kill", "engine-kill-2", "engine-stall", "audio-ring-full", "request-ring-full"}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_under_load_every_request_is_answered_nothing_leaks_and_service_returns(
    fault: str, tmp_path: Path
) -> None:
    out = tmp_path / "faults.json"
    result = subprocess.run(
        [sys.executable, "-m", "loadtest", "faults", fault, "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    [report] = json.loads(out.read_text())["results"]
    assert report["failures"] == [] and report["leaks"] == []
    if report["notes"].startswith("skipped"):
        pytest.skip(report["notes"])
    if fault in SERVES_AGAIN:
        assert report["back_in_s"] is not None
        assert sum(report["outcomes"].values()) > 0
        assert report["exit_status"] == 0  # and it still shut down cleanly afterwards
    if fault == "audio-ring-full":
        assert set(report["outcomes"]) == {"completed"}  # backpressure loses nothing
    if fault == "request-ring-full":
        assert report["outcomes"].get("error:engine_busy", 0) > 0, "the request ring never filled"
    if fault == "gateway-sigterm":
        assert report["exit_status"] == 0
    if fault == "shm-exhausted":
        assert report["exit_status"] == 1
