"""tools/talker_tiles.py on a CPU (`--dry-run`): every talker product, called as the streamed talker step calls it,
runs through the Triton interpreter at today's tile and two of the grid's, and agrees with `gemv_reference`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools import talker_tiles

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("rows", [1, 2])
def test_the_tile_sweep_checks_every_talker_product_against_its_twin(tmp_path: Path, rows: int) -> None:
    out = tmp_path / "tiles.json"
    run = subprocess.run([sys.executable, "tools/talker_tiles.py", "--dry-run", "--rows", str(rows), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    products = json.loads(out.read_text())["products"]
    assert set(products) == {"qkv", "o", "gate_up", "down"}
    for result in products.values():
        assert result["rows"] == rows and result["wrong"] == []
        assert [t["tile"] for t in result["tiles"]][0] == "today" and len(result["tiles"]) == 3


def test_the_grid_keeps_the_unrolled_loop_short_and_the_registers_bounded() -> None:
    for k, silu in ((2048, False), (2048, True), (6144, False)):
        grid = talker_tiles.tile_grid(k, silu)
        assert grid and all(c.loop_stages or k // c.block_k <= 8 for c in grid)
        assert all(c.block_n * c.block_k * (2 if silu else 1) // (32 * c.num_warps) in (16, 32) for c in grid)
