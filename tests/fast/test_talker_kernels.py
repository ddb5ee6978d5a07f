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
                               rows=5, max_len=200)))
"""


def test_every_kernel_matches_its_twin_in_the_triton_interpreter() -> None:
    errors = run_interpreted(SCRIPT)
    assert set(errors) == {"rms_norm", "rms_norm_no_residual", "silu_mul", "qk_norm_rope", "decode_attention"}
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
theirs = decode_attention_reference(q, k, v, slots, lengths)
print(json.dumps({"splits": splits, "chunk": chunk, "error": float((ours - theirs).norm() / theirs.norm())}))
"""


@pytest.mark.parametrize(
    "config",
    [{}, {"keys_per_split": 64}, {"keys_per_split": 128, "block_n": 32, "num_stages": 2}],
    ids=["256-key-splits", "64-key-splits", "32-key-steps"],
)
def test_decode_attention_over_several_splits_reads_each_row_up_to_its_length_only(config: dict) -> None:
    """Rows ending at, just before and just after split and block boundaries, up to the cache's capacity, for
    split configurations `tools/attention_bench.py` sweeps."""
    result = run_interpreted(f"CONFIG = {json.dumps(json.dumps(config))}\n" + SPLITS_SCRIPT)
    block = config.get("block_n", 64)
    assert result["splits"] >= 4 and result["chunk"] % block == 0  # several splits of whole blocks
    assert result["error"] < 1e-5, result
