"""tools/conv_snake_bench.py on a CPU (`--dry-run`): it finds every conv of a codec step on both decoders and
writes a timing per tile for each distinct one (the times themselves mean nothing off the GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engine.codec.config import codec_preset
from engine.codec.layers import DecoderBlock

ROOT = Path(__file__).resolve().parents[2]


def test_the_tile_sweep_runs_on_a_cpu_and_accounts_for_every_conv_of_the_step(tmp_path: Path):
    out = tmp_path / "sweep.json"
    run = subprocess.run([sys.executable, "tools/conv_snake_bench.py", "--dry-run", "--shapes", "1x1", "2x4",
                          "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    tiles = len(result["tiles"])
    assert tiles > 1 and result["tiles"][0] == {"block_m": 64, "block_n": 128, "block_k": None, "num_warps": 4,
                                                "num_stages": 3}  # the default tile first  # fmt: skip
    convs = 1 + 2 * len(DecoderBlock.DILATIONS) * len(codec_preset("tiny").upsample_rates)  # decoder.0, two per residual unit
    for shape in result["shapes"]:
        assert sum(call["count"] for call in shape["calls"]) == convs
        assert all(len(call["tile_ms"]) == tiles and call["baseline_ms"] > 0 for call in shape["calls"])
    assert "| 1 x 1 |" in run.stdout and "best tile over every shape" in run.stdout
