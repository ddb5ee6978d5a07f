"""The code predictor's whole attention between its qkv and o projections, in one kernel per layer.

The code predictor's context is at most 16 positions, so one program per (frame row b, kv head j) does
everything the fused decoder does in two to three kernels (`qk_norm_rope` + split and merge attention):

    keys/values of positions 0..start-1 <- cache (earlier steps wrote them)
    for each of the row's T new tokens t (positions start+t):  k/v head j  -> k RMSNorm, RoPE -> cache, and
                                                               into the keys/values in registers
    for each token t:  its G = H/K query heads of kv head j -> RMSNorm, RoPE -> softmax(q k^T / sqrt(D)) v
                       over cache positions 0..start+t (fp32 scores and weights, output rounded once)

Two forms of the last line: the G query heads broadcast together over [G, L, D] products (`attend_row_head`), or
one at a time over the keys' own [L, D] layout (`attend_heads`, `per_head`: half the instructions, none of the
layout conversions in a 1-warp program), optionally with the G heads split over `query_split` programs, each of
which computes the new key and value for itself (part 0 writes them).

Rounding of the norm and RoPE follows `qk_norm_rope` step by step; attention runs in fp32 on the rounded
keys and values the cache holds, as the plain SDPA reads them.

    qkv [B*T, (H+2K)*D] (token rows b*T + t)   cos, sin [L, D] (RoPE table by position)
    k_cache, v_cache [S, K, L, D] (frame row b uses slot b; last dim contiguous)   -> out [B*T, H*D]
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, INTERPRET, use_triton
from engine.fast.kernels.decode_attention import decode_attention_reference
from engine.fast.kernels.pdl import enabled as pdl_enabled
from engine.fast.kernels.pdl import launch_options
from engine.fast.kernels.qk_norm_rope import qk_norm_rope_reference

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from engine.fast.kernels.pdl import wait_for_producer
    from engine.fast.kernels.snake import TRITON_DTYPES, round_hw, round_to

    @triton.jit
    def _norm_rope(x, x_rot, w, w_rot, c, s, eps, d, D: tl.constexpr, DTYPE: tl.constexpr):
        """Heads [GP, D] (and their rotate-half partners) -> normed, rotated heads, rounded as the plain ops."""
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)  # [GP]
        n = w[None, :] * (
            x * rstd[:, None]
        )  # fp32 twins: no rounding (and no nested calls in the interpreter)
        n_rot = w_rot[None, :] * (x_rot * rstd[:, None])
        if DTYPE != tl.float32:  # noqa: SIM300
            n = round_to(w[None, :] * round_to(x * rstd[:, None], DTYPE), DTYPE)
            n_rot = round_to(w_rot[None, :] * round_to(x_rot * rstd[:, None], DTYPE), DTYPE)
        n_rot = tl.where(d[None, :] < D // 2, -n_rot, n_rot)  # rotate_half: [-x2, x1]
        if DTYPE != tl.float32:  # noqa: SIM300
            return round_to(round_to(n * c[None, :], DTYPE) + round_to(n_rot * s[None, :], DTYPE), DTYPE)
        return n * c[None, :] + n_rot * s[None, :]

    @triton.jit
    def load_earlier(k_cache_ptr, v_cache_ptr, b, j, start, stride_s, stride_k, stride_l, D: tl.constexpr,
                     BLOCK_L: tl.constexpr):  # fmt: skip
        """Frame row b, kv head j: the keys and values of positions 0..start-1 (earlier steps wrote them) as fp32
        [BLOCK_L, D], zeros past them."""
        d = tl.arange(0, D)
        positions = tl.arange(0, BLOCK_L)
        kv = b * stride_s + j * stride_k + positions[:, None] * stride_l + d[None, :]
        earlier = (positions < start)[:, None]
        keys = tl.load(k_cache_ptr + kv, mask=earlier, other=0.0).to(tl.float32)  # [BL, D]
        values = tl.load(v_cache_ptr + kv, mask=earlier, other=0.0).to(tl.float32)
        return keys, values

    @triton.jit
    def attend_row_head(
        qkv_ptr, cos_ptr, sin_ptr, qw, qw_rot, kw, kw_rot, k_cache_ptr, v_cache_ptr, out_ptr, b, j,
        start, eps, scale, stride_s, stride_k, stride_l, keys, values,
        T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
        D: tl.constexpr, BLOCK_L: tl.constexpr, DTYPE: tl.constexpr,
    ):  # fmt: skip
        """Frame row b, kv head j: everything the module docstring lists, with the q/k norm weights (and their
        rotate-half partners) already loaded as fp32 [D], and the earlier positions' keys and values
        (`load_earlier`). The two products (q k^T over at most 16 keys, weights x values) are broadcast products
        summed across threads: as fp32 `tl.dot` over query heads padded to 16 rows they were slower on the H200
        (CP frame 3.99 against 3.05 ms at B = 64, 2026-12-05)."""
        width: tl.constexpr = (H + 2 * K) * D
        d = tl.arange(0, D)
        d_rot = (d + D // 2) % D
        one = tl.arange(0, 1)  # the kv head as a [1, D] block, so it shares `_norm_rope` with the queries
        cache = b * stride_s + j * stride_k  # (int32: the cache holds ~2M values a layer at 128 rows)
        g = tl.arange(0, GP)
        g_mask = g < G
        heads = j * G + g  # query heads of kv head j
        positions = tl.arange(0, BLOCK_L)
        # Keys and values of the earlier steps came from the cache (`keys`, `values`); this step's are computed
        # here and merged in registers, so the cache writes are never read back by this program. One pass a
        # token, its cache writes last: every load of a T = 1 step is issued before any store (a load after a
        # store to memory that may alias waits for another round trip to memory).
        for t in tl.static_range(T):
            row = qkv_ptr + (b * T + t) * width
            c = tl.load(cos_ptr + (start + t) * D + d).to(tl.float32)
            s = tl.load(sin_ptr + (start + t) * D + d).to(tl.float32)
            head = row + (H + j + one[:, None]) * D  # k [1, D] as the cache stores it, v [1, D]
            k = _norm_rope(tl.load(head + d[None, :]).to(tl.float32), tl.load(head + d_rot[None, :]).to(tl.float32),
                           kw, kw_rot, c, s, eps, d, D, DTYPE).to(DTYPE)  # fmt: skip
            v = tl.load(row + (H + K + j + one[:, None]) * D + d[None, :])
            here = (positions == start + t)[:, None]  # the values the cache now holds, as attention reads them
            keys = tl.where(here, k.to(tl.float32), keys)
            values = tl.where(here, v.to(tl.float32), values)
            q_ptrs = row + heads[:, None] * D
            x = tl.load(q_ptrs + d[None, :], mask=g_mask[:, None], other=0.0).to(tl.float32)
            x_rot = tl.load(q_ptrs + d_rot[None, :], mask=g_mask[:, None], other=0.0).to(tl.float32)
            q = _norm_rope(x, x_rot, qw, qw_rot, c, s, eps, d, D, DTYPE)  # [GP, D]
            visible = positions <= start + t  # (a later token's key and value get weight 0)
            scores = tl.sum(q[:, None, :] * keys[None, :, :], axis=2) * scale  # [GP, BL]
            scores = tl.where(visible[None, :], scores, float("-inf"))
            weights = tl.exp(scores - tl.max(scores, axis=1)[:, None])
            weights = weights / tl.sum(weights, axis=1)[:, None]
            out = tl.sum(weights[:, :, None] * values[None, :, :], axis=1)  # [GP, D]
            out_ptrs = out_ptr + (b * T + t) * H * D + heads[:, None] * D + d[None, :]
            tl.store(out_ptrs, out.to(DTYPE), mask=g_mask[:, None])
            slot = cache + (start + t) * stride_l + d[None, :]  # [1, D]
            tl.store(k_cache_ptr + slot, k)
            tl.store(v_cache_ptr + slot, v)

    @triton.jit
    def _norm_rope_head(x, x_rot, w, w_rot, c, s, eps, d, D: tl.constexpr, DTYPE: tl.constexpr, HW: tl.constexpr):
        """One head [D] (and its rotate-half partner) -> normed, rotated [D], rounded as `_norm_rope` rounds (by
        the hardware's conversions where HW: one instruction each way instead of ~6 integer ones)."""
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)  # a scalar
        if DTYPE == tl.float32:  # noqa: SIM300
            n, n_rot = w * (x * rstd), w_rot * (x_rot * rstd)
            n_rot = tl.where(d < D // 2, -n_rot, n_rot)
            return n * c + n_rot * s
        n = round_hw(w * round_hw(x * rstd, DTYPE, HW), DTYPE, HW)
        n_rot = round_hw(w_rot * round_hw(x_rot * rstd, DTYPE, HW), DTYPE, HW)
        n_rot = tl.where(d < D // 2, -n_rot, n_rot)  # rotate_half: [-x2, x1]
        return round_hw(round_hw(n * c, DTYPE, HW) + round_hw(n_rot * s, DTYPE, HW), DTYPE, HW)

    @triton.jit
    def attend_heads(
        qkv_ptr, cos_ptr, sin_ptr, qw, qw_rot, kw, kw_rot, k_cache_ptr, v_cache_ptr, out_ptr, b, j,
        start, eps, scale, stride_s, stride_k, stride_l, keys, values,
        T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
        BLOCK_L: tl.constexpr, DTYPE: tl.constexpr, HW: tl.constexpr, QSPLIT: tl.constexpr, part,
    ):  # fmt: skip
        """`attend_row_head`'s work one query head at a time: every tensor is a head [D] or the keys / values
        [BLOCK_L, D], so the products reduce within the keys' own layout. The broadcast form's [G, BLOCK_L, D]
        products and their layout conversions cost ~1,600 instructions a thread at 4 warps (sm_90 SASS), which at
        512 programs (B = 64) is ~3 us of the SMs' issue slots; this form needs about half as many. QSPLIT > 1:
        this program takes part `part` of the G query heads (G / QSPLIT of them); every part computes the new key
        and value it attends to, part 0 writes them to the cache."""
        width: tl.constexpr = (H + 2 * K) * D
        d = tl.arange(0, D)
        d_rot = (d + D // 2) % D
        cache = b * stride_s + j * stride_k
        positions = tl.arange(0, BLOCK_L)
        for t in tl.static_range(T):  # one pass a token, its cache writes last (as `attend_row_head`)
            row = qkv_ptr + (b * T + t) * width
            c = tl.load(cos_ptr + (start + t) * D + d).to(tl.float32)
            s = tl.load(sin_ptr + (start + t) * D + d).to(tl.float32)
            head = row + (H + j) * D
            k = _norm_rope_head(tl.load(head + d).to(tl.float32), tl.load(head + d_rot).to(tl.float32), kw, kw_rot,
                                c, s, eps, d, D, DTYPE, HW).to(DTYPE)  # fmt: skip
            v = tl.load(row + (H + K + j) * D + d)
            here = (positions == start + t)[:, None]
            keys = tl.where(here, k.to(tl.float32)[None, :], keys)
            values = tl.where(here, v.to(tl.float32)[None, :], values)
            visible = positions <= start + t
            for i in tl.static_range(G // QSPLIT):
                g = part * (G // QSPLIT) + i
                head = row + (j * G + g) * D
                q = _norm_rope_head(tl.load(head + d).to(tl.float32), tl.load(head + d_rot).to(tl.float32), qw,
                                    qw_rot, c, s, eps, d, D, DTYPE, HW)  # fmt: skip
                scores = tl.where(visible, tl.sum(keys * q[None, :], axis=1) * scale, float("-inf"))  # [BL]
                weights = tl.exp(scores - tl.max(scores, axis=0))
                weights = weights / tl.sum(weights, axis=0)
                out = tl.sum(weights[:, None] * values, axis=0)  # [D]
                tl.store(out_ptr + (b * T + t) * H * D + (j * G + g) * D + d, out.to(DTYPE))
            if part == 0:  # (QSPLIT > 1: the other parts computed the same key and value)
                slot = cache + (start + t) * stride_l + d
                tl.store(k_cache_ptr + slot, k)
                tl.store(v_cache_ptr + slot, v)

    @triton.jit
    def norm_weights(qw_ptr, kw_ptr, D: tl.constexpr):
        """The q and k norm weights as fp32 [D], each with its rotate-half partner: (qw, qw_rot, kw, kw_rot)."""
        d = tl.arange(0, D)
        d_rot = (d + D // 2) % D
        qw = tl.load(qw_ptr + d).to(tl.float32)
        qw_rot = tl.load(qw_ptr + d_rot).to(tl.float32)
        kw = tl.load(kw_ptr + d).to(tl.float32)
        kw_rot = tl.load(kw_ptr + d_rot).to(tl.float32)
        return qw, qw_rot, kw, kw_rot

    @triton.jit
    def _cp_attention_kernel(
        qkv_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
        start, eps, scale, stride_s, stride_k, stride_l,
        T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
        D: tl.constexpr, BLOCK_L: tl.constexpr, DTYPE: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr,
        PER_HEAD: tl.constexpr, HW: tl.constexpr, QSPLIT: tl.constexpr,
    ):  # fmt: skip
        b, j, part = tl.program_id(0), tl.program_id(1) // QSPLIT, tl.program_id(1) % QSPLIT
        qw, qw_rot, kw, kw_rot = norm_weights(qw_ptr, kw_ptr, D)
        if EARLY:  # the earlier steps' keys and values: written by a kernel at least two launches back (below)
            keys, values = load_earlier(k_cache_ptr, v_cache_ptr, b, j, start, stride_s, stride_k, stride_l, D,
                                        BLOCK_L)  # fmt: skip
        wait_for_producer(PDL)  # the norm weights above are constants; qkv is not
        if not EARLY:
            keys, values = load_earlier(k_cache_ptr, v_cache_ptr, b, j, start, stride_s, stride_k, stride_l, D,
                                        BLOCK_L)  # fmt: skip
        if PER_HEAD:
            attend_heads(qkv_ptr, cos_ptr, sin_ptr, qw, qw_rot, kw, kw_rot, k_cache_ptr, v_cache_ptr, out_ptr, b, j,
                         start, eps, scale, stride_s, stride_k, stride_l, keys, values, T, H, K, G, D, BLOCK_L, DTYPE,
                         HW, QSPLIT, part)  # fmt: skip
        else:
            attend_row_head(qkv_ptr, cos_ptr, sin_ptr, qw, qw_rot, kw, kw_rot, k_cache_ptr, v_cache_ptr, out_ptr, b,
                            j, start, eps, scale, stride_s, stride_k, stride_l, keys, values, T, H, K, G, GP, D,
                            BLOCK_L, DTYPE)  # fmt: skip


def cp_attention_reference(
    qkv: Tensor, cos: Tensor, sin: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float,
    k_cache: Tensor, v_cache: Tensor, start: int, tokens: int, num_heads: int, num_kv_heads: int,
) -> Tensor:  # fmt: skip
    """The twin: `qk_norm_rope_reference` then `decode_attention_reference`, each token row at its position."""
    rows = qkv.shape[0]
    frame_rows = torch.arange(rows // tokens, device=qkv.device)
    slot = frame_rows.repeat_interleave(tokens)  # token row b*T + t -> slot b
    position = start + torch.arange(tokens, device=qkv.device).repeat(rows // tokens)
    q = qk_norm_rope_reference(qkv, cos[position], sin[position], q_weight, k_weight, eps, k_cache, v_cache,
                               slot, position, num_heads, num_kv_heads)  # fmt: skip
    return decode_attention_reference(q, k_cache, v_cache, slot, position + 1).reshape(rows, -1)


def cp_attention(
    qkv: Tensor, cos: Tensor, sin: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float,
    k_cache: Tensor, v_cache: Tensor, start: int, tokens: int, num_heads: int, num_kv_heads: int,
    out: Tensor | None = None, num_warps: int = 4, pdl: bool = False, early_cache: bool = False,
    per_head: bool = False, query_split: int = 1,
) -> Tensor:  # fmt: skip
    """qkv [B*T,(H+2K)D] contiguous, cos/sin [L,D], caches [S>=B,K,L,D]; tokens T at positions start..start+T-1
    -> attention output [B*T, H*D] (into `out`, contiguous, when given); the new keys and values are written
    into the caches in place. `num_warps` of each (frame row, kv head) program. `pdl`: launched as a programmatic
    dependent of the kernel before it (`kernels.pdl`). `early_cache` (with `pdl`): the earlier positions' keys and
    values are loaded before waiting for the kernel before (the previous step's attention wrote them, dozens of
    launches back: a programmatic dependent starts only once the kernel two back has completed and its writes are
    visible), so those loads leave the critical path after the qkv product. `per_head`: the query heads one at a
    time (`attend_heads`) instead of broadcast together (`attend_row_head`); `query_split` (per head only): each
    kv head's query heads over that many programs (a divisor of H / K), each with its own copy of the keys."""
    if not use_triton(qkv):
        result = cp_attention_reference(qkv, cos, sin, q_weight, k_weight, eps, k_cache, v_cache, start, tokens,
                                        num_heads, num_kv_heads)  # fmt: skip
        return result if out is None else out.copy_(result)
    rows, d = qkv.shape[0], cos.shape[-1]
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1 and rows % tokens == 0
    assert start + tokens <= k_cache.shape[2]
    qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
    if out is None:
        out = torch.empty(rows, num_heads * d, dtype=qkv.dtype, device=qkv.device)
    assert out.shape == (rows, num_heads * d) and out.is_contiguous()
    group = num_heads // num_kv_heads
    assert group % query_split == 0 and (per_head or query_split == 1)
    _cp_attention_kernel[(rows // tokens, num_kv_heads * query_split)](
        qkv, cos, sin, q_weight, k_weight, k_cache, v_cache, out, start, eps, 1.0 / math.sqrt(d),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        T=tokens, H=num_heads, K=num_kv_heads, G=group, GP=triton.next_power_of_2(group), D=d,
        BLOCK_L=triton.next_power_of_2(k_cache.shape[2]), DTYPE=TRITON_DTYPES[qkv.dtype], PDL=pdl_enabled(pdl),
        EARLY=early_cache, PER_HEAD=per_head, HW=not INTERPRET, QSPLIT=query_split, num_warps=num_warps,
        **launch_options(pdl),
    )  # fmt: skip
    return out
