"""The codec pre-transformer's streaming attention in one kernel: RoPE on the step's queries and keys, attention
over the ring of earlier keys and the new ones, the output in the layout the output projection reads, and the
updated key/value rings.

`FastPreTransformer` ran this part of each layer as ~14 kernels (RoPE's multiplies, negation, concatenation and
add, two key/value concatenations, SDPA with its mask, the heads-to-rows copy, and the rings' out-of-place scatters);
at the engine's codec shapes a step is launch-bound, so that was ~110 of its ~400 launches. Per program (b, h, block of
queries): the ring and the step's new keys read once, then each of its queries against every key it may see; the
first query block's program of each key head's first query head also writes that head's new rings.

    qkv [B, N, (H + 2 H_kv) * D]    the step's joint q|k|v product, per row h-major (q heads, k heads, v heads)
    cos, sin [B, N, D]              the step's RoPE tables (`PreTransformer.stream_layout`)
    allowed [B, N, W-1+N] bool      which keys each query sees: the W-1 ring entries, then the N new keys
    k_ring, v_ring [B, H_kv, W-1, D]  post-RoPE keys / values of earlier frames (last dim contiguous)
    slots [B, keep] int64           ring entries the newest keep = min(N, W-1) frames take (`stream_layout`)
    real [B, N] bool (optional)     a ragged batch's real frames: a padding frame's entry keeps its old key
      ->
    out [B, N, H * D]               softmax(q k^T * D^-0.5 + mask) v, heads side by side (rows for o_proj)
    new k_ring, v_ring [B, H_kv, W-1, D]   as `ring_update` leaves them

RoPE rounds where the plain `x * cos + rotate_half(x) * sin` rounds (after each multiply and the add, in the
activation dtype), so bf16 keys equal the plain path's; the attention itself runs in fp32 and rounds its output
once (SDPA's own kernels also accumulate in fp32; their rounding of intermediate steps differs by kernel).
The twin is the plain op sequence `FastPreTransformer` ran before, `ring_update` included.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.codec.layers import rotate_half
from engine.codec.model import ring_update
from engine.fast.kernels import HAVE_TRITON, use_triton

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from engine.fast.kernels.snake import TRITON_DTYPES, round_to

    @triton.jit
    def _rope(x, swapped, cos, sin, d, HALF: tl.constexpr, DTYPE: tl.constexpr):
        """x * cos + rotate_half(x) * sin with the plain rounding; `swapped` is x with its halves exchanged, all
        fp32 of any leading shape with last dim D (`d` its index)."""
        rotated = tl.where(d < HALF, -swapped, swapped)
        return round_to(round_to(x * cos, DTYPE) + round_to(rotated * sin, DTYPE), DTYPE)

    @triton.jit
    def _codec_attention_kernel(
        qkv_ptr, cos_ptr, sin_ptr, mask_ptr, kr_ptr, vr_ptr, slots_ptr, real_ptr, out_ptr, nkr_ptr, nvr_ptr,
        n_new, ring_len, keep, scale,
        s_qkv_b, s_qkv_n, s_cs_b, s_cs_n, s_m_b, s_m_n,
        s_kr_b, s_kr_h, s_kr_w, s_vr_b, s_vr_h, s_vr_w, s_o_b, s_o_n,
        HEADS: tl.constexpr, KV_HEADS: tl.constexpr, D: tl.constexpr, BLOCK_RING: tl.constexpr,
        BLOCK_NEW: tl.constexpr, HAS_REAL: tl.constexpr, DTYPE: tl.constexpr, QUERY_BLOCK: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        first_query = tl.program_id(2) * QUERY_BLOCK  # this program's queries: QUERY_BLOCK of the step's frames
        kvh = h // (HEADS // KV_HEADS)
        d = tl.arange(0, D)
        swap = (d + D // 2) % D

        # the step's own keys and values, frames j < n_new: [BLOCK_NEW, D]
        j = tl.arange(0, BLOCK_NEW)
        j_in = (j < n_new)[:, None]
        rows = qkv_ptr + b * s_qkv_b + j[:, None] * s_qkv_n
        cs = b * s_cs_b + j[:, None] * s_cs_n + d[None, :]
        k_cos = tl.load(cos_ptr + cs, mask=j_in, other=0.0).to(tl.float32)
        k_sin = tl.load(sin_ptr + cs, mask=j_in, other=0.0).to(tl.float32)
        k_at = rows + (HEADS + kvh) * D
        k_raw = tl.load(k_at + d[None, :], mask=j_in, other=0.0).to(tl.float32)
        k_swapped = tl.load(k_at + swap[None, :], mask=j_in, other=0.0).to(tl.float32)
        k_new = _rope(k_raw, k_swapped, k_cos, k_sin, d[None, :], D // 2, DTYPE)
        v_new = tl.load(rows + (HEADS + KV_HEADS + kvh) * D + d[None, :], mask=j_in, other=0.0).to(tl.float32)

        # the ring's keys and values, read once for all of the step's queries: [BLOCK_RING, D]
        w = tl.arange(0, BLOCK_RING)
        w_in = (w < ring_len)[:, None]
        k_ring = tl.load(kr_ptr + b * s_kr_b + kvh * s_kr_h + w[:, None] * s_kr_w + d[None, :], mask=w_in, other=0.0)
        v_ring = tl.load(vr_ptr + b * s_vr_b + kvh * s_vr_h + w[:, None] * s_vr_w + d[None, :], mask=w_in, other=0.0)

        for n in range(first_query, tl.minimum(first_query + QUERY_BLOCK, n_new)):  # each query against its keys
            row = qkv_ptr + b * s_qkv_b + n * s_qkv_n
            cos = tl.load(cos_ptr + b * s_cs_b + n * s_cs_n + d).to(tl.float32)
            sin = tl.load(sin_ptr + b * s_cs_b + n * s_cs_n + d).to(tl.float32)
            q = _rope(tl.load(row + h * D + d).to(tl.float32), tl.load(row + h * D + swap).to(tl.float32), cos, sin,
                      d, D // 2, DTYPE)  # fmt: skip
            mask_row = mask_ptr + b * s_m_b + n * s_m_n
            sees_ring = tl.load(mask_row + w, mask=w < ring_len, other=0) != 0
            sees_new = tl.load(mask_row + ring_len + j, mask=j < n_new, other=0) != 0
            score_ring = tl.where(sees_ring, tl.sum(q[None, :] * k_ring.to(tl.float32), axis=1) * scale, float("-inf"))
            score_new = tl.where(sees_new, tl.sum(q[None, :] * k_new, axis=1) * scale, float("-inf"))
            top = tl.maximum(tl.max(score_ring, axis=0), tl.max(score_new, axis=0))
            p_ring = tl.exp(score_ring - top)
            p_new = tl.exp(score_new - top)
            total = tl.sum(p_ring, axis=0) + tl.sum(p_new, axis=0)
            out = (tl.sum(p_ring[:, None] * v_ring.to(tl.float32), axis=0)
                   + tl.sum(p_new[:, None] * v_new, axis=0)) / total  # fmt: skip
            tl.store(out_ptr + b * s_o_b + n * s_o_n + h * D + d, out.to(DTYPE))

        if (h % (HEADS // KV_HEADS) == 0) & (first_query == 0):  # one program per (b, kv head) writes its rings
            ring_k, ring_v = k_ring, v_ring
            for i in range(0, keep):  # the newest keep frames take their ring entries (distinct per row)
                f = n_new - keep + i
                take = tl.load(slots_ptr + b * keep + i) == w  # [BLOCK_RING]
                if HAS_REAL:
                    take = take & (tl.load(real_ptr + b * n_new + f) != 0)
                frame = qkv_ptr + b * s_qkv_b + f * s_qkv_n
                f_cs = b * s_cs_b + f * s_cs_n + d
                k_f = _rope(tl.load(frame + (HEADS + kvh) * D + d).to(tl.float32),
                            tl.load(frame + (HEADS + kvh) * D + swap).to(tl.float32),
                            tl.load(cos_ptr + f_cs).to(tl.float32), tl.load(sin_ptr + f_cs).to(tl.float32), d,
                            D // 2, DTYPE)  # fmt: skip
                v_f = tl.load(frame + (HEADS + KV_HEADS + kvh) * D + d)
                ring_k = tl.where(take[:, None], k_f.to(DTYPE)[None, :], ring_k)
                ring_v = tl.where(take[:, None], v_f[None, :], ring_v)
            at = ((b * KV_HEADS + kvh) * ring_len + w[:, None]) * D + d[None, :]  # new rings: contiguous
            tl.store(nkr_ptr + at, ring_k, mask=w_in)
            tl.store(nvr_ptr + at, ring_v, mask=w_in)


def codec_attention_reference(qkv: Tensor, cos: Tensor, sin: Tensor, allowed: Tensor, k_ring: Tensor,
                              v_ring: Tensor, slots: Tensor, real: Tensor | None, heads: int,
                              kv_heads: int) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The PyTorch twin (the plain op sequence): -> (out [B * N, H * D], new k_ring, v_ring [B, H_kv, W-1, D])."""
    batch, n, width = qkv.shape
    d = width // (heads + 2 * kv_heads)
    qkv = qkv.view(batch, n, heads + 2 * kv_heads, d)
    qk = qkv[:, :, : heads + kv_heads]
    qk = qk * cos[:, :, None] + rotate_half(qk) * sin[:, :, None]  # [B, N, H + H_kv, D]
    q = qk[:, :, :heads].transpose(1, 2)
    k = qk[:, :, heads:].transpose(1, 2)
    v = qkv[:, :, heads + kv_heads :].transpose(1, 2)
    keys, values = torch.cat([k_ring, k], dim=2), torch.cat([v_ring, v], dim=2)
    if kv_heads != heads:
        repeat = heads // kv_heads
        keys, values = keys.repeat_interleave(repeat, dim=1), values.repeat_interleave(repeat, dim=1)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed[:, None], scale=d**-0.5)
    return out.transpose(1, 2).reshape(batch * n, heads * d), *ring_update(k_ring, v_ring, k, v, slots, real)


