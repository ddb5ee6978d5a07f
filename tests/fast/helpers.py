"""Run a script under Triton's CPU interpreter: the interpreter is chosen when the kernels are defined, so a kernel
test that needs it runs its script in a fresh Python process with TRITON_INTERPRET=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_interpreted(script: str, timeout_s: float = 300, args: tuple[str, ...] = ()) -> Any:
    """Run `script` (from the repository root, with `args` as its sys.argv[1:]) under TRITON_INTERPRET=1; -> the JSON
    its last output line holds."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
