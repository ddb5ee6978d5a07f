"""Each Triton kernel of the talker and code-predictor fast path equals its PyTorch twin (fp32, Triton's
CPU interpreter, tiny shapes), poisoned caches included. Run in a subprocess: the interpreter is chosen
when the kernels are defined, so TRITON_INTERPRET must be set before they are imported."""

from __future__ import annotations

import json

import pytest

from tests.fast.helpers import run_interpreted

pytest.importorskip("triton")

SCRIPT = """
import json, torch
from engine.fast.kernels import use_triton
from engine.fast.kernels.selfcheck import check_kernels
assert use_triton(torch.zeros(1)), "interpreter mode not active"
print(json.dumps(check_kernels("cpu", torch.float32, hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96,
                               rows=5, max_len=200, vocab=300)))
"""


def test_every_kernel_matches_its_twin_in_the_triton_interpreter() -> None:
    errors = run_interpreted(SCRIPT)
    assert set(errors) == {"rms_norm", "rms_norm_no_residual", "silu_mul", "qk_norm_rope", "decode_attention",
                           "talker_draw"}
    for name, error in errors.items():
        assert error < 1e-5, f"{name}: relative error {error}"


SPLITS_SCRIPT = """
import json, torch
from engine.fast.kernels import use_triton
from engine.fast.kernels.decode_attention import (
    SplitConfig, decode_attention, decode_attention_reference, split_layout,
)
assert use_triton(torch.zeros(1)), "interpreter mode not active"
torch.manual_seed(0)
max_len, kv_heads, heads, d = 600, 2, 4, 16
config = SplitConfig(**json.loads(CONFIG))
splits, chunk = split_layout(max_len, config)
lengths = torch.tensor([1, 63, 64, 65, chunk - 1, chunk, chunk + 1, 2 * chunk + 1, max_len - 1, max_len])
rows = len(lengths)
k, v = torch.randn(rows + 1, kv_heads, max_len, d), torch.randn(rows + 1, kv_heads, max_len, d)
slots = torch.randperm(rows + 1)[:rows]
k_poisoned, v_poisoned = k.clone(), v.clone()
for b in range(rows):  # keys and values past a row's length are never read
    k_poisoned[slots[b], :, int(lengths[b]):] = float("nan")
    v_poisoned[slots[b], :, int(lengths[b]):] = float("nan")
q = torch.randn(rows, heads, d)
ours = decode_attention(q, k_poisoned, v_poisoned, slots, lengths, config)
again = decode_attention(q, k_poisoned, v_poisoned, slots, lengths, config)  # the arrival counts were zeroed
theirs = decode_attention_reference(q, k, v, slots, lengths)
print(json.dumps({"splits": splits, "chunk": chunk, "error": float((ours - theirs).norm() / theirs.norm()),
                  "repeats": bool(torch.equal(ours, again))}))
"""


@pytest.mark.parametrize(
    "config",
    [{}, {"keys_per_split": 64}, {"keys_per_split": 128, "block_n": 32, "num_stages": 2},
     {"programs": 4, "block_n": 32}, {"programs": 2}, {"merge_last": True},
     {"programs": 4, "block_n": 32, "merge_last": True}, {"programs": 1, "block_n": 32}],
    ids=["256-key-splits", "64-key-splits", "32-key-steps", "interleaved-4", "interleaved-2", "merge-last",
         "interleaved-4-merge-last", "one-program"],
)
def test_decode_attention_over_several_splits_reads_each_row_up_to_its_length_only(config: dict) -> None:
    """Rows ending at, just before and just after split and block boundaries, up to the cache's capacity, for
    split configurations `tools/attention_bench.py` sweeps: contiguous splits, or (`programs`) interleaved ones,
    program p taking key blocks p, p + P, ...; the splits merged by a merge kernel, or by the last program of each
    (row, kv head) to finish (twice in a row: it leaves the arrival counts at zero), or by nothing (`programs` 1:
    each program writes its output)."""
    result = run_interpreted(f"CONFIG = {json.dumps(json.dumps(config))}\n" + SPLITS_SCRIPT)
    block = config.get("block_n", 64)
    if "programs" in config:
        assert result["splits"] == config["programs"] and result["chunk"] == block
    else:
        assert result["splits"] >= 4 and result["chunk"] % block == 0  # several splits of whole blocks
    assert result["error"] < 1e-5, result
    assert result["repeats"]


