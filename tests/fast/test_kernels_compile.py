"""The code predictor's kernels compile for the H200's architecture in their GPU-only forms, on a machine without a
GPU: programmatic dependent launch, split K, the attention's early cache loads and the sampler's in-kernel clock.
Triton's interpreter never runs these branches (they are constexpr-off there), so this is the CPU suite's only look
at them; each must fit without spilling."""

from __future__ import annotations

from typing import Any

import pytest

triton = pytest.importorskip("triton")

from tools.kernel_compile import compile_for, have_ptxas  # noqa: E402

pytestmark = pytest.mark.skipif(not have_ptxas(), reason="Triton without its NVIDIA backend's ptxas")

GEMV = dict(K=1024, HAS_INDEX=False, HAS_NORM=False, HAS_RESIDUAL=False, HAS_BIAS=False, SILU_MUL=False,
            USE_DOT=True, PRECISION="tf32", BLOCK_R=64, BLOCK_N=16, BLOCK_K=128, ONE_CHUNK=False, PDL=True,
            LOOP_STAGES=4, SPLIT_K=1, SUM_GROUP=1, TMA_W=False, TMA_X=False)  # fmt: skip
GEMV_CASES = {
    "projection": {"K": 2048, "HAS_INDEX": True, "HAS_BIAS": True},
    # split K (`GemvConfig.split_k`): the last slice in sums the partials, then each epilogue
    "split-k": {"K": 3072, "LOOP_STAGES": 2, "SPLIT_K": 4, "SUM_GROUP": 4},
    "split-k-gate-up": {"BLOCK_N": 16, "LOOP_STAGES": 2, "SPLIT_K": 4, "SILU_MUL": True, "SUM_GROUP": 4},
}
GEMV_POINTERS = {"index_ptr": "*i64", "part_ptr": "*fp32", "count_ptr": "*i32", "x_desc": "*bf16", "w_desc": "*bf16"}


def _fits(info: dict[str, Any]) -> None:
    assert 0 < info["registers"] <= 255 and info["spills"] == 0
    assert 0 < info["shared"] <= 227 * 1024


@pytest.mark.parametrize("case", list(GEMV_CASES))
def test_the_tensor_core_gemv_compiles_in_its_pdl_forms(case: str) -> None:
    from engine.fast.kernels.gemv import _gemv_kernel

    constants = {**GEMV, "DTYPE": triton.language.bfloat16, **GEMV_CASES[case]}
    _fits(compile_for(_gemv_kernel, constants, GEMV_POINTERS))


def _wide_tiles() -> dict[str, tuple[int, int, Any, bool]]:
    """frame_variants' wide tiles at full size: name -> (token rows, K, tile, projection epilogue)."""
    from tools import frame_variants

    tiles = {}
    cp = frame_variants.frame_kernels("wide64_128").dot_gemv
    k_of = {**{name: k for name, (_, k) in frame_variants.CP_SHAPES.items()}, "gate_up": 1024}
    for rows in (64, 128):
        for name, tile in cp[rows].items():
            tiles[f"cp-{name}-{rows}"] = (rows, k_of[name], tile, name == "proj")
    tiles["cp-gate_up-split"] = (64, 1024, frame_variants.frame_kernels("wide64_gu").dot_gemv[64]["gate_up"], False)
    for columns in (64, 128):
        wide = dict(frame_variants.talker_options(f"talker_wide{columns}")[3])[64]
        for name, (_, k) in frame_variants.TALKER_SHAPES.items():
            tiles[f"talker-{name}-{columns}"] = (64, k, getattr(wide, name), False)
    gate_up = dict(frame_variants.talker_options("talker_wide64_gu")[3])[64].gate_up
    tiles["talker-gate_up-split"] = (64, 2048, gate_up, False)
    return tiles


@pytest.mark.parametrize("name", list(_wide_tiles()))
def test_the_wide_split_tiles_compile_without_spilling(name: str) -> None:
    """`tools/frame_variants.py`'s wide64 / talker_wide variants (64-128 columns a program, K in up to 8 slices, the
    last slice program reading up to 4 slices' partials at once) fit an SM's registers and shared memory."""
    from engine.fast.kernels.gemv import _gemv_kernel, launch_tile, sum_group

    rows, k, tile, projection = _wide_tiles()[name]
    silu = "gate_up" in name
    use_dot, block_r, block_n, block_k = launch_tile(rows, k, tile)
    constants = {**GEMV, "DTYPE": triton.language.bfloat16, "K": k, "HAS_INDEX": projection, "HAS_BIAS": projection,
                 "SILU_MUL": silu, "USE_DOT": use_dot, "BLOCK_R": block_r, "BLOCK_N": block_n, "BLOCK_K": block_k,
                 "LOOP_STAGES": tile.loop_stages, "SPLIT_K": tile.split_k,
                 "SUM_GROUP": sum_group(tile.split_k, block_r * block_n * (2 if silu else 1), tile.num_warps)}  # fmt: skip
    _fits(compile_for(_gemv_kernel, constants, GEMV_POINTERS, num_warps=tile.num_warps,
                      aligned=("stride_x", "stride_res", "stride_out")))  # fmt: skip


