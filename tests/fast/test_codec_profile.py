"""tools/codec_profile.py on a CPU (`--dry-run`, tiny codec): every shape is captured, replayed and profiled through
the path the GPU takes, and `--launchers` runs its eager, shape-recording step (no CUDA kernels to name off the GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_codec_profile_runs_on_a_cpu_with_its_launcher_attribution(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    run = subprocess.run([sys.executable, "tools/codec_profile.py", "--dry-run", "--shapes", "1x1", "2x2",
                          "--precisions", "tf32", "--launchers", "nchwToNhwc", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert [(r["batch"], r["frames"]) for r in results] == [(1, 1), (2, 2)]
    assert all(r["launchers"] == [] and r["replay_ms"] > 0 for r in results)  # no CUDA kernels on a CPU
