"""The fast paths with their Triton kernels really running (Triton's CPU interpreter, fp32, tiny model)
equal the plain executors, batch size 1 included, where an expanded (stride-0) index once made the
kernels read past their inputs (tests/fast/test_cp_kernels.py runs the wider steps' tensor-core tiles); the
talker's 1-2 row decode steps also with their products in `gemv`, and its decode steps with q/k norm and RoPE in
the attention kernel. A subprocess: TRITON_INTERPRET must be set before the kernels exist."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")


def test_fast_paths_through_the_interpreted_kernels_equal_the_plain_executors() -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "tests/fast/test_code_predictor_graph.py::test_fast_frame_equals_the_plain_executor[split]",
               "tests/fast/test_code_predictor_graph.py::test_fast_frame_equals_the_plain_executor[frame-io]",
               "tests/fast/test_talker_graph.py::test_prefill_and_decode_steps_equal_the_plain_executor[split]",
               "tests/fast/test_talker_graph.py::test_prefill_and_decode_steps_equal_the_plain_executor[streamed]",
               "tests/fast/test_talker_graph.py::test_prefill_and_decode_steps_equal_the_plain_executor[fused-rope]",
               "tests/fast/test_talker_graph.py::test_a_fused_draw_equals_the_plain_executor"]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "6 passed" in done.stdout