@pytest.mark.parametrize("gathered", [False, True], ids=["bulk-x", "gathered-x"])
def test_the_bulk_copy_products_load_their_tiles_by_tma(gathered: bool) -> None:
    """`GemvConfig.tma` at 64 rows (the talker's down in a wide split tile; a gathered projection): the weight's
    tiles, and the activations' unless gathered, as TMA loads (UTMALDG) in place of 16-byte copies (LDGSTS)."""
    from engine.fast.kernels.gemv import _gemv_kernel

    constants = {**GEMV, "DTYPE": triton.language.bfloat16, "K": 6144, "BLOCK_N": 64, "SPLIT_K": 4, "SUM_GROUP": 4,
                 "HAS_INDEX": gathered, "TMA_W": True, "TMA_X": not gathered}  # fmt: skip
    pointers = {**GEMV_POINTERS, "w_desc": "tensordesc<bf16[64,128]>"}
    if not gathered:
        pointers["x_desc"] = "tensordesc<bf16[64,128]>"
    info = compile_for(_gemv_kernel, constants, pointers, census=True, aligned=("stride_x", "stride_res", "stride_out"))
    _fits(info)
    assert info.get("UTMALDG", 0) > 0 and (info.get("LDGSTS", 0) > 0) == gathered


def test_the_talker_draw_compiles_in_one_kernel() -> None:
    """`kernels.talker_draw` at the talker's vocabulary (3072 ids: 4096-wide rows) and warps, the engine's radix."""
    from engine.fast.kernels.talker_draw import _talker_draw_kernel, row_warps

    constants = dict(CAP=64, GROUPS=16, MIN_NEW=2, RADIX_BITS=2, PRECISE=True, BLOCK_V=4096)
    pointers = {"index_ptr": "*i64", "frames_ptr": "*i64", "eos_never_ptr": "*i1", "seen_ptr": "*i1",
                "generated_ptr": "*i64", "penalty_ptr": "*fp32", "greedy_ptr": "*i1", "temp_ptr": "*fp32",
                "topk_ptr": "*i64", "seeds_ptr": "*i64", "code0_ptr": "*i64", "out_ptr": "*i64"}  # fmt: skip
    info = compile_for(_talker_draw_kernel, constants, pointers, num_warps=row_warps(3072))
    assert 0 < info["registers"] <= 255 and info["spills"] == 0


def test_the_frames_input_and_output_kernels_compile() -> None:
    from engine.fast.kernels.frame_io import _frame_end_kernel, _frame_start_kernel

    ints = {name: "*i64" for name in ("index_ptr", "code0_ptr", "frame_ptr", "stream_ptr", "frames_ptr", "codes_ptr")}
    start = compile_for(_frame_start_kernel, {"BLOCK_H": 2048}, {**ints, "acc_ptr": "*fp32"})
    end = compile_for(_frame_end_kernel, {"BLOCK_H": 2048, "BLOCK_G": 16, "DTYPE": triton.language.bfloat16},
                      {**ints, "acc_ptr": "*fp32"})  # fmt: skip
    assert all(0 < info["registers"] <= 255 and info["spills"] == 0 for info in (start, end))


def test_rms_norm_compiles_as_a_programmatic_dependent() -> None:
    from engine.fast.kernels.rmsnorm import _rms_norm_kernel

    info = compile_for(_rms_norm_kernel, dict(HAS_RESIDUAL=True, BLOCK=1024, PDL=True))
    assert 0 < info["registers"] <= 255 and info["spills"] == 0


@pytest.mark.parametrize("per_head", [False, True], ids=["broadcast", "per-head"])
@pytest.mark.parametrize("tokens", [1, 2], ids=["lookup-step", "first-step"])
def test_the_attention_compiles_with_its_early_cache_loads(tokens: int, per_head: bool) -> None:
    from engine.fast.kernels.cp_attention import _cp_attention_kernel

    constants = dict(T=tokens, H=16, K=8, G=2, GP=2, D=128, BLOCK_L=16, DTYPE=triton.language.bfloat16, PDL=True,
                     EARLY=True, PER_HEAD=per_head, HW=True, QSPLIT=1)  # fmt: skip
    _fits(compile_for(_cp_attention_kernel, constants))
    if per_head:  # each kv head's query heads over two 1-warp programs
        info = compile_for(_cp_attention_kernel, {**constants, "QSPLIT": 2}, num_warps=1)
        assert 0 < info["registers"] <= 255 and info["spills"] == 0  # (one warp: no shared memory at all)


