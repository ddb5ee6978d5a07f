"""Per-head q/k RMSNorm, RoPE and the KV-cache write of one attention layer, in one kernel.

Input is the fused projection qkv [R, (H + 2K) * D] (R = B*T token rows: H query heads, then K key
heads, then K value heads). Each token row r writes its key and value heads into the cache at
(slot[r], :, position[r], :) and returns its rotated queries [R, H, D]. Rounding follows the plain
layers step by step: norm in fp32 rounded to the activation dtype, times the weight (rounded), then
`x*cos + rotate_half(x)*sin` with each product and the sum rounded, as bf16 tensor ops round.
cos/sin [R, D] are the plain `RotaryEmbedding` tables of each row's position.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, use_triton
from engine.model.layers import apply_rope

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _qk_norm_rope_kernel(
        qkv_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, pos_ptr,
        eps, stride_s, stride_k, stride_l,
        H: tl.constexpr, K: tl.constexpr, D: tl.constexpr,
    ):  # fmt: skip
        r = tl.program_id(0)
        h = tl.program_id(1)  # 0..H-1: a query head; H..H+K-1: a key head (and its value head)
        dtype = q_out_ptr.dtype.element_ty
        half: tl.constexpr = D // 2
        d = tl.arange(0, D)
        d_rot = (d + half) % D
        width: tl.constexpr = (H + 2 * K) * D
        base = qkv_ptr + r * width + h * D
        x = tl.load(base + d).to(tl.float32)
        x_rot = tl.load(base + d_rot).to(tl.float32)
        w_ptr = qw_ptr if h < H else kw_ptr
        w = tl.load(w_ptr + d).to(tl.float32)
        w_rot = tl.load(w_ptr + d_rot).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)  # rsqrtf, as torch.rsqrt
        n = (w * (x * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        n_rot = (w_rot * (x_rot * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        n_rot = tl.where(d < half, -n_rot, n_rot)  # rotate_half: [-x2, x1]
        c = tl.load(cos_ptr + r * D + d).to(tl.float32)
        s = tl.load(sin_ptr + r * D + d).to(tl.float32)
        out = ((n * c).to(dtype).to(tl.float32) + (n_rot * s).to(dtype).to(tl.float32)).to(dtype)
        if h < H:
            tl.store(q_out_ptr + (r * H + h) * D + d, out)
        else:
            j = h - H
            slot = tl.load(slot_ptr + r)
            pos = tl.load(pos_ptr + r)
            offset = slot * stride_s + j * stride_k + pos * stride_l + d
            tl.store(k_cache_ptr + offset, out)
            v = tl.load(qkv_ptr + r * width + (H + K + j) * D + d)
            tl.store(v_cache_ptr + offset, v)


def _head_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    x32 = x.to(torch.float32)
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def qk_norm_rope_reference(
    qkv: Tensor, cos: Tensor, sin: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float,
    k_cache: Tensor, v_cache: Tensor, slot: Tensor, position: Tensor, num_heads: int, num_kv_heads: int,
) -> Tensor:  # fmt: skip
    rows, d = qkv.shape[0], cos.shape[-1]
    q, k, v = qkv.view(rows, num_heads + 2 * num_kv_heads, d).split([num_heads, num_kv_heads, num_kv_heads], 1)
    q = apply_rope(_head_norm(q, q_weight, eps), cos[:, None], sin[:, None])  # [R,H,D]
    k = apply_rope(_head_norm(k, k_weight, eps), cos[:, None], sin[:, None])  # [R,K,D]
    k_cache[slot, :, position] = k  # advanced indices around a slice: the indexed view is [R,K,D]
    v_cache[slot, :, position] = v
    return q.contiguous()


def qk_norm_rope(
    qkv: Tensor, cos: Tensor, sin: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float,
    k_cache: Tensor, v_cache: Tensor, slot: Tensor, position: Tensor, num_heads: int, num_kv_heads: int,
) -> Tensor:  # fmt: skip
    """qkv [R,(H+2K)D], cos/sin [R,D], caches [S,K,L,D] (last dim contiguous), slot/position [R] int64
    -> rotated queries [R,H,D]; keys and values written into the caches in place."""
    if not use_triton(qkv):
        return qk_norm_rope_reference(qkv, cos, sin, q_weight, k_weight, eps, k_cache, v_cache, slot, position,
                                      num_heads, num_kv_heads)  # fmt: skip
    rows, d = qkv.shape[0], cos.shape[-1]
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    # The kernel indexes every operand densely: an expanded index (stride 0, e.g. from
    # `rows[:, None].expand(1, T).reshape(-1)`) must be materialised, or it reads past its end.
    qkv, cos, sin, slot, position = (t.contiguous() for t in (qkv, cos, sin, slot, position))
    q = torch.empty(rows, num_heads, d, dtype=qkv.dtype, device=qkv.device)
    _qk_norm_rope_kernel[(rows, num_heads + num_kv_heads)](
        qkv, cos, sin, q_weight, k_weight, q, k_cache, v_cache, slot, position, eps,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        H=num_heads, K=num_kv_heads, D=d, num_warps=1 if d <= 64 else 2,
    )  # fmt: skip
    return q
