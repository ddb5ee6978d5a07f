"""The code predictor's kernels (gemv with its prologues and epilogues, the fused attention, the one-kernel
sampler) equal their PyTorch twins in Triton's CPU interpreter (fp32, tiny shapes, NaN-poisoned outputs and
caches), the tensor-core path of the gemv included, and the sampler keeps exactly the top-k tokens.
A subprocess: the interpreter is chosen when the kernels are defined, so TRITON_INTERPRET must come first."""

from __future__ import annotations

import pytest

from tests.fast.helpers import run_interpreted

pytest.importorskip("triton")


KERNELS = """
import json, torch
from engine.fast.kernels import use_triton
from engine.fast.kernels.cp_selfcheck import check_cp_kernels
from engine.fast.kernels.gemv import GemvConfig
assert use_triton(torch.zeros(1)), "interpreter mode not active"
configs = {"qkv": GemvConfig(block_n=8, block_k=32), "down": GemvConfig(block_n=16, block_k=64, use_dot=True),
           "o": GemvConfig(block_n=4, block_k=16, use_dot=False),
           "gate_up": GemvConfig(block_n=8, block_k=16, loop_stages=2),  # the runtime K loop: prologue + SwiGLU
           "head": GemvConfig(block_n=8, block_k=16, loop_stages=1),
           "split": GemvConfig(block_n=8, block_k=16, use_dot=True, loop_stages=2, split_k=2)}  # K 32 or 64: 1-2 tiles a slice
print(json.dumps(check_cp_kernels("cpu", torch.float32, hidden=32, input_size=48, heads=4, kv_heads=2,
                                  head_dim=16, inter=80, vocab=300, rows=(1, 3, 17), configs=configs)))
"""

TOP_K = """
import json, torch
from engine.fast.kernels.sampler import sample
from engine.model.rng import seed_tensor
rows, vocab = 96, 200
gen = torch.Generator().manual_seed(3)
scores = torch.randn(1, vocab, generator=gen).repeat(rows, 1) * 0.3  # flat: every kept token gets drawn
top_k = torch.tensor([1, 3, 5])[torch.arange(rows) % 3]
tokens = sample(scores, torch.zeros(rows, dtype=torch.bool), torch.ones(rows, 1), top_k, 64,
                seed_tensor(list(range(rows)), "cpu"), torch.arange(rows), 4)
order = scores[0].argsort(descending=True)
rank = torch.empty(vocab, dtype=torch.int64)
rank[order] = torch.arange(vocab)
print(json.dumps({"ranks": rank[tokens].tolist(), "top_k": top_k.tolist()}))
"""


def test_code_predictor_kernels_match_their_twins_in_the_interpreter() -> None:
    errors = run_interpreted(KERNELS, timeout_s=600)
    kinds = ("proj", "qkv", "qkv_first", "o", "gate_up", "down", "head")
    expected = {f"gemv_{k}_r{r}" for k in kinds for r in (1, 3, 17)}
    expected |= {f"cp_attention_p{p}_r{r}" for p in (0, 7, 15) for r in (1, 3, 17)}
    expected |= {f"cp_attention_early_p7_r{r}" for r in (1, 3, 17)}  # earlier positions loaded before the PDL wait
    expected |= {f"cp_attention_per_head_p{p}_r{r}" for p in (0, 15) for r in (1, 3, 17)}  # one query head at a time
    expected |= {f"cp_attention_query_split_p{p}_r{r}" for p in (0, 7) for r in (1, 3, 17)}  # over two programs
    split = ("split_o1", "split_o2", "split_gate_up")  # split K, run twice, under each epilogue
    expected |= {f"gemv_{k}_r{r}" for k in split for r in (1, 3, 17)}
    expected |= {f"{name}_r{r}" for name in ("sampler", "sampler_acc") for r in (1, 3, 17)}
    assert set(errors) == expected
    for name, error in errors.items():
        limit = 0.0 if name.startswith("sampler_r") else 1e-5
        assert error <= limit, f"{name}: {error}"


