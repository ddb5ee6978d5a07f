"""Each Triton kernel of the talker and code-predictor fast path equals its PyTorch twin (fp32, Triton's
CPU interpreter, tiny shapes), poisoned caches included. Run in a subprocess: the interpreter is chosen
when the kernels are defined, so TRITON_INTERPRET must be set before they are imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

SCRIPT = """
import json, torch
from engine.fast.kernels import use_triton
from engine.fast.kernels.selfcheck import check_kernels
assert use_triton(torch.zeros(1)), "interpreter mode not active"
print(json.dumps(check_kernels("cpu", torch.float32, hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96,
                               rows=5, max_len=200)))
"""


def test_every_kernel_matches_its_twin_in_the_triton_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(errors) == {"rms_norm", "rms_norm_no_residual", "silu_mul", "qk_norm_rope", "decode_attention"}
    for name, error in errors.items():
        assert error < 1e-5, f"{name}: relative error {error}"
