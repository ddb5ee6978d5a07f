"""Layer maths against straightforward formulas (fp32 and bf16)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from engine.model.layers import Attention, AttentionBatch, RMSNorm, RotaryEmbedding, SwiGLU, apply_rope


def test_rms_norm_matches_formula_and_rounds_before_the_weight_multiply():
    torch.manual_seed(0)
    norm = RMSNorm(64, eps=1e-6)
    norm.weight.data = torch.randn(64)
    x = torch.randn(3, 5, 64)
    expected = norm.weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(norm(x), expected, rtol=1e-5, atol=1e-6)

    norm_bf16 = norm.to(torch.bfloat16)
    xb = x.to(torch.bfloat16)
    normalised = (xb.float() * torch.rsqrt(xb.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(
        torch.bfloat16
    )
    assert torch.equal(norm_bf16(xb), norm_bf16.weight * normalised)  # official order: round, then multiply
    assert norm_bf16(xb).dtype == torch.bfloat16


def test_rope_is_a_rotation_of_dimension_pairs_i_and_i_plus_half():
    head_dim, theta = 16, 1_000_000.0
    rope = RotaryEmbedding(head_dim, theta)
    positions = torch.tensor([[0, 1, 7, 300]])
    cos, sin = rope(positions, torch.float32)
    x = torch.randn(1, 2, 4, head_dim)
    out = apply_rope(x, cos, sin)
    half = head_dim // 2
    for t, pos in enumerate(positions[0].tolist()):
        for i in range(half):
            angle = pos / theta ** (2 * i / head_dim)
            a, b = x[0, :, t, i], x[0, :, t, i + half]
            torch.testing.assert_close(
                out[0, :, t, i], a * math.cos(angle) - b * math.sin(angle), atol=1e-5, rtol=1e-5
            )
            torch.testing.assert_close(
                out[0, :, t, i + half], b * math.cos(angle) + a * math.sin(angle), atol=1e-5, rtol=1e-5
            )
    assert torch.equal(apply_rope(x, cos, sin)[:, :, 0], x[:, :, 0])  # position 0 is the identity


def test_rope_tables_are_computed_in_fp32_then_rounded_to_the_activation_dtype():
    rope = RotaryEmbedding(128, 1_000_000.0)
    positions = torch.tensor([[5, 1000, 20000]])
    cos32, sin32 = rope(positions, torch.float32)
    cos16, sin16 = rope(positions, torch.bfloat16)
    assert cos16.dtype == torch.bfloat16
    assert torch.equal(cos16, cos32.to(torch.bfloat16)) and torch.equal(sin16, sin32.to(torch.bfloat16))


def _naive_attention(x, attn: Attention, positions):
    """Causal GQA attention written out with explicit loops over heads."""
    b, t, _ = x.shape
    d = attn.head_dim
    rope = RotaryEmbedding(d, 10_000.0)
    cos, sin = rope(positions, x.dtype)
    q = apply_rope(attn.q_norm(attn.q_proj(x).view(b, t, -1, d)).transpose(1, 2), cos, sin)
    k = apply_rope(attn.k_norm(attn.k_proj(x).view(b, t, -1, d)).transpose(1, 2), cos, sin)
    v = attn.v_proj(x).view(b, t, -1, d).transpose(1, 2)
    group = attn.num_heads // attn.num_kv_heads
    heads = []
    for h in range(attn.num_heads):
        scores = q[:, h] @ k[:, h // group].transpose(-1, -2) / math.sqrt(d)  # [B,T,T]
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        heads.append(torch.softmax(scores, -1) @ v[:, h // group])
    return attn.o_proj(torch.stack(heads, 1).transpose(1, 2).reshape(b, t, -1))


@pytest.mark.parametrize("dense", [True, False])
def test_cached_attention_equals_naive_causal_gqa(dense):
    torch.manual_seed(1)
    attn = Attention(hidden=32, num_heads=4, num_kv_heads=2, head_dim=8, eps=1e-6)
    for norm in (attn.q_norm, attn.k_norm):
        norm.weight.data = torch.rand(8) + 0.5
    x = torch.randn(2, 6, 32)
    positions = torch.arange(6).expand(2, 6)
    rope = RotaryEmbedding(8, 10_000.0)
    cos, sin = rope(positions, x.dtype)
    k_cache, v_cache = torch.zeros(2, 2, 16, 8), torch.zeros(2, 2, 16, 8)
    batch = AttentionBatch(
        torch.arange(2), positions, kv_len=6, is_causal=True, dense_start=0 if dense else None
    )
    out = attn(x, cos, sin, k_cache, v_cache, batch)
    torch.testing.assert_close(out, _naive_attention(x, attn, positions), rtol=1e-5, atol=1e-5)
    assert k_cache[:, :, 6:].abs().sum() == 0  # nothing written past the new tokens


def test_swiglu_is_down_of_silu_gate_times_up():
    torch.manual_seed(2)
    mlp = SwiGLU(16, 40)
    x = torch.randn(3, 16)
    expected = mlp.down_proj.weight @ (F.silu(x @ mlp.gate_proj.weight.T) * (x @ mlp.up_proj.weight.T)).T
    torch.testing.assert_close(mlp(x), expected.T, rtol=1e-5, atol=1e-5)
