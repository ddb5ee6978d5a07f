"""A /dev/shm without room for a link's rings stops the server at start, instead of a SIGBUS per request.

The gateway runs in its own mount namespace (`unshare --mount`, root only) over a 1 MiB tmpfs at /dev/shm:
too small for one link (about 9 MiB of rings). Before the segments were allocated up front, the server
started, and the engine died with SIGBUS the first time a reply touched a page the tmpfs could not back.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

from engine.ipc.segment import segment_bytes
from tests.gateway.helpers import REPO, free_port


def can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


def test_a_full_dev_shm_stops_the_server_at_start_naming_dev_shm() -> None:
    if not can_unshare():
        pytest.skip("needs root: unshare --mount (CI runs as root)")
    assert segment_bytes(1 << 20, 8 << 20) > 1 << 20  # the default rings do not fit the 1 MiB tmpfs
    gateway = f"exec {sys.executable} -m gateway --fake-engine --model tiny --port {free_port()}"
    script = f"mount -t tmpfs -o size=1m tmpfs /dev/shm && {gateway}"
    started = time.monotonic()
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        cwd=REPO, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    took = time.monotonic() - started
    assert result.returncode == 1, result.stderr[-3000:]
    assert took < 60
    summary = result.stderr[result.stderr.index("error: engine 0 failed to start 3 times") :]
    assert "/dev/shm has no room for a link's rings" in summary and "No space left" in summary, summary
    assert "exit status -7" not in result.stderr  # no SIGBUS
