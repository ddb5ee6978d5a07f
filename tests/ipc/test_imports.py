"""The link is importable by the gateway: no torch, no numpy, nothing heavy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_link_modules_import_without_torch_or_numpy() -> None:
    code = (
        "import sys\n"
        "import engine.ipc.client, engine.ipc.server, engine.ipc.process, engine.ipc.fake_engine, engine.ipc.wire\n"
        "heavy = sorted(m for m in ('torch', 'numpy') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
