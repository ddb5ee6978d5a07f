"""Decode attention for grouped-query heads over the talker's slot cache, each row at its own length.

One query token per row b attends to keys 0..lengths[b]-1 of cache slot slots[b]. Split-KV
("flash-decoding"): the context is cut into SPLITS chunks of CHUNK keys, program (b, kv head, split)
handles the G = H/K query heads sharing that kv head (one read of the keys serves all G), and writes a
partial (max, sum, weighted values) in fp32, which a second kernel merges, or (`SplitConfig.merge_last`, off)
the program of that (b, kv head) to finish last (each counts its arrival; a row whose keys fit one split writes
its output at once): one launch fewer a layer, yet slower in the talker's chain (below). A layout of one split
(`SplitConfig.programs` 1) needs no merge: its programs write the output. The grid is
static (CUDA-graph capture), so it is sized for the cache's capacity, but a program whose chunk starts at
or past its row's length returns before reading or writing anything, and a chunk's loop stops at the
row's length: a row costs the keys it has. How long a chunk is depends on the batch (`default_split_config`):
64 keys for up to 4 rows, whose few programs must each stream little, up to 256 for 128 rows, where short
chunks only add partials to merge. (Before programs returned early, 64-key chunks of a 2048-position cache
made 30 of 32 programs per (row, kv head) do masked work: at 80 RPS this kernel was 12 % of all GPU time.)
Interleaved splits (`SplitConfig.programs`; the default at 33-64 rows): P programs per (row, kv head) whatever
the capacity, program p taking the row's key blocks p, p + P, p + 2P, ... into one partial, so the grid does not
grow with the cache and a short row still spreads over P programs.

    q [B,H,D]   k_cache, v_cache [S,K,L,D]   slots [B] int64   lengths [B] int64   -> out [B,H,D]
    partials: m, l [B,H,SPLITS] fp32, acc [B,H,SPLITS,D] fp32;   arrivals [B*K] int32, zero between launches

`decode_attention_rope` does `qk_norm_rope`'s work in the split programs instead of a kernel of its own: each
program norms and rotates its G query heads straight from the qkv row, and the one program whose chunk holds the
new position (lengths[b] - 1) norms and rotates the new key, writes key and value into the cache and reads them
back after a block barrier; the same roundings as `qk_norm_rope` then `decode_attention` (the norms' sums of
squares may add up in another order across threads).

    qkv [B,(H+2K)D]   cos, sin [B,D]   (then as above)   -> out [B,H,D]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, use_triton
from engine.fast.kernels.arrivals import arrival_counts
from engine.fast.kernels.pdl import enabled as pdl_enabled
from engine.fast.kernels.pdl import launch_options
from engine.fast.kernels.qk_norm_rope import qk_norm_rope_reference
from engine.model.layers import attend

BLOCK_N = 64  # keys per inner step
KEYS_PER_SPLIT = 256  # a 2048-position cache: 8 splits of 256 keys (4 steps); a row of L keys uses ceil(L/256)
MAX_SPLITS = 64
# A timeline row per program of the fused-rope split kernel (`decode_attention_rope(timeline=...)`, CUDA only):
# %globaltimer ns at its start, after the PDL wait, once its queries are normed, once the new key and value are in
# the cache, after the key loop, after its partial's store; then its SM. Programs with no keys write nothing.
TIMELINE_STAGES = 8
TIMELINE_NAMES = ("wait", "loads + q norm", "new key", "key loop", "partial")


@dataclass(frozen=True)
class SplitConfig:
    """How the split kernel cuts and walks a row's keys (`tools/attention_bench.py` sweeps these)."""

    keys_per_split: int = KEYS_PER_SPLIT  # at most this many keys a program (a power of two, >= block_n)
    block_n: int = BLOCK_N  # keys per inner step
    num_warps: int = 4
    num_stages: int | None = None  # Triton's software pipelining depth (None: its default)
    # Interleaved splits: this many programs per (row, kv head) whatever the cache's capacity (a power of two;
    # keys_per_split then unused), program p taking key blocks p, p + P, p + 2P, ... of block_n keys. The grid no
    # longer spans the capacity (a 2048-position cache in 128-key splits is 16 programs a (row, kv head), 15 with
    # nothing to do at context 128), and short contexts still spread over P programs. None: contiguous splits.
    programs: int | None = None
    # The program of a (row, kv head) whose partial arrives last merges the row's splits (else `_merge_kernel`, one
    # launch more a layer). Slower in the talker's chain: H100, 2026-12-05, `tools/frame_profile.py` at context 128,
    # talker step 1.668 / 1.892 / 1.917 / 2.350 ms at B = 1 / 4 / 16 / 64 against 1.655 / 1.892 / 1.885 / 2.303
    # with the merge kernel (a programmatic dependent: o's product, released at the attention's start, then shares
    # the SMs with it where the merge kernel stood between them). Off.
    merge_last: bool = False
    # The fused-rope split kernel norms and rotates only the G real query heads of its kv head, one [1, D] row at a
    # time, instead of the whole 16-row tensor-core tile (2 of 16 rows real in the talker: ~400 of the kernel's ~1,100
    # SASS instructions a thread go to the padding). The same rounding steps; each head's sum of squares is added
    # in another order, so not bit for bit. H100, 2026-12-05, `tools/frame_profile.py` at context 128: talker step
    # -0.015 / -0.005 / -0.015 / -0.014 ms at B = 1 / 4 / 16 / 64 (twenty-sixth session), -0.015 / -0.005 / -0.017 /
    # -0.015 (twenty-seventh); the GPU check passed with it (H100, 6d651e1). Off: `tools/frame_profile.py` tattn_tile_q.
    q_heads: bool = True
    # The fused-rope split kernel reads its whole key blocks as bulk tensor copies (TMA, Hopper and later: one
    # descriptor load a [BLOCK, D] block instead of a thread's share of vector loads), the last partial block as
    # masked loads. Unmeasured: at 64 rows the key loop waits ~7 us on the memory queue (`tools/attention_timeline.py
    # --chained`, H100, 2026-12-05), and fewer, larger requests may drain it faster. Off.
    tma: bool = False


