"""The GPU check can check a `tools/frame_variants.py` variant in place of the engine's kernel flags: its code
predictor's `FrameKernels` and its talker's options and tiles are the ones captured (the tiny fp32 model on the CPU,
as `--dry-run` builds it), and a knockout, whose codes mean nothing, is refused before anything is built."""

from __future__ import annotations

import argparse

import pytest
import torch

from loadtest import gpu_check
from tools import frame_variants


def test_a_variant_replaces_the_kernel_flags_in_what_the_check_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_check, "DEVICE", "cpu")
    monkeypatch.setattr(gpu_check, "DTYPE", torch.float32)
    variant = "gemv_tma+talker_wide64_tma+draw_fused"
    args = argparse.Namespace(preset="tiny", context=512, variant=variant, **vars(gpu_check.KernelOptions()))
    with torch.inference_mode():
        env = gpu_check.build(args)
    assert env["fast_cp"].kernels == frame_variants.frame_kernels(variant)
    rows, rope, chain, tiles = frame_variants.talker_options(variant)
    assert env["fast_talker"].chain_tiles == dict(tiles) and env["fast_talker"].chain_rows == chain
    assert env["fast_talker"].gemv_max_rows == rows and env["fast_talker"].fused_rope == rope
    assert env["fast_talker"].chain_tiles[64].down.tma  # the wide down tile, loading by bulk copies
    assert env["fast_talker"].fused_draw


@pytest.mark.parametrize("variant", ["ko_cp_norms", "defaults+bogus"])
def test_a_knockout_or_an_unknown_variant_is_refused(variant: str) -> None:
    with pytest.raises(SystemExit) as refused:
        gpu_check.main(["--dry-run", "--variant", variant])
    assert refused.value.code == 2
