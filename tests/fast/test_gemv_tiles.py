"""tools/gemv_tiles.py on a CPU (`--dry-run`): every product of the talker and the code predictor, called as their
steps call it, runs through the Triton interpreter at two of the grid's tiles (and today's, where the engine runs
it in `gemv`) and agrees with `gemv_reference`, at the CUDA-core rows and the tensor-core rows alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools import gemv_tiles

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("model", "rows"), [("talker", 1), ("talker", 2), ("code_predictor", 1),
                                             ("code_predictor", 64), ("talker", 128)])  # fmt: skip
def test_the_tile_sweep_checks_every_product_against_its_twin(tmp_path: Path, model: str, rows: int) -> None:
    out = tmp_path / "tiles.json"
    run = subprocess.run([sys.executable, "tools/gemv_tiles.py", "--dry-run", "--model", model, "--rows", str(rows),
                          "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    products = json.loads(out.read_text())["products"]
    assert set(products) == {f"{name}@{rows}" for name in gemv_tiles.PRODUCTS[model]}
    in_gemv_today = rows <= 2  # above, cuBLAS runs the engine's products: no "today" tile
    for result in products.values():
        assert result["rows"] == rows and result["wrong"] == []
        names = [t["tile"] for t in result["tiles"]]
        assert (names[0] == "today") == in_gemv_today and len(names) == 2 + in_gemv_today


def test_the_tile_sweep_checks_its_bulk_copy_tiles_against_the_twin(tmp_path: Path) -> None:
    """`--tma`: two more tiles a product, loading by bulk tensor copies, each agreeing with `gemv_reference`."""
    out = tmp_path / "tiles.json"
    run = subprocess.run([sys.executable, "tools/gemv_tiles.py", "--dry-run", "--model", "code_predictor", "--rows",
                          "64", "--tma", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    for result in json.loads(out.read_text())["products"].values():
        names = [t["tile"] for t in result["tiles"]]
        assert result["wrong"] == [] and len(names) == 4 and sum(name.endswith("/tma") for name in names) == 2


def test_the_cuda_core_grid_keeps_the_unrolled_loop_short_and_the_registers_bounded() -> None:
    for k, silu in ((2048, False), (2048, True), (6144, False)):
        grid = gemv_tiles.tile_grid(k, silu)
        assert grid and all(c.loop_stages or k // c.block_k <= 8 for c in grid)
        assert all(c.block_n * c.block_k * (2 if silu else 1) // (32 * c.num_warps) in (16, 32) for c in grid)


def test_the_tensor_core_grid_launches_each_tile_once() -> None:
    from engine.fast.kernels.gemv import launch_tile

    for rows in (16, 64, 128):
        grid = gemv_tiles.tile_grid(1024, False, rows)
        launches = [(launch_tile(rows, 1024, c), c.num_warps, c.loop_stages) for c in grid]
        assert grid and all(c.use_dot for c in grid) and len(set(launches)) == len(launches)
        assert all(c.loop_stages or 1024 // tile[3] <= 8 for c, (tile, _, _) in zip(grid, launches, strict=True))


def test_the_tensor_core_grid_takes_the_widths_asked_for_in_whole_tile_slices() -> None:
    """`--columns 64 128 --split-k 1 4 8` for the talker's down product (K 6144) at 64 rows."""
    from engine.fast.kernels.gemv import launch_tile

    grid = gemv_tiles.tile_grid(6144, False, 64, (1, 4, 8), (64, 128))
    assert {c.block_n for c in grid} == {64, 128} and {c.split_k for c in grid} == {1, 4, 8}
    for config in grid:
        block_k = launch_tile(64, 6144, config)[3]
        assert 6144 % (config.split_k * block_k) == 0 and (config.split_k == 1 or config.loop_stages > 0)