def default_split_config(rows: int) -> SplitConfig:
    """The split kernel's configuration for a batch of `rows` query rows: shorter splits where few rows give
    few programs. H200, 2026-12-02 (`tools/attention_bench.py`, talker heads, contexts 32-255 / 256-511, us a
    call against 256-key splits): 1 row 5.4 / 6.4 (7.5 / 8.9), 4 rows 7.0 / 8.7 (8.8 / 9.6) with 64 keys; 16
    rows 10.7 / 14.0 (11.7 / 15.2), 64 rows 21.2 / 35.9 (21.8 / 37.1) with 128 keys and 2 stages; at 128 rows
    256-key splits stay best (35.1 / 63.9; the keys then stream at ~3 TB/s). At 33-64 rows, 2 interleaved programs
    per (row, kv head) walking 32-key blocks (H200, 2026-12-05, `tools/frame_profile.py` variant `tattn_p2_32`: the
    talker's B = 64 decode step 1.996 -> 1.948 ms at context 128 and 2.547 -> 2.459 at 256..511; at 16 and 32 rows
    it lost at context 128, +0.02 / +0.03 ms)."""
    if rows <= 4:
        return SplitConfig(keys_per_split=64)
    if 32 < rows <= 64:
        return SplitConfig(programs=2, block_n=32)
    if rows <= 64:
        return SplitConfig(keys_per_split=128, num_stages=2)
    return SplitConfig()

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from engine.fast.kernels.clock import globaltimer, sm_id
    from engine.fast.kernels.pdl import wait_for_producer

    @triton.jit
    def _splits_used(length, SPLITS: tl.constexpr, CHUNK: tl.constexpr, INTERLEAVED: tl.constexpr):
        """How many splits hold a row of `length` keys: interleaved, one a CHUNK-key block up to SPLITS; else one
        a CHUNK-key chunk."""
        used = (length + CHUNK - 1) // CHUNK
        if INTERLEAVED:
            used = tl.minimum(used, SPLITS)
        return used

    @triton.jit
    def _finish(m, l_sum, acc, m_ptr, l_ptr, acc_ptr, out_ptr, count_ptr, b, heads, sp, used, d, q_mask,
                H: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
                MERGE_LAST: tl.constexpr):  # fmt: skip
        """Split sp's partial of row b's heads [GP] (max m [GP], sum l_sum [GP], weighted values acc [GP, D], fp32;
        masked by q_mask) when `used` splits hold the row's keys: stored for `_merge_kernel`; or (MERGE_LAST) the
        heads' output, divided at once when the row has one split, else merged by the program of this (row, kv
        head) that arrives last at count_ptr[b * KV + kv head] (release / acquire, after every warp's stores), in
        split order (the same sums whichever arrives last); that program zeroes the count for the next launch."""
        part = (b * H + heads) * SPLITS + sp  # [GP]
        out_at = out_ptr + (b * H + heads)[:, None] * D + d[None, :]  # [GP, D]
        if SPLITS == 1:  # one split holds every key: the output at once, nothing to merge
            tl.store(out_at, (acc / l_sum[:, None]).to(out_ptr.dtype.element_ty), mask=q_mask[:, None])
        elif MERGE_LAST:
            if used == 1:
                tl.store(out_at, (acc / l_sum[:, None]).to(out_ptr.dtype.element_ty), mask=q_mask[:, None])
            else:
                _store_partial(m, l_sum, acc, m_ptr, l_ptr, acc_ptr, part, d, q_mask, D)
                count = count_ptr + b * tl.num_programs(1) + tl.program_id(1)
                tl.debug_barrier()  # every warp's partial is stored before the release below
                arrived = tl.atomic_add(count, 1, sem="acq_rel", scope="gpu")
                tl.debug_barrier()
                if arrived == used - 1:  # the last in: every used split's partial is visible
                    first = (b * H + heads) * SPLITS  # [GP]: split 0's partial of each head
                    m_max = tl.full([GP], float("-inf"), tl.float32)
                    for k in tl.range(0, used):  # L2 reads (".cg"): other SMs wrote these
                        m_max = tl.maximum(m_max, tl.load(m_ptr + first + k, mask=q_mask, other=0.0,
                                                          cache_modifier=".cg"))  # fmt: skip
                    total = tl.zeros([GP, D], tl.float32)
                    weights = tl.zeros([GP], tl.float32)
                    for k in tl.range(0, used):
                        w = tl.exp(tl.load(m_ptr + first + k, mask=q_mask, other=0.0, cache_modifier=".cg") - m_max)
                        weights += w * tl.load(l_ptr + first + k, mask=q_mask, other=0.0, cache_modifier=".cg")
                        total += w[:, None] * tl.load(acc_ptr + (first + k)[:, None] * D + d[None, :],
                                                      mask=q_mask[:, None], other=0.0, cache_modifier=".cg")  # fmt: skip
                    tl.store(out_at, (total / weights[:, None]).to(out_ptr.dtype.element_ty), mask=q_mask[:, None])
                    tl.store(count, 0)
        else:
            _store_partial(m, l_sum, acc, m_ptr, l_ptr, acc_ptr, part, d, q_mask, D)

    @triton.jit
    def _store_partial(m, l_sum, acc, m_ptr, l_ptr, acc_ptr, part, d, q_mask, D: tl.constexpr):
        """A split's partial (max, sum, weighted values) into the partial buffers at rows `part` [GP]."""
        tl.store(m_ptr + part, m, mask=q_mask)
        tl.store(l_ptr + part, l_sum, mask=q_mask)
        tl.store(acc_ptr + part[:, None] * D + d[None, :], acc, mask=q_mask[:, None])

    @triton.jit
    def _block_weights(q, k, k_mask, m, l_sum, scale, PRECISION: tl.constexpr):
        """Queries q [GP, D] against one block of keys k [BLOCK, D] (k_mask [BLOCK]: those that count), online
        softmax -> (new max [GP], the old partial's rescale alpha [GP], the block's weights p [GP, BLOCK], new sum
        [GP]); the caller adds p's values into its partial as acc * alpha + p v."""
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [GP,BLOCK] fp32
        s = tl.where(k_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # every block holds at least one key: finite
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        return m_new, alpha, p, l_sum * alpha + tl.sum(p, axis=1)

    @triton.jit
    def _attend_chunk(q, k_ptr, v_ptr, base, lo, hi, stride_l, scale, b, heads, d, H: tl.constexpr,
                      GP: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, PRECISION: tl.constexpr,
                      STEP: tl.constexpr, k_desc=None, v_desc=None, slot=0, j=0, bulk_end=0,
                      TMA: tl.constexpr = False):  # fmt: skip
        """Queries q [GP, D] (heads [GP] of row b) over the cache's BLOCK-key blocks starting at lo, lo + STEP, ...
        below hi (at `base`, `stride_l` apart) -> the split's partial (max [GP], sum [GP], weighted values [GP, D])
        in fp32. STEP = BLOCK: keys lo..hi-1; SPLITS * BLOCK: interleaved. TMA: the whole blocks as bulk copies
        through the caches' tensor descriptors (`k_desc`, `v_desc` over [S, K, L, D], block [1, 1, BLOCK, D], at
        cache slot `slot`, kv head `j`) while they end at or before `bulk_end`, the rest as masked loads."""
        m = tl.full([GP], float("-inf"), tl.float32)
        l_sum = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        if TMA:
            whole = tl.maximum(bulk_end - BLOCK - lo + STEP, 0) // STEP  # blocks lo + i * STEP ending by bulk_end
            for i in range(0, whole):
                at = [slot.to(tl.int32), j, (lo + i * STEP).to(tl.int32), 0]  # (descriptor offsets are 32-bit)
                k = k_desc.load(at).reshape(BLOCK, D)
                v = v_desc.load(at).reshape(BLOCK, D)
                m, alpha, p, l_sum = _block_weights(q, k, tl.full([BLOCK], 1, tl.int1), m, l_sum, scale, PRECISION)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            lo = lo + whole * STEP  # the partial block, if any, below
        for start in range(lo, hi, STEP):  # stops at the row's length; the last block's tail is masked
            n = start + tl.arange(0, BLOCK)
            k_mask = n < hi
            offsets = base + n[:, None] * stride_l + d[None, :]
            k = tl.load(k_ptr + offsets, mask=k_mask[:, None], other=0.0)  # [BLOCK,D]
            m, alpha, p, l_sum = _block_weights(q, k, k_mask, m, l_sum, scale, PRECISION)
            v = tl.load(v_ptr + offsets, mask=k_mask[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        return m, l_sum, acc

    @triton.jit
    def _split_kernel(
        q_ptr, k_ptr, v_ptr, slots_ptr, lengths_ptr, m_ptr, l_ptr, acc_ptr, out_ptr, count_ptr, scale,
        stride_s, stride_k, stride_l,
        H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
        SPLITS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
        INTERLEAVED: tl.constexpr, MERGE_LAST: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0)
        j = tl.program_id(1)
        sp = tl.program_id(2)
        wait_for_producer(PDL)
        length = tl.load(lengths_ptr + b)
        lo = sp * CHUNK
        if lo < length:  # else: nothing to attend; the merge reads only the splits a row has
            if INTERLEAVED:  # noqa: SIM108 (constexpr)
                hi = length
            else:
                hi = tl.minimum(lo + CHUNK, length)
            slot = tl.load(slots_ptr + b)
            g = tl.arange(0, GP)
            d = tl.arange(0, D)
            heads = j * G + g  # [GP]: the query heads of kv head j
            q_mask = g < G
            q = tl.load(q_ptr + (b * H + heads[:, None]) * D + d[None, :], mask=q_mask[:, None], other=0.0)
            base = slot * stride_s + j * stride_k
            m, l_sum, acc = _attend_chunk(q, k_ptr, v_ptr, base, lo, hi, stride_l, scale, b, heads, d, H, GP, D,
                                          BLOCK, PRECISION, SPLITS * BLOCK if INTERLEAVED else BLOCK)  # fmt: skip
            _finish(m, l_sum, acc, m_ptr, l_ptr, acc_ptr, out_ptr, count_ptr, b, heads, sp,
                    _splits_used(length, SPLITS, CHUNK, INTERLEAVED), d, q_mask, H, GP, D, SPLITS,
                    MERGE_LAST)  # fmt: skip

    @triton.jit
    def _norm_rope_rows(x, x_rot, w, w_rot, c, s, eps, d, D: tl.constexpr, DTYPE: tl.constexpr):
        """Heads [GP, D] (and their rotate-half partners) -> RMS-normed, rotated heads in DTYPE, rounded step by
        step as `qk_norm_rope` rounds them."""
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)  # rsqrtf, as torch.rsqrt
        n = (w[None, :] * (x * rstd[:, None]).to(DTYPE).to(tl.float32)).to(DTYPE).to(tl.float32)
        n_rot = (w_rot[None, :] * (x_rot * rstd[:, None]).to(DTYPE).to(tl.float32)).to(DTYPE).to(tl.float32)
        n_rot = tl.where(d[None, :] < D // 2, -n_rot, n_rot)  # rotate_half: [-x2, x1]
        return ((n * c[None, :]).to(DTYPE).to(tl.float32) + (n_rot * s[None, :]).to(DTYPE).to(tl.float32)).to(DTYPE)

    @triton.jit
    def _split_rope_kernel(
        qkv_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, k_ptr, v_ptr, slots_ptr, lengths_ptr, m_ptr, l_ptr, acc_ptr,
        out_ptr, count_ptr, stamps_ptr, k_desc, v_desc, scale, eps, stride_s, stride_k, stride_l,
        H: tl.constexpr, KV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
        SPLITS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
        INTERLEAVED: tl.constexpr, MERGE_LAST: tl.constexpr, Q_HEADS: tl.constexpr, TIMELINE: tl.constexpr,
        TMA: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0)
        j = tl.program_id(1)
        sp = tl.program_id(2)
        stamps = stamps_ptr + ((b * tl.num_programs(1) + j) * tl.num_programs(2) + sp) * TIMELINE
        started = globaltimer() if TIMELINE else 0
        wait_for_producer(PDL)
        waited = globaltimer() if TIMELINE else 0
        length = tl.load(lengths_ptr + b)
        lo = sp * CHUNK
        if lo < length:  # else: nothing to attend; the merge reads only the splits a row has
            if INTERLEAVED:  # the new position's block is this program's
                hi = length
                holds_new = ((length - 1) // BLOCK) % SPLITS == sp
            else:  # the new position is in this chunk
                hi = tl.minimum(lo + CHUNK, length)
                holds_new = length - 1 < hi
            slot = tl.load(slots_ptr + b)
            dtype = k_ptr.dtype.element_ty
            g = tl.arange(0, GP)
            d = tl.arange(0, D)
            d_rot = (d + D // 2) % D
            heads = j * G + g  # [GP]: the query heads of kv head j
            q_mask = g < G
            row = qkv_ptr + b * (H + 2 * KV) * D
            c = tl.load(cos_ptr + b * D + d).to(tl.float32)
            s_ = tl.load(sin_ptr + b * D + d).to(tl.float32)
            qw = tl.load(qw_ptr + d).to(tl.float32)
            qw_rot = tl.load(qw_ptr + d_rot).to(tl.float32)
            if Q_HEADS:  # the G real heads normed and rotated one at a time as [1, D], then placed in the [GP, D] tile
                q = tl.zeros([GP, D], dtype)
                for h in tl.static_range(G):
                    one = tl.arange(0, 1)
                    head_q = row + (j * G + h + one[:, None]) * D  # [1, D]
                    q_h = _norm_rope_rows(tl.load(head_q + d[None, :]).to(tl.float32),
                                          tl.load(head_q + d_rot[None, :]).to(tl.float32), qw, qw_rot, c, s_, eps, d,
                                          D, dtype)  # fmt: skip
                    q = tl.where(g[:, None] == h, q_h, q)
            else:  # all GP rows (the tensor-core tile's 16), the padding ones included
                x = tl.load(row + heads[:, None] * D + d[None, :], mask=q_mask[:, None], other=0.0).to(tl.float32)
                x_rot = tl.load(row + heads[:, None] * D + d_rot[None, :], mask=q_mask[:, None], other=0.0)
                q = _norm_rope_rows(x, x_rot.to(tl.float32), qw, qw_rot, c, s_, eps, d, D, dtype)  # [GP, D]
            if TIMELINE:  # (the barriers keep each stamp after the work before it, every warp's)
                tl.debug_barrier()
                tl.store(stamps, started)
                tl.store(stamps + 1, waited)
                tl.store(stamps + 2, globaltimer())
            base = slot * stride_s + j * stride_k
            if holds_new:  # this program's keys include the new position: its key and value go into the cache first
                one = tl.arange(0, 1)
                head = row + (H + j + one[:, None]) * D  # [1, D]
                kw = tl.load(kw_ptr + d).to(tl.float32)
                kw_rot = tl.load(kw_ptr + d_rot).to(tl.float32)
                k_new = _norm_rope_rows(tl.load(head + d[None, :]).to(tl.float32),
                                        tl.load(head + d_rot[None, :]).to(tl.float32), kw, kw_rot, c, s_, eps, d, D,
                                        dtype)  # fmt: skip
                new = base + (length - 1) * stride_l + one[:, None] * 0 + d[None, :]
                tl.store(k_ptr + new, k_new)
                tl.store(v_ptr + new, tl.load(row + (H + KV + j + one[:, None]) * D + d[None, :]))
                tl.debug_barrier()  # the block's threads read those cache rows below
            if TIMELINE:
                tl.store(stamps + 3, globaltimer())
            m, l_sum, acc = _attend_chunk(q, k_ptr, v_ptr, base, lo, hi, stride_l, scale, b, heads, d, H, GP, D,
                                          BLOCK, PRECISION, SPLITS * BLOCK if INTERLEAVED else BLOCK, k_desc, v_desc,
                                          slot, j, tl.minimum(hi, length - 1), TMA)  # fmt: skip
            # (bulk copies stop before the new key: this program has just stored it, and the async proxy that reads
            # them is not ordered after a store without a proxy fence)
            if TIMELINE:
                tl.debug_barrier()
                tl.store(stamps + 4, globaltimer() + (tl.sum(l_sum, axis=0) * 0).to(tl.int64))  # after the loop's sums
            _finish(m, l_sum, acc, m_ptr, l_ptr, acc_ptr, out_ptr, count_ptr, b, heads, sp,
                    _splits_used(length, SPLITS, CHUNK, INTERLEAVED), d, q_mask, H, GP, D, SPLITS,
                    MERGE_LAST)  # fmt: skip
            if TIMELINE:
                tl.debug_barrier()
                tl.store(stamps + 5, globaltimer())
                tl.store(stamps + 6, sm_id().to(tl.int64))

    @triton.jit
    def _merge_kernel(m_ptr, l_ptr, acc_ptr, lengths_ptr, out_ptr, H: tl.constexpr, SPLITS: tl.constexpr,
                      CHUNK: tl.constexpr, D: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
        row = tl.program_id(0)  # b * H + head
        wait_for_producer(PDL)
        length = tl.load(lengths_ptr + row // H)
        sp = tl.arange(0, SPLITS)
        used = sp * CHUNK < length  # the splits the row's keys reach (split 0 always: length >= 1)
        d = tl.arange(0, D)
        m = tl.load(m_ptr + row * SPLITS + sp, mask=used, other=float("-inf"))
        l_sum = tl.load(l_ptr + row * SPLITS + sp, mask=used, other=0.0)
        acc = tl.load(acc_ptr + (row * SPLITS + sp[:, None]) * D + d[None, :], mask=used[:, None], other=0.0)
        m_max = tl.max(m, axis=0)
        w = tl.where(used, tl.exp(m - m_max), 0.0)
        out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * l_sum, axis=0)
        tl.store(out_ptr + row * D + d, out.to(out_ptr.dtype.element_ty))


def decode_attention_reference(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, lengths: Tensor) -> Tensor:
    """The plain layers' masked SDPA over each row's slot, keys beyond its length hidden."""
    keys, values = k_cache[slots], v_cache[slots]  # [B,K,L,D]
    visible = torch.arange(k_cache.shape[2], device=q.device) < lengths[:, None]  # [B,L]
    return attend(q[:, :, None], keys, values, visible[:, None, None], False)[:, :, 0]


def split_layout(max_len: int, config: SplitConfig | None = None) -> tuple[int, int]:
    """Cache capacity -> (splits, keys per split); both static, so the grid is the same every step. Splits are
    a power of two (the merge's arange) of at most `keys_per_split` keys, whole `block_n` steps. Interleaved
    (`SplitConfig.programs`): (programs, block_n), split p's first key at p * block_n."""
    config = config or SplitConfig()
    if config.programs is not None:
        if config.programs < 1 or config.programs & (config.programs - 1):
            raise ValueError(f"interleaved splits: programs must be a power of two, got {config.programs}")
        return config.programs, config.block_n
    splits = min(MAX_SPLITS, 1 << max(0, math.ceil(math.log2(math.ceil(max_len / config.keys_per_split)))))
    chunk = math.ceil(math.ceil(max_len / splits) / config.block_n) * config.block_n
    return splits, chunk


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, lengths: Tensor,
                     config: SplitConfig | None = None) -> Tensor:  # fmt: skip
    """q [B,H,D] contiguous; every lengths[b] >= 1 -> [B,H,D] in q's dtype. `config`: the split kernel's
    (default: `default_split_config` for B rows)."""
    if not use_triton(q):
        return decode_attention_reference(q, k_cache, v_cache, slots, lengths)
    rows, heads, d = q.shape
    kv_heads = k_cache.shape[1]
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    q, slots, lengths = q.contiguous(), slots.contiguous(), lengths.contiguous()  # dense indexing (no stride-0 views)
    group = heads // kv_heads
    config = config or default_split_config(rows)
    return _split_and_merge(_split_kernel, (q,), rows, heads, kv_heads, d, q.dtype, k_cache, v_cache, slots, lengths,
                            config, 1.0 / math.sqrt(d), G=group, GP=max(16, triton.next_power_of_2(group)))  # fmt: skip


def _split_and_merge(split_kernel: object, leading: tuple[object, ...], rows: int, heads: int, kv_heads: int,
                     d: int, dtype: torch.dtype, k_cache: Tensor, v_cache: Tensor, slots: Tensor, lengths: Tensor,
                     config: SplitConfig, *scalars: float, pdl: bool = False, after_counts: tuple[object, ...] = (),
                     **constexprs: int) -> Tensor:  # fmt: skip
    """Launch a split kernel over (rows, kv heads, splits) with its partial buffers, merging in its last program
    (`config.merge_last`) or then in `_merge_kernel` -> [B,H,D]. `leading`: the split kernel's arguments before the
    caches; `scalars`: after the output and arrival counts. `pdl`: launched as programmatic dependents
    (`kernels.pdl`), each waiting for the kernel before it first. `after_counts`: the split kernel's arguments
    between the arrival counts and the scalars."""
    splits, chunk = split_layout(k_cache.shape[2], config)
    device = k_cache.device
    m = torch.empty(rows, heads, splits, dtype=torch.float32, device=device)
    l_sum = torch.empty_like(m)
    acc = torch.empty(rows, heads, splits, d, dtype=torch.float32, device=device)
    out = torch.empty(rows, heads, d, dtype=dtype, device=device)
    # the arrival counts (`m` in their place is never read without merge_last)
    counts = arrival_counts("decode attention", device, rows * kv_heads) if config.merge_last else m
    split_kernel[(rows, kv_heads, splits)](  # type: ignore[index]
        *leading, k_cache, v_cache, slots, lengths, m, l_sum, acc, out, counts, *after_counts, *scalars,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        H=heads, D=d, SPLITS=splits, CHUNK=chunk, BLOCK=config.block_n,
        PRECISION="ieee" if dtype == torch.float32 else "tf32",  # fp32 twins: no TF32 products
        num_warps=config.num_warps, **({} if config.num_stages is None else {"num_stages": config.num_stages}),
        PDL=pdl_enabled(pdl), INTERLEAVED=config.programs is not None, MERGE_LAST=config.merge_last,
        **launch_options(pdl), **constexprs,
    )  # fmt: skip
    if not config.merge_last and splits > 1:  # (one split writes the output itself)
        _merge_kernel[(rows * heads,)](m, l_sum, acc, lengths, out, H=heads, SPLITS=splits, CHUNK=chunk, D=d,
                                       PDL=pdl_enabled(pdl), num_warps=4, **launch_options(pdl))  # fmt: skip
    return out


def decode_attention_rope(
    qkv: Tensor, cos: Tensor, sin: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float, k_cache: Tensor,
    v_cache: Tensor, slots: Tensor, lengths: Tensor, num_heads: int, num_kv_heads: int,
    config: SplitConfig | None = None, pdl: bool = False, timeline: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """`qk_norm_rope` (at positions lengths - 1) then `decode_attention`, in the split kernel: qkv [B,(H+2K)D]
    contiguous, cos/sin [B,D] -> [B,H,D] in qkv's dtype; the new keys and values are written into the caches.
    `pdl`: the split and merge kernels as programmatic dependents (`kernels.pdl`). `timeline` (CUDA only,
    diagnostics): int64 [B, K, splits, TIMELINE_STAGES], each program's row of stamps (`TIMELINE_NAMES`)."""
    rows, d = qkv.shape[0], cos.shape[-1]
    if not use_triton(qkv):
        q = qk_norm_rope_reference(qkv, cos, sin, q_weight, k_weight, eps, k_cache, v_cache, slots, lengths - 1,
                                   num_heads, num_kv_heads)  # fmt: skip
        return decode_attention_reference(q, k_cache, v_cache, slots, lengths)
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    assert qkv.shape[1] == (num_heads + 2 * num_kv_heads) * d and k_cache.shape[1] == num_kv_heads
    qkv, cos, sin, slots, lengths = (t.contiguous() for t in (qkv, cos, sin, slots, lengths))
    group = num_heads // num_kv_heads
    config = config or default_split_config(rows)
    descriptors: tuple[object, ...] = (k_cache, v_cache)  # (unread without `config.tma`)
    if config.tma:
        from triton.tools.tensor_descriptor import TensorDescriptor  # (only here: Triton 3.4+)

        shape = [1, 1, config.block_n, d]  # one kv head's block of keys
        descriptors = tuple(TensorDescriptor.from_tensor(cache, block_shape=shape) for cache in (k_cache, v_cache))
    return _split_and_merge(_split_rope_kernel, (qkv, cos, sin, q_weight, k_weight), rows, num_heads, num_kv_heads,
                            d, qkv.dtype, k_cache, v_cache, slots, lengths, config, 1.0 / math.sqrt(d), eps,
                            pdl=pdl, after_counts=(lengths if timeline is None else timeline, *descriptors),
                            KV=num_kv_heads, G=group, GP=max(16, triton.next_power_of_2(group)),
                            Q_HEADS=config.q_heads, TIMELINE=0 if timeline is None else TIMELINE_STAGES,
                            TMA=config.tma)  # fmt: skip