def codec_attention(qkv: Tensor, cos: Tensor, sin: Tensor, allowed: Tensor, k_ring: Tensor, v_ring: Tensor,
                    slots: Tensor, real: Tensor | None, heads: int, kv_heads: int,
                    query_block: int | None = None) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """RoPE + sliding-window attention of one pre-transformer layer and its ring update (module docstring) ->
    (out [B * N, H * D], new k_ring, v_ring [B, H_kv, W-1, D]). `query_block`: queries per program (None: 1 up to
    4 new frames, else 4), each program reading the ring once for its block: one program looping over all of a
    25-frame step's queries made the 8 layers' attention ~0.63 of a 5.3 ms bf16 step at 8 x 25 on the H200."""
    if not use_triton(qkv):
        return codec_attention_reference(qkv, cos, sin, allowed, k_ring, v_ring, slots, real, heads, kv_heads)
    batch, n, width = qkv.shape
    d = width // (heads + 2 * kv_heads)
    ring_len = k_ring.shape[2]
    if (width != (heads + 2 * kv_heads) * d or heads % kv_heads or d & (d - 1) or qkv.stride(-1) != 1
            or k_ring.stride(-1) != 1 or v_ring.stride(-1) != 1 or not cos.is_contiguous() or not sin.is_contiguous()
            or not allowed.is_contiguous() or allowed.shape != (batch, n, ring_len + n) or not slots.is_contiguous()
            or (real is not None and (not real.is_contiguous() or real.shape != (batch, n)))):
        raise ValueError("codec_attention: unexpected shapes or strides")  # the caller's own tensors: a bug
    block = query_block or (1 if n <= 4 else 4)
    out = torch.empty(batch, n, heads * d, device=qkv.device, dtype=qkv.dtype)
    new_k = torch.empty(batch, kv_heads, ring_len, d, device=qkv.device, dtype=qkv.dtype)
    new_v = torch.empty_like(new_k)
    _codec_attention_kernel[(batch, heads, triton.cdiv(n, block))](
        qkv, cos, sin, allowed, k_ring, v_ring, slots, slots if real is None else real, out, new_k, new_v,
        n, ring_len, slots.shape[1], d**-0.5,
        qkv.stride(0), qkv.stride(1), cos.stride(0), cos.stride(1), allowed.stride(0), allowed.stride(1),
        k_ring.stride(0), k_ring.stride(1), k_ring.stride(2), v_ring.stride(0), v_ring.stride(1), v_ring.stride(2),
        out.stride(0), out.stride(1),
        HEADS=heads, KV_HEADS=kv_heads, D=d, BLOCK_RING=triton.next_power_of_2(max(ring_len, 1)),
        BLOCK_NEW=triton.next_power_of_2(n), HAS_REAL=real is not None, DTYPE=TRITON_DTYPES[qkv.dtype],
        QUERY_BLOCK=block, num_warps=4,
    )  # fmt: skip
    return out.view(batch * n, heads * d), new_k, new_v