def test_the_fused_sampler_draws_only_inside_the_top_k_and_reaches_all_of_it() -> None:
    result = run_interpreted(TOP_K, timeout_s=600)
    ranks, top_k = result["ranks"], result["top_k"]
    for k in (1, 3, 5):
        drawn = {rank for rank, row_k in zip(ranks, top_k, strict=True) if row_k == k}
        assert drawn == set(range(k)), f"top_k {k}: ranks drawn {sorted(drawn)}"


FRAME_PATHS = """
import copy, json, torch
from engine.executors.code_predictor import CodePredictorExecutor
from engine.executors.slots import new_code_buffer
from engine.fast.code_predictor_graph import CodePredictorGraphs, FrameKernels
from engine.model.weights import load_model
from tests.fast.test_code_predictor_graph import _slots
torch.set_num_threads(1)
model = load_model("tiny")
plain_slots = _slots(model, 4)
fast_slots = copy.deepcopy(plain_slots)
plain_codes, fast_codes = new_code_buffer(4, 2, model.device), new_code_buffer(4, 2, model.device)
# 2 frame rows: the first step's 4 token rows go to cuBLAS with the norm kernel, later steps' 2 rows to
# gemv with the norm apart; the default frame covers the norm prologue.
kernels = FrameKernels(gemv_max_rows=2, prologue_max_rows=1)
CodePredictorGraphs(model, fast_slots, fast_codes, (2,), kernels=kernels).predict([3, 1], [0, 2], [1, 0])
CodePredictorExecutor(model, plain_slots, plain_codes, max_batch=2).predict([3, 1], [0, 2], [1, 0])
print(json.dumps({"codes": bool(torch.equal(fast_codes, plain_codes)), "written": bool(fast_codes.ne(0).any()),
                  "embed": float((fast_slots.frame_embed - plain_slots.frame_embed).abs().max())}))
"""


def test_the_fused_frame_with_norms_apart_and_cublas_products_equals_the_plain_executor() -> None:
    result = run_interpreted(FRAME_PATHS, timeout_s=600)
    assert result["codes"] and result["written"]
    assert result["embed"] < 1e-5


FRAME_WIDE = """
import copy, json, sys, torch
from dataclasses import replace
from engine.fast.kernels.gemv import GemvConfig
from engine.executors.code_predictor import CodePredictorExecutor
from engine.executors.slots import new_code_buffer
from engine.fast.code_predictor_graph import CodePredictorGraphs, FrameKernels
from engine.model.weights import load_model
from tests.fast.test_code_predictor_graph import _slots
torch.set_num_threads(1)
model = load_model("tiny")
rows, norms = int(sys.argv[1]), sys.argv[2]
plain_slots = _slots(model, rows)
fast_slots = copy.deepcopy(plain_slots)
plain_codes, fast_codes = new_code_buffer(rows, 2, model.device), new_code_buffer(rows, 2, model.device)
kernels = FrameKernels()
assert all(map(kernels.runs_gemv, (4, 8, 16, 32, 64))) and not kernels.runs_gemv(128)
if norms == "cublas_small":  # the 4- and 8-row steps in cuBLAS with `rms_norm` kernels
    kernels = replace(kernels, dot_gemv={r: tiles for r, tiles in kernels.dot_gemv.items() if r > 8})
if norms == "split":  # every product in 2 K slices (the tiny model's K: 32 or 64)
    split = GemvConfig(block_n=16, block_k=16, loop_stages=2, split_k=2)
    kernels = replace(kernels, dot_gemv={r: dict.fromkeys(tiles, split) for r, tiles in kernels.dot_gemv.items()})
order = list(range(rows))
CodePredictorGraphs(model, fast_slots, fast_codes, (rows,), kernels=kernels).predict(order, order, [1] * rows)
CodePredictorExecutor(model, plain_slots, plain_codes, max_batch=rows).predict(order, order, [1] * rows)
print(json.dumps({"codes": bool(torch.equal(fast_codes, plain_codes)), "written": bool(fast_codes.ne(0).any()),
                  "embed": float((fast_slots.frame_embed - plain_slots.frame_embed).abs().max())}))
"""


