"""Qwen3 decoder building blocks with the official arithmetic (reference sections 3 and 9.3).

RMSNorm, RoPE, GQA attention with per-head q/k RMSNorm over an explicit KV cache, SwiGLU MLP and the
pre-norm decoder layer. No module owns runtime state: the caller passes the cache tensors and an
`AttentionBatch` describing where each row's new keys go and which keys it may see. Where the
official code upcasts (norm internals, RoPE tables, logits) we upcast; everywhere else the
activation dtype is kept, so bf16 runs round exactly where the official model rounds.

Shapes: B rows, T new tokens per row, H query heads, K kv heads, D head dim, L cache length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """`weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)`: the product is taken in the input dtype."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Plain 1-D RoPE, rotate-half convention; cos/sin computed in fp32 and rounded to the activation dtype.

    The talker's interleaved M-RoPE reduces to this because its three position streams are identical
    (reference 2.2). Angles are an elementwise fp32 product (not a matmul) so TF32 cannot touch them.
    """

    inv_freq: Tensor

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta
        self.register_buffer("inv_freq", self._inv_freq(torch.device("cpu")), persistent=False)

    def _inv_freq(self, device: torch.device) -> Tensor:
        exponents = (
            torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
        )
        return 1.0 / (self.theta**exponents)

    def reset_inv_freq(self) -> None:
        """Recompute the table in place after the module was materialised from the meta device."""
        self.inv_freq = self._inv_freq(self.inv_freq.device)

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions [B,T] int64 -> cos, sin [B,1,T,D] in `dtype` (broadcast over heads)."""
        angles = positions.to(torch.float32)[..., None] * self.inv_freq  # [B,T,D/2]
        angles = torch.cat((angles, angles), dim=-1)  # [B,T,D]
        return angles.cos().to(dtype)[:, None], angles.sin().to(dtype)[:, None]


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B,H,T,D]; rotation in x's dtype, as the official model does."""
    return (x * cos) + (rotate_half(x) * sin)


@dataclass(frozen=True, slots=True)
class AttentionBatch:
    """Where one forward's new keys are written and what each query row may attend to.

    `slots` [B] selects cache rows, `positions` [B,T] are the absolute positions of the new tokens
    (also their cache write index). Keys are read from cache[:, :, :kv_len]. `mask` [B,1,T,kv_len]
    (True = attend) is needed only when rows differ in length or are padded; with `mask=None`,
    `is_causal` selects a causal prefill (query i sees keys 0..i) and otherwise every key is visible.
    These are the same SDPA calls the official model makes for batch 1, so parity runs stay exact.
    `dense_start` marks the common case slots = 0..B-1, every row at positions dense_start..+T-1:
    the cache is then written and read through slices (views) instead of index gathers.
    """

    slots: Tensor
    positions: Tensor
    kv_len: int
    mask: Tensor | None = None
    is_causal: bool = False
    dense_start: int | None = None


class Attention(nn.Module):
    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, eps: float) -> None:
        super().__init__()
        assert num_heads % num_kv_heads == 0, "query heads must be a multiple of kv heads"
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)  # per head, over D only
        self.k_norm = RMSNorm(head_dim, eps)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor, batch: AttentionBatch
    ) -> Tensor:
        """x [B,T,hidden]; k_cache/v_cache [slots,K,L,D] are written at (slots, positions) in place."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, -1, self.head_dim)).transpose(1, 2)  # [B,H,T,D]
        k = self.k_norm(self.k_proj(x).view(b, t, -1, self.head_dim)).transpose(1, 2)  # [B,K,T,D]
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)  # [B,K,T,D]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        if batch.dense_start is not None:
            start = batch.dense_start
            k_cache[:b, :, start : start + t] = k
            v_cache[:b, :, start : start + t] = v
            keys, values = k_cache[:b, :, : batch.kv_len], v_cache[:b, :, : batch.kv_len]  # [B,K,kv_len,D]
        else:
            rows = batch.slots[:, None]  # [B,1] broadcast against positions [B,T]
            k_cache[rows, :, batch.positions] = k.transpose(1, 2)  # index result is [B,T,K,D]
            v_cache[rows, :, batch.positions] = v.transpose(1, 2)
            keys = k_cache[batch.slots, :, : batch.kv_len]  # [B,K,kv_len,D]
            values = v_cache[batch.slots, :, : batch.kv_len]

        out = attend(q, keys, values, batch.mask, batch.is_causal)  # [B,H,T,D]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


def attend(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
    """SDPA exactly as transformers 4.57 calls it: native GQA without a mask, repeated kv heads with one."""
    if mask is None:
        return F.scaled_dot_product_attention(q, keys, values, is_causal=is_causal, enable_gqa=True)
    repeat = q.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(repeat, dim=1)  # [B,H,kv_len,D]
    values = values.repeat_interleave(repeat, dim=1)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm Qwen3 layer: h = x + attn(norm(x)); y = h + mlp(norm(h)). Names match the checkpoint."""

    def __init__(
        self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, intermediate: int, eps: float
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(hidden, num_heads, num_kv_heads, head_dim, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = SwiGLU(hidden, intermediate)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor, batch: AttentionBatch
    ) -> Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, k_cache, v_cache, batch)
        return h + self.mlp(self.post_attention_layernorm(h))
