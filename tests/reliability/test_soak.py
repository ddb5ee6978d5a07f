"""`python -m loadtest soak` for 60 s: a real tiny-model server under mixed clients leaks nothing, hangs nothing.

The soak itself decides pass or fail (loadtest/soak.py lists the rules); this test runs it as a user would
and also checks its report says what it measured: every client kind ran, every client got an answer, the
processes were sampled throughout, and the slot pools were read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.soak import MIX
from tests.gateway.helpers import REPO

pytestmark = pytest.mark.slow


def test_a_60_second_soak_of_mixed_clients_passes(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    result = subprocess.run(
        [sys.executable, "-m", "loadtest", "soak", "--duration", "60s", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["problems"] == [] and report["failures"] == []
    assert set(report["outcomes"]) == set(MIX), report["outcomes"]  # every kind of client ran
    answered = sum(sum(results.values()) for results in report["outcomes"].values())
    assert answered == report["clients"] >= 30
    assert report["load_seconds"] >= 59
    processes = {name.split(":")[0] for name in report["final"]}
    assert processes == {"gateway", "engine"}
    load_samples = [s for s in report["samples"] if s["phase"] == "load"]
    assert len(load_samples) >= 40
    assert report["slot_pools_after_settle"], "the engine reported no slot pools"
    assert all(free == total for free, total in report["slot_pools_after_settle"].values())
    assert report["exit_status"] == 0