@pytest.mark.parametrize(("rows", "norms"), [(8, "kernels"), (8, "cublas_small"), (16, "split")])
def test_the_fused_frame_with_tensor_core_products_equals_the_plain_executor(rows: int, norms: str) -> None:
    """8 frame rows: the first step's 16 token rows run the default tensor-core `gemv` tiles, the later 8-row steps
    the same tiles with the rows masked (or, `cublas_small`, cuBLAS); 16 frame rows: every step in `gemv` (32 and 16
    token rows), the norms in `rms_norm` kernels; products in split-K tiles (`GemvConfig.split_k`)."""
    result = run_interpreted(FRAME_WIDE, timeout_s=600, args=(str(rows), norms))
    assert result["codes"] and result["written"]
    assert result["embed"] < 1e-5


SPLIT_GROUPS = """
import json, torch
import engine.fast.kernels.gemv as gemv_module
from engine.fast.kernels.gemv import GemvConfig, gemv, gemv_reference, launch_tile
gen = torch.Generator().manual_seed(5)
x = torch.randn(17, 128, generator=gen)
results = {}
for silu in (False, True):
    weight = torch.randn(48 if silu else 24, 128, generator=gen) * 0.1
    truth = gemv_reference(x, weight, silu_mul=silu)[0]
    config = GemvConfig(block_n=8, block_k=16, use_dot=True, loop_stages=2, split_k=8)  # 8 slices of one tile
    _, block_r, block_n, _ = launch_tile(17, 128, config)
    tile_values = block_r * block_n * (2 if silu else 1)
    for slices in (1, 2, 4, 8):  # partials in flight a thread: 1, 2, 4 or all 8 slices' at once
        gemv_module.SUM_VALUES = slices * tile_values // 128
        group = gemv_module.sum_group(8, tile_values, 4)
        assert group == slices, (group, slices)
        out = torch.full((17, weight.shape[0] // (2 if silu else 1)), float("nan"))
        for _ in range(2):  # twice: the arrival counts are zero again after a launch
            gemv(x, weight, config=config, silu_mul=silu, out=out)
        results[f"{'silu' if silu else 'plain'}_g{group}"] = out.clone()
        results[f"truth_{'silu' if silu else 'plain'}"] = truth
print(json.dumps({name: value.tolist() for name, value in results.items()}))
"""


def test_a_split_products_slices_sum_the_same_whichever_many_are_read_at_once() -> None:
    """`gemv` in 8 K slices: the last slice program reads the partials 1, 2, 4 or 8 slices at a time
    (`sum_group`), always adding them in slice order, so every grouping gives bitwise the same product, and that
    product is the twin's (fp32 in Triton's interpreter; plain and SwiGLU epilogues)."""
    import torch

    results = {name: torch.tensor(value) for name, value in run_interpreted(SPLIT_GROUPS, timeout_s=600).items()}
    for kind in ("plain", "silu"):
        groups = {name: value for name, value in results.items() if name.startswith(f"{kind}_g")}
        assert set(groups) == {f"{kind}_g{g}" for g in (1, 2, 4, 8)}
        first = groups[f"{kind}_g1"]
        assert all(torch.equal(value, first) for value in groups.values())
        torch.testing.assert_close(first, results[f"truth_{kind}"], rtol=1e-5, atol=1e-5)


