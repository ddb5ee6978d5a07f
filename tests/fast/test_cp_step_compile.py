"""The persistent code-predictor step's GPU-only code (grid barriers, L2 prefetch, the timeline) compiles for the
H200's architecture on a machine without a GPU, and one program fits an SM: Triton's interpreter never runs that
code (it launches one phase at a time), so this is the CPU suite's only look at it."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from tools.kernel_compile import have_ptxas  # noqa: E402


@pytest.mark.skipif(not have_ptxas(), reason="Triton without its NVIDIA backend's ptxas")
@pytest.mark.parametrize(("tokens", "queries_first"), [(1, False), (2, False), (1, True)],
                         ids=["lookup-step", "first-step", "queries-first"])  # fmt: skip
def test_the_persistent_step_compiles_for_sm90_and_fits_one_sm(tokens: int, queries_first: bool) -> None:
    from tools.cp_step_compile import H100_SHARED_BYTES, compile_step

    info = compile_step(90, "1.7b", tokens, 32, 128, 1, 4, 4, tokens == 1, True, queries_first)
    assert 0 < info["registers"] <= 255
    assert 0 < info["shared"] <= H100_SHARED_BYTES


def test_residency_counts_registers_by_the_warp_threads_and_shared_memory() -> None:
    from engine.fast.kernels.cp_step import resident_per_sm

    assert resident_per_sm(255, 24576, 4, 233472) == 2  # 32 x 256 registers a warp: two 4-warp programs
    assert resident_per_sm(168, 24576, 4, 233472) == 3
    assert resident_per_sm(128, 24576, 4, 233472) == 4
    assert resident_per_sm(32, 120_000, 4, 233472) == 1  # shared memory the limit
    assert resident_per_sm(16, 0, 32, 233472) == 2  # threads the limit (2048 a SM)
    assert resident_per_sm(255, 0, 16, 233472) == 0  # does not fit at all