@pytest.mark.parametrize("radix_bits", [2, 8])  # 8: the byte-wise radix select, with its histograms
def test_the_sampler_compiles_with_its_timeline(radix_bits: int) -> None:
    from engine.fast.kernels.sampler import TIMELINE_STAGES, _sample_kernel

    constants = dict(CAP=64, GROUPS=16, RADIX_BITS=radix_bits, ACCUMULATE=True, PRECISE=True, BLOCK_V=2048, BLOCK_H=1024,
                     PDL=True, TIMELINE=TIMELINE_STAGES)  # fmt: skip
    pointers = {"greedy_ptr": "*i1", "temp_ptr": "*fp32", "topk_ptr": "*i64", "seeds_ptr": "*i64",
                "frames_ptr": "*i64", "out_ptr": "*i64", "acc_ptr": "*fp32", "stamps_ptr": "*i64"}  # fmt: skip
    info = compile_for(_sample_kernel, constants, pointers, num_warps=8)
    assert 0 < info["registers"] <= 255 and info["spills"] == 0


def test_the_talker_attention_compiles_as_programmatic_dependents_at_no_extra_cost() -> None:
    """(The split kernel spills at 4 warps with or without PDL, compiled by Triton 3.9: its resources are compared
    with its plain launch's, not bounded.) Merging in the last program to finish (`SplitConfig.merge_last`) costs
    no more than storing the partial for a merge kernel."""
    from engine.fast.kernels.decode_attention import (
        BLOCK_N,
        TIMELINE_STAGES,
        _merge_kernel,
        _split_rope_kernel,
    )

    pointers = {"slots_ptr": "*i64", "lengths_ptr": "*i64", "m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32",
                "count_ptr": "*i32"}  # fmt: skip
    split = dict(H=16, KV=8, G=2, GP=16, D=128, SPLITS=16, CHUNK=128, BLOCK=BLOCK_N, PRECISION="tf32",
                 INTERLEAVED=False, MERGE_LAST=False, Q_HEADS=False, TIMELINE=0, TMA=False)  # fmt: skip
    chained, plain = (compile_for(_split_rope_kernel, {**split, "PDL": pdl}, pointers) for pdl in (True, False))
    assert chained["spills"] <= plain["spills"] and chained["shared"] == plain["shared"]
    merging = compile_for(_split_rope_kernel, {**split, "PDL": True, "MERGE_LAST": True}, pointers)
    assert merging["spills"] <= plain["spills"] and merging["shared"] == plain["shared"]
    # interleaved splits (`SplitConfig.programs`): 4 programs a (row, kv head), 32-key blocks, merged by the last
    for merge_last in (False, True):
        interleaved = compile_for(_split_rope_kernel, {**split, "PDL": True, "INTERLEAVED": True, "SPLITS": 4,
                                                       "CHUNK": 32, "BLOCK": 32, "MERGE_LAST": merge_last}, pointers)
        assert 0 < interleaved["registers"] <= 255 and interleaved["spills"] == 0
    heads = compile_for(_split_rope_kernel, {**split, "PDL": True, "Q_HEADS": True}, pointers)  # the real heads only
    assert heads["spills"] <= plain["spills"] and heads["shared"] == plain["shared"]
    # the in-kernel timeline (`decode_attention_rope(timeline=...)`: %globaltimer, %smid) compiles, no spills at the
    # talker's 64-row configuration
    timed = compile_for(_split_rope_kernel, {**split, "PDL": True, "Q_HEADS": True, "INTERLEAVED": True, "SPLITS": 2,
                                             "CHUNK": 32, "BLOCK": 32, "TIMELINE": TIMELINE_STAGES},
                        {**pointers, "stamps_ptr": "*i64"}, aligned=("stride_s", "stride_k", "stride_l"))  # fmt: skip
    assert timed["spills"] == 0
    # whole key blocks as bulk tensor copies (`SplitConfig.tma`): TMA loads in the SASS, no spills
    descriptor = "tensordesc<bf16[1,1,32,128]>"
    bulk = compile_for(_split_rope_kernel, {**split, "PDL": True, "Q_HEADS": True, "INTERLEAVED": True, "SPLITS": 2,
                                            "CHUNK": 32, "BLOCK": 32, "TMA": True},
                       {**pointers, "k_desc": descriptor, "v_desc": descriptor},
                       aligned=("stride_s", "stride_k", "stride_l"), census=True)  # fmt: skip
    assert bulk["spills"] == 0 and bulk.get("UTMALDG", 0) > 0
    merge = compile_for(_merge_kernel, dict(H=16, SPLITS=16, CHUNK=128, D=128, PDL=True), pointers)
    assert 0 < merge["registers"] <= 255 and merge["spills"] == 0


def test_the_attention_forms_that_claim_fewer_instructions_have_them() -> None:
    """The per-head code-predictor attention and the talker's real-heads-only q norm are there to cut the SASS a
    program issues (`tools/kernel_compile.py` prints the census); each must stay below the form it replaces."""
    from tools.kernel_compile import attention_census

    census = {name: info["instructions"] for name, _, info in attention_census()}
    for warps in ("4 warps", "2 warps", "1 warp"):
        assert census[f"cp_attention per-head, {warps}"] < census[f"cp_attention broadcast, {warps}"]
    assert census["talker split+rope, q heads, 4 warps"] < census["talker split+rope, 4 warps"]