TMA = """
import json, torch
from dataclasses import replace
from engine.fast.kernels.gemv import GemvConfig, gemv, gemv_reference
gen = torch.Generator().manual_seed(5)
errors, same = {}, {}
for rows in (3, 17):  # 3: a 16-row tile, its last 13 rows past the activations' end (read as zeros)
    x = torch.randn(rows, 128, generator=gen)
    for silu in (False, True):
        for n in (24, 40):  # 40: the last 16-column tile ends past N (with SwiGLU: in the up half)
            weight = torch.randn(2 * n if silu else n, 128, generator=gen) * 0.1
            for split in (1, 4):
                tile = GemvConfig(block_n=16, block_k=16, use_dot=True, loop_stages=2, split_k=split)
                bulk = gemv(x, weight, config=replace(tile, tma=True), silu_mul=silu)[0]
                name = f"r{rows}_silu{int(silu)}_n{n}_s{split}"
                errors[name] = float((bulk - gemv_reference(x, weight, silu_mul=silu)[0]).abs().max())
                same[name] = bool(torch.equal(bulk, gemv(x, weight, config=tile, silu_mul=silu)[0]))
    index = torch.arange(rows).flip(0)  # a gathered x: the weight alone through its descriptor
    weight, bias = torch.randn(24, 128, generator=gen) * 0.1, torch.randn(24, generator=gen)
    tile = GemvConfig(block_n=16, block_k=16, use_dot=True, loop_stages=2, split_k=2, tma=True)
    bulk = gemv(x, weight, index=index, bias=bias, config=tile)[0]
    errors[f"r{rows}_index"] = float((bulk - gemv_reference(x, weight, index=index, bias=bias)[0]).abs().max())
try:  # bulk copies feed the pipelined tensor-core loop only
    gemv(x, weight, config=GemvConfig(block_n=16, block_k=16, use_dot=True, tma=True))
    refused = False
except ValueError:
    refused = True
print(json.dumps({"errors": errors, "same": same, "unrolled_refused": refused}))
"""


def test_products_through_bulk_tensor_copies_equal_the_pointer_loads() -> None:
    """`GemvConfig.tma`: the weight's and the activations' tiles through tensor descriptors (Triton's interpreter,
    fp32): the twin's product, bitwise the pointer-load tiles', with rows past the activations' end, a last column
    tile past N (and into gate|up's up half), K in slices, and a gathered x (the weight alone by descriptor); an
    unrolled K loop refuses them."""
    result = run_interpreted(TMA, timeout_s=600)
    assert len(result["errors"]) == 18 and all(error <= 1e-5 for error in result["errors"].values()), result
    assert len(result["same"]) == 16 and all(result["same"].values()), result["same"]
    assert result["unrolled_refused"]


FRAME_IO = """
import json, sys, torch
from engine.fast.kernels.frame_io import frame_end, frame_end_reference, frame_start, frame_start_reference
dtype = getattr(torch, sys.argv[1])
gen = torch.Generator().manual_seed(9)
slots, hidden, vocab, groups, streams = 7, 48, 40, 16, 5
index = torch.tensor([3, 0, 6, 2, 2])  # the last row a padded duplicate of the one before
state = {"hidden": torch.randn(slots, hidden, generator=gen).to(dtype),
         "code0": torch.randint(0, vocab, (slots,), generator=gen),
         "table": torch.randn(vocab, hidden, generator=gen).to(dtype)}
same = {}
outs = []
for start, end in ((frame_start, frame_end), (frame_start_reference, frame_end_reference)):
    x = torch.full((10, hidden), float("nan"), dtype=dtype)
    frame = torch.full((5, groups), -1, dtype=torch.int64)
    acc = torch.full((5, hidden), float("nan"))
    start(index, state["hidden"], state["code0"], state["table"], x, frame, acc)
    frame[:, 1:] = torch.randint(0, vocab, (5, groups - 1), generator=torch.Generator().manual_seed(2))
    frame[4] = frame[3]
    acc += 0.123456789  # more bits than the model's dtype holds: the cast rounds
    codes = torch.full((streams, 3, groups), -7, dtype=torch.int64)
    embed = torch.full((slots, hidden), float("nan"), dtype=dtype)
    end(index, torch.tensor([1, 4, 0, 2, 2]), torch.tensor([2, 0, 1, 1, 1]), frame, acc, codes, embed)
    outs.append([x, frame, acc, codes, embed])
print(json.dumps({name: torch.equal(a.nan_to_num(), b.nan_to_num()) for name, a, b in
                  zip(("x", "frame", "acc", "codes", "frame_embed"), *outs)}))
"""


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_frames_inputs_and_outputs_in_one_kernel_each_equal_their_twins(dtype: str) -> None:
    """`frame_start` / `frame_end` (Triton's interpreter) write bitwise what the gathers, stack and index_puts they
    replace write, the fp32 sum rounded to the model's dtype as `Tensor.to` rounds, a padded duplicate row included."""
    assert run_interpreted(FRAME_IO, args=(dtype,)) == dict.fromkeys(("x", "frame", "acc", "codes", "frame_embed"), True)
