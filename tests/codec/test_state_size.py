"""`python -m engine.codec` prints the per-stream state size that the pool really allocates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from engine.codec.config import codec_preset
from engine.codec.state_layout import kv_elements, state_bytes, state_elements
from engine.codec.stream import CodecStatePool

ROOT = Path(__file__).resolve().parents[2]


def test_state_size_command_prints_the_pool_sizes_for_full_and_tiny():
    out = subprocess.run(
        [sys.executable, "-m", "engine.codec"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    for name in ("full", "tiny"):
        config = codec_preset(name)
        fp32 = CodecStatePool(config, 1, "meta", torch.float32).bytes_per_slot
        bf16 = CodecStatePool(config, 1, "meta", torch.bfloat16).bytes_per_slot
        row = next(line for line in out.splitlines() if line.startswith(f"| {name} |"))
        assert f"{fp32:,}" in row and f"{bf16:,}" in row


def test_full_state_is_71_frames_of_kv_in_8_layers_plus_the_conv_histories():
    config = codec_preset("full")
    assert kv_elements(config) == 8 * 2 * 16 * 71 * 64
    # pre_conv 512x2; 3 x 1024x6 (two ConvNeXt, decoder.0); blocks: overlap r + residual 6+18+54 per channel; 96x6.
    convs = (
        512 * 2
        + 3 * 1024 * 6
        + sum(c * (r + 78) for c, r in ((768, 8), (384, 5), (192, 4), (96, 3)))
        + 96 * 6
    )
    assert state_elements(config) - kv_elements(config) == convs == 141_472
    assert state_bytes(config, 4) == 4 * (1_163_264 + 141_472) + 8