ROPE_SCRIPT = """
import json, torch
from engine.fast.kernels import use_triton
from engine.fast.kernels.decode_attention import SplitConfig, decode_attention_reference, decode_attention_rope
from engine.fast.kernels.qk_norm_rope import qk_norm_rope_reference
assert use_triton(torch.zeros(1)), "interpreter mode not active"
torch.manual_seed(0)
max_len, kv_heads, heads, d = 300, 2, 4, 16
lengths = torch.tensor([1, 2, 64, 65, 128, 129, 200, 300, 65])  # the last row repeats the fourth: a padded row
rows = len(lengths)
slots = torch.tensor([5, 0, 3, 7, 1, 2, 6, 4, 7])
qkv = torch.randn(rows, (heads + 2 * kv_heads) * d)
cos, sin = torch.randn(rows, d), torch.randn(rows, d)
qkv[-1], cos[-1], sin[-1] = qkv[3], cos[3], sin[3]  # padding repeats a row whole
q_w, k_w = 1 + 0.1 * torch.randn(d), 1 + 0.1 * torch.randn(d)
k_ref, v_ref = torch.randn(8, kv_heads, max_len, d), torch.randn(8, kv_heads, max_len, d)
k, v = k_ref.clone(), v_ref.clone()
for b in range(rows):  # the new position and everything after it: nothing may read them before writing
    k[slots[b], :, int(lengths[b]) - 1:] = float("nan")
    v[slots[b], :, int(lengths[b]) - 1:] = float("nan")
q = qk_norm_rope_reference(qkv, cos, sin, q_w, k_w, 1e-6, k_ref, v_ref, slots, lengths - 1, heads, kv_heads)
theirs = decode_attention_reference(q, k_ref, v_ref, slots, lengths)
ours = decode_attention_rope(qkv, cos, sin, q_w, k_w, 1e-6, k, v, slots, lengths, heads, kv_heads,
                             SplitConfig(**json.loads(CONFIG)))
written = torch.stack([torch.stack((k[s, :, n - 1], v[s, :, n - 1])) for s, n in zip(slots, lengths.tolist())])
expected = torch.stack([torch.stack((k_ref[s, :, n - 1], v_ref[s, :, n - 1])) for s, n in zip(slots, lengths.tolist())])
print(json.dumps({"error": float((ours - theirs).norm() / theirs.norm()),
                  "cache_error": float((written - expected).norm() / expected.norm()),
                  "finite": bool(ours.isfinite().all())}))
"""


@pytest.mark.parametrize("config", [{"keys_per_split": 64}, {"programs": 4, "block_n": 32},
                                    {"programs": 4, "block_n": 32, "merge_last": True},
                                    {"programs": 2, "block_n": 32, "q_heads": False},
                                    {"programs": 1, "block_n": 32}, {"keys_per_split": 64, "tma": True},
                                    {"programs": 2, "block_n": 16, "tma": True}],
                         ids=["64-key-splits", "interleaved-4", "interleaved-4-merge-last",
                              "whole-query-tile", "one-program", "tma", "interleaved-2-tma"])  # fmt: skip
def test_attention_with_the_qk_norm_and_rope_folded_in_equals_the_two_kernels_it_replaces(config: dict) -> None:
    """Every row's new key and value reach the cache (poisoned there before the call) as `qk_norm_rope` writes
    them, and attention over chunks that end at, before and after split boundaries reads them (interleaved: the
    program whose blocks hold the new position writes it)."""
    result = run_interpreted(f"CONFIG = {json.dumps(json.dumps(config))}\n" + ROPE_SCRIPT)
    assert result["finite"], result
    assert result["error"] < 1e-5 and result["cache_error"] < 1e-6, result


CHAINED_SCRIPT = """
import json, torch
from engine.fast.decoder import ChainTiles, fuse_layers, rope_tables, run_layers, run_layers_chained
from engine.fast.kernels import use_triton
from engine.fast.kernels.decode_attention import decode_attention_rope
from engine.fast.kernels.gemv import GemvConfig
from engine.model.weights import load_model
assert use_triton(torch.zeros(1)), "interpreter mode not active"
torch.manual_seed(0)
model = load_model("tiny")
talker = model.talker
layers = fuse_layers(talker.model.layers)
rows = 16  # tensor-core gemv tiles from 16 rows
forms = {"plain": None, "chained": ChainTiles(),
         "down_tile": ChainTiles(down=GemvConfig(block_n=16, block_k=128, loop_stages=2))}
split = GemvConfig(block_n=16, block_k=16, loop_stages=2, split_k=2)  # every product in two K slices
forms["split"] = ChainTiles(qkv=split, o=split, gate_up=split, down=split)
caches = {name: talker.new_cache(rows, 32) for name in forms}
for cache in caches.values():
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=torch.Generator().manual_seed(1)))
index = torch.arange(rows)
positions = torch.randint(3, 30, (rows,), generator=torch.Generator().manual_seed(2))
x = torch.randn(rows, model.config.talker.hidden_size, generator=torch.Generator().manual_seed(3))
cos, sin = rope_tables(talker.rotary, positions, x.dtype)
outs = {}
for name, tiles in forms.items():
    per_layer = [caches[name].layer(i) for i in range(len(layers))]
    def attend_qkv(layer, qkv, per_layer=per_layer, chained=tiles is not None):
        fused = layers[layer]
        return decode_attention_rope(qkv, cos, sin, fused.q_norm, fused.k_norm, fused.eps, *per_layer[layer], index,
                                     positions + 1, fused.num_heads, fused.num_kv_heads, pdl=chained).view(rows, -1)
    norm = talker.model.norm.weight
    if tiles is not None:
        outs[name] = run_layers_chained(layers, x, norm, attend_qkv, tiles)
    else:
        outs[name] = run_layers(layers, x, norm, cos, sin, per_layer, index, positions, None, attend_qkv)
print(json.dumps({name: {"error": float((outs[name] - outs["plain"]).norm() / outs["plain"].norm()),
                         "kv_error": float((caches[name].kv - caches["plain"].kv).abs().max())}
                  for name in forms if name != "plain"}))
"""


