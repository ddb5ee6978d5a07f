"""The codec pre-transformer's one-kernel RoPE + attention computes what its plain op sequence computes.

In Triton's CPU interpreter (a subprocess: the interpreter is chosen at import time): the kernel against its twin on
random layers (grouped keys, rings with strides, masked ring entries, 1-9 new frames, ragged rows whose padding
frames keep their ring entries' old keys; 1, 2 and 4 queries per program: 4 from 5 frames up), and incremental codec decodes
(whole and ragged calls) with the fused attention against the same decoder without it (fp32), or against an fp32
decode of the same weights (bf16: no further from it than the plain bf16 path).
"""

from __future__ import annotations

import pytest
import torch

from engine.codec.config import codec_preset
from engine.codec.weights import random_codec
from engine.fast.codec_fast import FastCodecDecoder
from engine.fast.kernels.codec_attention import codec_attention, codec_attention_reference
from tests.fast.helpers import run_interpreted

INTERPRETED = r"""
import json, torch
from engine.codec.config import codec_preset
from engine.codec.stream import CodecStatePool, decode_incremental
from engine.codec.weights import random_codec
from engine.fast.codec_fast import FastCodecDecoder
from engine.fast.kernels.codec_attention import codec_attention, codec_attention_reference
from tests.codec.helpers import random_codes, relative_l2

torch.manual_seed(0)
result = {"kernel": [], "decode": {}}
for dtype in (torch.float32, torch.bfloat16):
    for batch, n, heads, kv_heads, d, ring in [(2, 1, 4, 4, 16, 7), (3, 4, 4, 2, 16, 7), (1, 9, 2, 2, 8, 5)]:
        qkv = torch.randn(batch, n, (heads + 2 * kv_heads) * d).to(dtype)
        angles = torch.randn(batch, n, d // 2)
        cos = torch.cat([angles.cos()] * 2, -1).to(dtype)
        sin = torch.cat([angles.sin()] * 2, -1).to(dtype)
        k_ring = torch.randn(batch, kv_heads, ring + 3, d).to(dtype)[:, :, :ring]  # a view with row strides
        v_ring = torch.randn(batch, kv_heads, ring, d).to(dtype)
        causal = torch.ones(n, n).tril().bool()[None].expand(batch, n, n)
        allowed = torch.cat([torch.rand(batch, n, ring) > 0.3, causal], -1).contiguous()
        keep = min(n, ring)
        slots = torch.stack([torch.randperm(ring)[:keep] for _ in range(batch)])  # distinct entries per row
        reals = (None, torch.rand(batch, n) > 0.4) if keep == n else (None,)
        for real, query_block in [(r, qb) for r in reals for qb in (None, 2)]:
            ours = codec_attention(qkv, cos, sin, allowed, k_ring, v_ring, slots, real, heads, kv_heads, query_block)
            theirs = codec_attention_reference(qkv, cos, sin, allowed, k_ring, v_ring, slots, real, heads, kv_heads)
            result["kernel"].append({
                "dtype": str(dtype), "out_max_diff": float((ours[0].double() - theirs[0].double()).abs().max()),
                "keys_equal": torch.equal(ours[1], theirs[1]), "values_equal": torch.equal(ours[2], theirs[2]),
                "rings_changed": not torch.equal(ours[1], k_ring) and not torch.equal(ours[2], v_ring),
                "a_frame_is_real": real is None or bool(real.any()),
            })
    precision = "fp32" if dtype == torch.float32 else "bf16"
    codes = random_codes(3, 7, seed=2)
    decodes = {}
    # fused False / True in this dtype, and (None) an fp32 decode of the same (dtype-rounded) weights
    for fused in (False, True, None):
        codec = random_codec(codec_preset("tiny"), seed=9).to(dtype)
        if fused is None:
            codec = codec.to(torch.float32)
        fast = FastCodecDecoder(codec, "fp32" if fused is None else precision, fused_attention=bool(fused))
        pool = CodecStatePool(codec.config, 3, "cpu", codec.dtype)
        slots = [pool.alloc() for _ in range(3)]
        whole = [decode_incremental(fast, pool, slots, codes[..., a:b]) for a, b in ((0, 1), (1, 4))]
        ragged = decode_incremental(fast, pool, slots, codes[..., 4:7], frames=[3, 1, 2])
        decodes[fused] = torch.cat([torch.cat(whole, -1), ragged[:, :1920]], -1).float()
    result["decode"][precision] = {
        "fused_vs_ops": relative_l2(decodes[True], decodes[False]),
        "ops_vs_fp32": relative_l2(decodes[False], decodes[None]),
        "fused_vs_fp32": relative_l2(decodes[True], decodes[None]),
    }
print(json.dumps(result))
"""


def test_the_fused_codec_attention_matches_its_op_sequence_in_the_triton_interpreter():
    pytest.importorskip("triton")
    result = run_interpreted(INTERPRETED, timeout_s=900)
    for case in result["kernel"]:
        # keys and values bitwise (RoPE rounds as the plain ops); the output within one rounding of the dtype
        bound = 1e-6 if case["dtype"] == "torch.float32" else 1.6e-2
        assert case["keys_equal"] and case["values_equal"] and case["rings_changed"] == case["a_frame_is_real"], case
        assert case["out_max_diff"] <= bound, case
    assert result["decode"]["fp32"]["fused_vs_ops"] < 1e-5, result["decode"]
    # bf16: one rounding more or less in attention moves a random-weight waveform by a few % (as the plain bf16
    # path is from fp32); the fused path may be no further from the fp32 decode than the plain one (the codec's
    # fast-path rule, loadtest.gpu_check)
    bf16 = result["decode"]["bf16"]
    assert bf16["fused_vs_fp32"] <= 1.1 * bf16["ops_vs_fp32"], bf16


def test_off_the_triton_path_the_fused_attention_is_its_twin():
    """Without Triton (or on a CPU outside the interpreter) `codec_attention` runs the twin, so a decoder built with
    `fused_attention` decodes exactly as one without it."""
    torch.manual_seed(1)
    qkv, cos, sin = torch.randn(2, 3, 4 * 8), torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    k_ring, v_ring = torch.randn(2, 1, 5, 8), torch.randn(2, 1, 5, 8)
    allowed, slots = torch.ones(2, 3, 8, dtype=torch.bool), torch.tensor([[0, 1, 2], [3, 4, 0]])
    ours = codec_attention(qkv, cos, sin, allowed, k_ring, v_ring, slots, None, 2, 1)
    theirs = codec_attention_reference(qkv, cos, sin, allowed, k_ring, v_ring, slots, None, 2, 1)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    codec = random_codec(codec_preset("tiny"), seed=9)
    assert FastCodecDecoder(codec, "fp32", fused_attention=True)._pre_transformer.attention is codec_attention
    assert FastCodecDecoder(codec, "fp32")._pre_transformer.attention is codec_attention_reference