def test_the_chained_talker_layers_equal_the_cublas_layers_in_the_interpreter() -> None:
    """`run_layers_chained` (tensor-core `gemv` products, SwiGLU in gate|up's epilogue, PDL-capable kernels) gives
    `run_layers`' hidden states and cache writes at 16 rows, with down in cuBLAS (the default) or in a tile, and with
    its products in split-K tiles."""
    result = run_interpreted(CHAINED_SCRIPT, timeout_s=600)
    assert set(result) == {"chained", "down_tile", "split"}
    for form in result.values():
        assert form["error"] < 1e-5 and form["kv_error"] < 1e-5, result


DRAW_SCRIPT = """
import json, torch
from engine.fast.kernels.talker_draw import talker_draw, talker_draw_reference
gen = torch.Generator().manual_seed(11)
slots, vocab, eos_id, num_codes, cap = 9, 300, 250, 240, 64
logits = torch.randn(7, vocab, generator=gen) * 3
logits[1, :num_codes] = logits[1, 3]  # a flat row: top-k ties at the threshold
# five rows, then two padded duplicates of the last (`pad_rows` repeats every input of the last row)
index = torch.tensor([4, 0, 7, 2, 8, 8, 8])
frames = torch.tensor([1, 4, 7, 10, 13, 13, 13])
eos_never = torch.tensor([True, False, False, True, False, False, False])
logits[5:] = logits[4]
state = {
    "seen": torch.rand(slots, vocab, generator=gen) < 0.3,
    "generated": torch.tensor([0, 5, 1, 9, 2, 0, 3, 1, 4]),
    "penalty": 1.0 + torch.rand(slots, 1, generator=gen),
    "greedy": torch.tensor([False, True, False, False, False, False, False, False, False]),
    "temperature": 0.5 + torch.rand(slots, 1, generator=gen),
    "top_k": torch.tensor([50, 1, 0, 5, 64, 3, 50, 20, 50]),
    "seeds": torch.randint(0, 2**62, (slots,), generator=gen),
    "code0": torch.full((slots,), -1),
}
results = {}
for name, draw in (("fused", talker_draw), ("twin", talker_draw_reference)):
    copy = {key: value.clone() for key, value in state.items()}
    out = torch.full((7,), -5, dtype=torch.int64)
    if name == "fused":
        draw(logits, index, frames, eos_never, *copy.values(), eos_id=eos_id, num_codes=num_codes, cap=cap, out=out)
    else:
        draw(logits, index, frames, eos_never, *copy.values(), eos_id, num_codes, cap, out)
    results[name] = {"out": out[:5].tolist(), **{key: value.tolist() for key, value in copy.items()}}
print(json.dumps(results))
"""


def test_the_talker_draw_in_one_kernel_equals_its_separate_steps() -> None:
    """Repetition penalty over seen ids, EOS masked early or always, control ids out, greedy, top-k 0 / 1 / 5 /
    the cap, a flat row tied at its threshold, padded duplicate rows: the same tokens and the same slot state
    (seen, generated, code0) as `talker_scores`, `sample` and the index_put writes."""
    results = run_interpreted(DRAW_SCRIPT, timeout_s=600)
    fused, twin = results["fused"], results["twin"]
    assert fused == twin
    assert twin["generated"][8] == 5 and twin["code0"][8] == twin["out"][4]  # the padded slot counted once
    assert all(token < 240 or token == 250 for token in twin["out"])  # control ids never drawn
