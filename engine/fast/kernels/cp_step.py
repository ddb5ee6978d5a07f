"""One code-predictor step (projection, every layer, final norm, head) as ONE persistent kernel launch.

At tens of frame rows a step of the fused frame is ~50 kernels of 2-7 us each, most of it launch, ramp and
tail (the H200, 2026-12-04: 3.59 ms a frame at B = 64, 5.7x the weights' floor). Here a grid of one (or a few)
programs per SM runs the step's phases in order, separated by grid barriers:

    phase 0             proj     part = x[index] @ Wp^T in K slices  (x [*, KIN]: stacked rows, or a table)
    per layer l (7 each) norm_in  y = sum(part) (+ bp at l = 0); res = y (l = 0) or res + y; xn = norm_in[l](res)
                         qkv      qkv = xn @ Wqkv[l]^T
                         attn     att = cp_attention(qkv)            (q/k norm, RoPE, cache write, attention)
                         o        part = att @ Wo[l]^T in K slices
                         norm_post y = sum(part); res = res + y;  xn = norm_post[l](res)
                         gate_up  act = silu(xn @ Wg[l]^T) * (xn @ Wu[l]^T)
                         down     part = act @ Wd[l]^T in K slices
    then                 norm_out xn[b] = final_norm(res + sum(part)) at each frame row's last token (b*T + T-1)
                         head     logits = xn @ Whead^T                 -> logits [n, V]

Products run on tensor cores (`tl.dot`, fp32 accumulation) over [BLOCK_R, BLOCK_N] output tiles handed out
round-robin; the products a norm follows are cut into K slices (more work items than SMs) whose fp32 partials
[slices, R, HID] that norm sums in a fixed order before the one rounding; norms one token row per program, attention
one (frame row, kv head) per program. Every value is rounded where the plain layers round (`rms_norm`, `silu_mul`,
`cp_attention` and the products' single rounding), so the step equals the per-kernel fused step up to fp32
summation order, and is bitwise the same whatever the number of programs.

The grid barrier (`_grid_barrier`): every program adds 1 to a counter (release) and waits until it reaches
(barriers passed) x (programs) (acquire); loads of what this launch wrote bypass L1 (".cg"). Before waiting, a
program asks L2 for the weights of its items in the coming phases. All programs must be resident at once, so a
launch runs at most as many per SM as its compiled kernel fits (`resident_per_sm`). The counter is not reset
between barriers; the last program out of the kernel zeroes it (and the exit counter) for the next launch, which the
stream orders after this one.

    sync [2] int32: (barrier arrivals, exits), zero between launches

Under Triton's interpreter programs run one after another, so a barrier would never open: there (and with
`persistent=False`) each phase is a launch of its own, the same code with no barrier. Off the GPU and
interpreter the step is its twin, `step_reference`, the per-kernel twins in the same order.

Measured on the H200 (docs/benchmarks.md, nineteenth session): correct, but slower than the kernel chain (a step
~255 us against ~236 at B = 64; its attention phase a third of it), so `FrameKernels` leaves it off by default.

Shapes: token rows R = n*T (row b*T + t at position start+t, cache slot b); hidden HID, talker hidden KIN,
H query / KV key-value heads of D, intermediate I, vocabulary V, L layers; weights stacked per layer:
    norms [L, 2, HID] (input, post)   qkv [L, (H+2KV)D, HID]   o [L, HID, HD]   gate_up [L, 2I, HID]
    down [L, HID, I]   q_norm, k_norm [L, D]   kv cache [L, 2, S, KV, P, D] (`CodePredictorCache.kv`)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, INTERPRET, use_triton
from engine.fast.kernels.cp_attention import cp_attention_reference
from engine.fast.kernels.rmsnorm import rms_norm_reference
from engine.fast.kernels.silu_mul import silu_mul_reference

PHASES_PER_LAYER = 7
MAX_PROGRAMS_PER_SM = 4

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from engine.fast.kernels.clock import globaltimer
    from engine.fast.kernels.cp_attention import attend_row_head, load_earlier, norm_weights
    from engine.fast.kernels.snake import TRITON_DTYPES

    @triton.jit
    def _grid_barrier(sync_ptr, target):
        """Wait until `target` arrivals have been counted at sync_ptr[0], this program's included. Plain spinning
        reads (volatile: from L2), then one acquiring atomic so this program's later loads see what the others
        stored before they arrived."""
        tl.debug_barrier()  # every warp's stores of the phase are issued before the release below
        tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
        while tl.load(sync_ptr, volatile=True) < target:
            pass
        tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()

    @triton.jit
    def _product(
        a_ptr, a_stride, index_ptr, index_stride, rows, w_ptr, out_ptr, out_stride, part_stride, n_out, pid, nprog,
        K: tl.constexpr, HAS_INDEX: tl.constexpr, SILU_MUL: tl.constexpr, SPLIT: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        STAGES: tl.constexpr, DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
        CACHE: tl.constexpr,
    ):  # fmt: skip
        """a[rows (or a[index[r]])] [*, K] @ W [n_out (x2 with SILU_MUL), K]^T. SPLIT 0: out [rows, n_out] =
        the product (or silu(gate) * up, `silu_mul`'s roundings) rounded once to DTYPE. SPLIT s > 0: K in s
        slices, out [s, rows, n_out] fp32 (slice s at s * part_stride) holds each slice's partial product
        (`_norm_rows` sums them in a fixed order and rounds once). K / max(1, SPLIT) is a multiple of BLOCK_K.
        Work items (row block, column block, slice) go round-robin, columns and slices first, so programs at the
        same time read different weights."""
        slices: tl.constexpr = max(1, SPLIT)
        k_slice: tl.constexpr = K // slices
        row_blocks = tl.cdiv(rows, BLOCK_R)
        items = row_blocks * tl.cdiv(n_out, BLOCK_N) * slices
        for item in range(pid, items, nprog):
            part = item % slices
            tile = item // slices
            r = (tile % row_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
            r_mask = r < rows
            if HAS_INDEX:  # noqa: SIM108 (a constexpr branch)
                source = tl.load(index_ptr + r * index_stride, mask=r_mask, other=0)
            else:
                source = r
            a_rows = a_ptr + source.to(tl.int64)[:, None] * a_stride + part * k_slice  # [BR, 1]
            n = (tile // row_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
            n_mask = n < n_out
            w_rows = w_ptr + n.to(tl.int64)[:, None] * K + part * k_slice  # [BN, 1]
            acc = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
            acc_up = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
            kk = tl.arange(0, BLOCK_K)
            if STAGES > 1:
                # Double-buffered by hand (Triton does not pipeline these loops): the next K tile is requested
                # before this one's product, so a load is always in flight; the last round requests nothing.
                a = tl.load(a_rows + kk[None, :], mask=r_mask[:, None], other=0.0, cache_modifier=CACHE)
                w = tl.load(w_rows + kk[None, :], mask=n_mask[:, None], other=0.0)
                if SILU_MUL:
                    w_up = tl.load(w_rows + n_out * K + kk[None, :], mask=n_mask[:, None], other=0.0)
                for k0 in range(BLOCK_K, k_slice + BLOCK_K, BLOCK_K):
                    more = k0 < k_slice
                    a_next = tl.load(a_rows + k0 + kk[None, :], mask=r_mask[:, None] & more, other=0.0,
                                     cache_modifier=CACHE)  # fmt: skip
                    w_next = tl.load(w_rows + k0 + kk[None, :], mask=n_mask[:, None] & more, other=0.0)
                    acc += tl.dot(a.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), input_precision=PRECISION)
                    if SILU_MUL:
                        w_up_next = tl.load(w_rows + n_out * K + k0 + kk[None, :], mask=n_mask[:, None] & more,
                                            other=0.0)  # fmt: skip
                        acc_up += tl.dot(a.to(DOT_DTYPE), tl.trans(w_up.to(DOT_DTYPE)), input_precision=PRECISION)
                        w_up = w_up_next
                    a = a_next
                    w = w_next
            else:
                for k0 in range(0, k_slice, BLOCK_K):
                    a = tl.load(a_rows + k0 + kk[None, :], mask=r_mask[:, None], other=0.0, cache_modifier=CACHE)
                    w = tl.load(w_rows + k0 + kk[None, :], mask=n_mask[:, None], other=0.0)
                    acc += tl.dot(a.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), input_precision=PRECISION)
                    if SILU_MUL:
                        w_up = tl.load(w_rows + n_out * K + k0 + kk[None, :], mask=n_mask[:, None], other=0.0)
                        acc_up += tl.dot(a.to(DOT_DTYPE), tl.trans(w_up.to(DOT_DTYPE)), input_precision=PRECISION)
            mask = r_mask[:, None] & n_mask[None, :]
            if SPLIT > 0:
                out = out_ptr + part * part_stride + r[:, None] * n_out + n[None, :]
                tl.store(out, acc, mask=mask)
            else:
                if SILU_MUL:  # silu(gate) rounded, times up, each product rounded first, as `silu_mul`
                    gate = acc.to(DTYPE).to(tl.float32)
                    acc = (gate / (1.0 + tl.exp(-gate))).to(DTYPE).to(tl.float32) * acc_up.to(DTYPE).to(tl.float32)
                out = out_ptr + r.to(tl.int64)[:, None] * out_stride + n[None, :]
                tl.store(out, acc.to(DTYPE), mask=mask)

    @triton.jit
    def _prefetch_weights(w_ptr, rows, n_out, pid, nprog, K: tl.constexpr, SILU_MUL: tl.constexpr,
                          SPLIT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
        """Ask L2 for the weight lines this program's items of a `_product` will read (one `prefetch.global.L2`
        per 128 bytes): issued before a barrier wait, the HBM reads overlap the wait instead of following it."""
        slices: tl.constexpr = max(1, SPLIT)
        k_slice: tl.constexpr = K // slices
        LINES: tl.constexpr = max(1, k_slice // 64)  # 128-byte lines of bf16 per row of a slice
        row_blocks = tl.cdiv(rows, BLOCK_R)
        items = row_blocks * tl.cdiv(n_out, BLOCK_N) * slices
        for item in range(pid, items, nprog):
            if item % (row_blocks * slices) < slices:  # one row block's items fetch a column block's weights
                part = item % slices
                n = ((item // slices) // row_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
                rows_at = w_ptr + n.to(tl.int64)[:, None] * K + part * k_slice  # [BN, 1]
                for l0 in tl.static_range(0, LINES, 4):  # four lines of each row at a time (LINES need not be 2^k)
                    line = l0 + tl.arange(0, 4)[None, :]
                    lines = tl.where((n < n_out)[:, None] & (line < LINES), rows_at + line * 64, w_ptr)
                    tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [lines], dtype=tl.int32,
                                              is_pure=False, pack=1)  # fmt: skip
                    if SILU_MUL:
                        tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [lines + n_out * K],
                                                  dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip

    @triton.jit
    def _norm_rows(
        part_ptr, part_stride, bias_ptr, res_ptr, w_ptr, xn_ptr, count, row_step, row_offset, eps, pid, nprog,
        ADD: tl.constexpr, HAS_BIAS: tl.constexpr, SLICES: tl.constexpr, HID: tl.constexpr,
        BLOCK_H: tl.constexpr, DTYPE: tl.constexpr, CACHE: tl.constexpr,
    ):  # fmt: skip
        """For i < count, token row r = i*row_step + row_offset: y = the product's SLICES fp32 partials summed in
        order (+ bias), rounded once; s = res[r] + y (or y without ADD); res[r] = s, xn[i] = w * rms_norm(s),
        rounded as `rms_norm`."""
        cols = tl.arange(0, BLOCK_H)
        mask = cols < HID
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        for i in range(pid, count, nprog):
            row = (i * row_step + row_offset) * HID
            y = tl.load(part_ptr + row + cols, mask=mask, other=0.0, cache_modifier=CACHE)
            for part in tl.static_range(1, SLICES):
                y += tl.load(part_ptr + part * part_stride + row + cols, mask=mask, other=0.0, cache_modifier=CACHE)
            if HAS_BIAS:
                y += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            s = y.to(DTYPE).to(tl.float32)  # the product's one rounding
            if ADD:
                r = tl.load(res_ptr + row + cols, mask=mask, other=0.0, cache_modifier=CACHE).to(tl.float32)
                s = (s + r).to(DTYPE).to(tl.float32)  # rounded like the plain add
            tl.store(res_ptr + row + cols, s.to(DTYPE), mask=mask)
            rstd = tl.rsqrt(tl.sum(s * s, axis=0) / HID + eps)
            normed = (s * rstd).to(DTYPE).to(tl.float32)
            tl.store(xn_ptr + i * HID + cols, (w * normed).to(DTYPE), mask=mask)

    @triton.jit
    def _copy_rows(a_ptr, a_stride, index_ptr, index_stride, rows, out_ptr, pid, nprog,
                   HAS_INDEX: tl.constexpr, HID: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
        """out[r] = a[index[r]] (or a[r]) as fp32: the step's input when the model has no projection."""
        cols = tl.arange(0, BLOCK_H)
        mask = cols < HID
        for r in range(pid, rows, nprog):
            if HAS_INDEX:  # noqa: SIM108 (a constexpr branch)
                source = tl.load(index_ptr + r * index_stride)
            else:
                source = r
            row = tl.load(a_ptr + source * a_stride + cols, mask=mask, other=0.0)
            tl.store(out_ptr + r * HID + cols, row.to(tl.float32), mask=mask)

    @triton.jit
    def _cp_step_kernel(
        x_ptr, x_stride, index_ptr, index_stride, proj_w_ptr, proj_b_ptr,
        norms_ptr, qkv_w_ptr, o_w_ptr, gate_up_w_ptr, down_w_ptr, q_norm_ptr, k_norm_ptr, final_norm_ptr, head_w_ptr,
        cos_ptr, sin_ptr, kv_ptr, kv_layer_stride, kv_stride, stride_s, stride_k, stride_l,
        res_ptr, part_ptr, part_stride, xn_ptr, qkv_ptr, att_ptr, act_ptr, logits_ptr, sync_ptr, stamps_ptr,
        n, start, eps, scale, phase_first, phase_last,
        T: tl.constexpr, KIN: tl.constexpr, HID: tl.constexpr, H: tl.constexpr, KV: tl.constexpr,
        D: tl.constexpr, INTER: tl.constexpr, VOCAB: tl.constexpr, L: tl.constexpr, BLOCK_L: tl.constexpr,
        QKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, BLOCK_H: tl.constexpr,
        HAS_INDEX: tl.constexpr, HAS_PROJ: tl.constexpr, SPLIT: tl.constexpr, PROJ_SLICES: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, DTYPE: tl.constexpr,
        DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, PERSISTENT: tl.constexpr, PREFETCH: tl.constexpr,
        LAYER_PHASES: tl.constexpr, TIMELINE: tl.constexpr, QUERIES_FIRST: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        rows = n * T
        for phase in range(phase_first, phase_last):
            if PERSISTENT:  # noqa: SIM102 (constexpr, then a runtime condition)
                if phase > phase_first:  # wait for the phase before; its weights' reads overlap the wait
                    if TIMELINE:  # the phase before ends here for this program
                        tl.store(stamps_ptr + (2 * phase - 1) * nprog + pid, globaltimer())
                    if PREFETCH:
                        _prefetch_phase(phase, rows, n, pid, nprog, proj_w_ptr, qkv_w_ptr, o_w_ptr, gate_up_w_ptr,
                                        down_w_ptr, head_w_ptr, KIN, HID, H, D, INTER, VOCAB, L, QKV, SPLIT,
                                        BLOCK_R, BLOCK_N, LAYER_PHASES)  # fmt: skip
                        _prefetch_phase(phase + 1, rows, n, pid, nprog, proj_w_ptr, qkv_w_ptr, o_w_ptr,
                                        gate_up_w_ptr, down_w_ptr, head_w_ptr, KIN, HID, H, D, INTER, VOCAB, L, QKV,
                                        SPLIT, BLOCK_R, BLOCK_N, LAYER_PHASES)  # fmt: skip
                    _grid_barrier(sync_ptr, (phase - phase_first) * nprog)
            if TIMELINE:  # this phase's work starts here for this program
                tl.store(stamps_ptr + 2 * phase * nprog + pid, globaltimer())
            if phase == 0:  # the projection's K slices -> part (or the rows themselves)
                if HAS_PROJ:
                    _product(x_ptr, x_stride, index_ptr, index_stride, rows, proj_w_ptr, part_ptr, HID, part_stride,
                             HID, pid, nprog, KIN, HAS_INDEX, False, SPLIT, BLOCK_R, BLOCK_N, BLOCK_K, STAGES, DTYPE,
                             DOT_DTYPE, PRECISION, "")  # fmt: skip
                else:
                    _copy_rows(x_ptr, x_stride, index_ptr, index_stride, rows, part_ptr, pid, nprog, HAS_INDEX, HID,
                               BLOCK_H)  # fmt: skip
            elif phase == 1 + LAYER_PHASES * L:  # the final norm at each frame row's last token
                _norm_rows(part_ptr, part_stride, part_ptr, res_ptr, final_norm_ptr, xn_ptr, n, T, T - 1, eps, pid,
                           nprog, True, False, SPLIT, HID, BLOCK_H, DTYPE, ".cg")  # fmt: skip
            elif phase == 2 + LAYER_PHASES * L:
                _product(xn_ptr, HID, xn_ptr, 0, n, head_w_ptr, logits_ptr, VOCAB, 0, VOCAB, pid, nprog, HID, False,
                         False, 0, BLOCK_R, BLOCK_N, BLOCK_K, STAGES, DTYPE, DOT_DTYPE, PRECISION, ".cg")  # fmt: skip
            else:
                layer = (phase - 1) // LAYER_PHASES
                kind = (phase - 1) % LAYER_PHASES
                if kind == 0:
                    if layer == 0:  # the projection's output (+ bias) is the residual stream
                        _norm_rows(part_ptr, part_stride, proj_b_ptr, res_ptr, norms_ptr, xn_ptr, rows, 1, 0, eps,
                                   pid, nprog, False, HAS_PROJ, PROJ_SLICES, HID, BLOCK_H, DTYPE,
                                   ".cg")  # fmt: skip
                    else:
                        _norm_rows(part_ptr, part_stride, part_ptr, res_ptr, norms_ptr + layer * 2 * HID, xn_ptr, rows,
                                   1, 0, eps, pid, nprog, True, False, SPLIT, HID, BLOCK_H, DTYPE, ".cg")  # fmt: skip
                elif kind == 1:
                    _product(xn_ptr, HID, xn_ptr, 0, rows, qkv_w_ptr + layer * QKV * HID, qkv_ptr, QKV, 0, QKV, pid,
                             nprog, HID, False, False, 0, BLOCK_R, BLOCK_N, BLOCK_K, STAGES, DTYPE, DOT_DTYPE,
                             PRECISION, ".cg")  # fmt: skip
                elif kind == 2:
                    qw, qw_rot, kw, kw_rot = norm_weights(q_norm_ptr + layer * D, k_norm_ptr + layer * D, D)
                    k_cache = kv_ptr + layer * kv_layer_stride  # (int32: ~21M elements at 1.7B, B = 128)
                    for item in range(pid, n * KV, nprog):
                        keys, values = load_earlier(k_cache, k_cache + kv_stride, item // KV, item % KV, start,
                                                    stride_s, stride_k, stride_l, D, BLOCK_L)  # fmt: skip
                        attend_row_head(qkv_ptr, cos_ptr, sin_ptr, qw, qw_rot, kw, kw_rot, k_cache,
                                        k_cache + kv_stride, att_ptr, item // KV, item % KV, start, eps, scale,
                                        stride_s, stride_k, stride_l, keys, values, T, H, KV, G, GP, D, BLOCK_L,
                                        DTYPE, ".cg", QUERIES_FIRST)  # fmt: skip
                elif kind == 3:
                    _product(att_ptr, H * D, att_ptr, 0, rows, o_w_ptr + layer * HID * H * D, part_ptr, HID,
                             part_stride, HID, pid, nprog, H * D, False, False, SPLIT, BLOCK_R, BLOCK_N, BLOCK_K,
                             STAGES, DTYPE, DOT_DTYPE, PRECISION, ".cg")  # fmt: skip
                elif kind == 4:
                    _norm_rows(part_ptr, part_stride, part_ptr, res_ptr, norms_ptr + layer * 2 * HID + HID, xn_ptr,
                               rows, 1, 0, eps, pid, nprog, True, False, SPLIT, HID, BLOCK_H, DTYPE, ".cg")  # fmt: skip
                elif kind == 5:
                    _product(xn_ptr, HID, xn_ptr, 0, rows, gate_up_w_ptr + layer * 2 * INTER * HID, act_ptr, INTER,
                             0, INTER, pid, nprog, HID, False, True, 0, BLOCK_R, BLOCK_N, BLOCK_K, STAGES, DTYPE,
                             DOT_DTYPE, PRECISION, ".cg")  # fmt: skip
                else:
                    _product(act_ptr, INTER, act_ptr, 0, rows, down_w_ptr + layer * HID * INTER, part_ptr, HID,
                             part_stride, HID, pid, nprog, INTER, False, False, SPLIT, BLOCK_R, BLOCK_N, BLOCK_K,
                             STAGES, DTYPE, DOT_DTYPE, PRECISION, ".cg")  # fmt: skip
        if TIMELINE:
            tl.store(stamps_ptr + (2 * phase_last - 1) * nprog + pid, globaltimer())
        if PERSISTENT:  # noqa: SIM102 (constexpr, then a runtime condition): the last program out zeroes both
            if tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu") == nprog - 1:
                tl.store(sync_ptr, 0)
                tl.store(sync_ptr + 1, 0)

    @triton.jit
    def _prefetch_phase(phase, rows, n, pid, nprog, proj_w_ptr, qkv_w_ptr, o_w_ptr, gate_up_w_ptr, down_w_ptr,
                        head_w_ptr, KIN: tl.constexpr, HID: tl.constexpr, H: tl.constexpr, D: tl.constexpr,
                        INTER: tl.constexpr, VOCAB: tl.constexpr, L: tl.constexpr, QKV: tl.constexpr,
                        SPLIT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                        LAYER_PHASES: tl.constexpr):  # fmt: skip
        """`_prefetch_weights` for the product of `phase`, when it is one (the same items as its `_product`)."""
        if phase == 2 + LAYER_PHASES * L:
            _prefetch_weights(head_w_ptr, n, VOCAB, pid, nprog, HID, False, 0, BLOCK_R, BLOCK_N)
        elif (phase >= 1) and (phase < 1 + LAYER_PHASES * L):
            layer = (phase - 1) // LAYER_PHASES
            kind = (phase - 1) % LAYER_PHASES
            if kind == 1:
                _prefetch_weights(qkv_w_ptr + layer * QKV * HID, rows, QKV, pid, nprog, HID, False, 0, BLOCK_R,
                                  BLOCK_N)  # fmt: skip
            elif kind == 3:
                _prefetch_weights(o_w_ptr + layer * HID * H * D, rows, HID, pid, nprog, H * D, False, SPLIT, BLOCK_R,
                                  BLOCK_N)  # fmt: skip
            elif kind == 5:
                _prefetch_weights(gate_up_w_ptr + layer * 2 * INTER * HID, rows, INTER, pid, nprog, HID, True, 0,
                                  BLOCK_R, BLOCK_N)  # fmt: skip
            elif kind == 6:
                _prefetch_weights(down_w_ptr + layer * HID * INTER, rows, HID, pid, nprog, INTER, False, SPLIT,
                                  BLOCK_R, BLOCK_N)  # fmt: skip


@dataclass(frozen=True, slots=True)
class StepTiles:
    """The persistent step's product tile: [block_r token rows, block_n columns], K in block_k loads (`stages`
    2: double-buffered), `num_warps` a program; `persistent` False launches each phase on its own (no barriers).
    Defaults measured on the H200 (tools/frame_profile.py, 2026-12-04)."""

    block_r: int = 64
    block_n: int = 32
    block_k: int = 128
    # 2: the next K tile loaded while this one multiplies (by hand); 1: one tile at a time. On the H200 one at a time
    # was faster (frame_profile, B = 64: 4.12 against 4.62 ms a frame).
    stages: int = 1
    num_warps: int = 4
    persistent: bool = True
    split_k: int = 4  # K slices of the products a norm follows (projection, o, down), summed by that norm
    prefetch: bool = True  # L2 prefetch of a phase's weights before its barrier wait (persistent only)
    # Record when each program starts and ends each phase (%globaltimer, ns) into `PersistentStep.stamps`
    # as [2 * phases, programs] (`PersistentStep.timeline`): row 2p its start of phase p (after the barrier), row
    # 2p + 1 its end (persistent only).
    timeline: bool = False
    # Programs per SM wanted. All must be resident at once or the barrier never opens: a specialization's first
    # launch runs one per SM (always resident), and later ones at most what its compiled registers and shared memory
    # leave room for (`resident_per_sm`). 255 registers x 128 threads leaves room for two.
    programs_per_sm: int = 1
    max_registers: int | None = None  # ptxas's register cap a thread (Triton's `maxnreg`; spills beyond it)
    # 1-token steps' attention loads its query heads with the key and value (`cp_attention.attend_row_head`): one
    # trip to memory instead of two, but the queries stay live across the key's arithmetic (ptxas, sm_90: 312 bytes
    # a thread spilled against 8). Not measured yet.
    queries_first: bool = False


@dataclass(frozen=True, slots=True)
class StepWeights:
    """The code predictor's weights stacked per layer for one kernel (module docstring), and its shape."""

    proj_w: Tensor | None  # [HID, KIN]
    proj_b: Tensor | None  # [HID]
    norms: Tensor  # [L, 2, HID]
    qkv: Tensor  # [L, (H+2KV)D, HID]
    o: Tensor  # [L, HID, HD]
    gate_up: Tensor  # [L, 2I, HID]
    down: Tensor  # [L, HID, I]
    q_norm: Tensor  # [L, D]
    k_norm: Tensor  # [L, D]
    final_norm: Tensor  # [HID]
    heads: list[Tensor]  # [V, HID] per group 1..15
    eps: float
    num_heads: int
    num_kv_heads: int


@cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _sms(device: torch.device) -> int:
    """SMs of a CUDA device; 3 under the interpreter (several programs, unevenly loaded, as on a GPU)."""
    return _sm_count(device.index or 0) if device.type == "cuda" else 3


def resident_per_sm(registers: int, shared: int, warps: int, shared_per_sm: int, registers_per_sm: int = 65536,
                    threads_per_sm: int = 2048, blocks_per_sm: int = 32) -> int:  # fmt: skip
    """How many programs of a compiled kernel one SM holds at once: registers are allocated per warp in units of
    256, and each program also needs its threads and shared memory."""
    per_warp = -(-registers * 32 // 256) * 256
    limits = [registers_per_sm // max(1, per_warp * warps), threads_per_sm // (32 * warps), blocks_per_sm]
    if shared > 0:
        limits.append(shared_per_sm // shared)
    return max(0, min(limits))


def step_reference(weights: StepWeights, x: Tensor, index: Tensor | None, head: int, cos: Tensor, sin: Tensor,
                   kv: Tensor, start: int, tokens: int) -> Tensor:  # fmt: skip
    """The twin: the phases of the module docstring with the per-kernel twins, -> logits [n, V]."""
    w = weights
    rows = x[index] if index is not None else x
    y = F.linear(rows, w.proj_w, w.proj_b) if w.proj_w is not None else rows.clone()
    res: Tensor | None = None
    layers, heads, kv_heads = w.qkv.shape[0], w.num_heads, w.num_kv_heads
    for layer in range(layers):
        xn, res = rms_norm_reference(y, w.norms[layer, 0], w.eps, res)
        qkv = F.linear(xn, w.qkv[layer])
        att = cp_attention_reference(qkv, cos, sin, w.q_norm[layer], w.k_norm[layer], w.eps, kv[layer, 0],
                                     kv[layer, 1], start, tokens, heads, kv_heads)  # fmt: skip
        y = F.linear(att, w.o[layer])
        xn, res = rms_norm_reference(y, w.norms[layer, 1], w.eps, res)
        y = F.linear(silu_mul_reference(F.linear(xn, w.gate_up[layer])), w.down[layer])
    assert res is not None
    last = (-1, tokens, y.shape[-1])
    xn, _ = rms_norm_reference(y.view(last)[:, -1], w.final_norm, w.eps, res.view(last)[:, -1])
    return F.linear(xn, w.heads[head])


class PersistentStep:
    """Runs one code-predictor step as `_cp_step_kernel` over preallocated scratch rows (up to max_rows token
    rows); `logits` returns a view of the step's logits [n, V] (valid until the next step)."""

    def __init__(self, weights: StepWeights, kv: Tensor, max_rows: int, tiles: StepTiles | None = None) -> None:
        self.weights = weights
        self.kv = kv  # [L, 2, S, KV, P, D]
        self.tiles = tiles or StepTiles()
        w = weights
        hid, dtype, device = w.norms.shape[-1], w.norms.dtype, w.norms.device
        self.hidden = hid
        self.head_dim = w.q_norm.shape[-1]
        self.intermediate = w.gate_up.shape[1] // 2
        self.vocab = w.heads[0].shape[0]

        def scratch(width: int) -> Tensor:
            return torch.zeros(max_rows, width, dtype=dtype, device=device)

        self.res, self.xn = scratch(hid), scratch(hid)
        self.parts = torch.zeros(max(1, self.tiles.split_k), max_rows, hid, dtype=torch.float32, device=device)
        self.qkv = scratch(w.qkv.shape[1])
        self.att = scratch(w.num_heads * self.head_dim)
        self.act = scratch(self.intermediate)
        self.out = scratch(self.vocab)
        self.sync = torch.zeros(2, dtype=torch.int32, device=device)
        stamps = 2 * self.phases * _sms(device) * MAX_PROGRAMS_PER_SM
        self.stamps = torch.zeros(stamps, dtype=torch.int64, device=device)
        self.max_rows = max_rows
        self._resident: dict[tuple[object, ...], int] = {}  # (specialization) -> programs per SM its kernel fits
        self._programs = _sms(device)  # the last launch's grid

    def slicing(self, tiles: StepTiles) -> tuple[int, int]:
        """(K slices of the products a norm follows, K per load): the most slices up to `tiles.split_k` that
        leave each slice 16 wide or more, and the largest load up to `tiles.block_k` dividing every K or slice."""
        w = self.weights
        sliced = [w.o.shape[2], w.down.shape[2]] + ([w.proj_w.shape[1]] if w.proj_w is not None else [])
        split = max(1, min(tiles.split_k, self.parts.shape[0]))
        while split > 1 and any(k % split or k // split < 16 for k in sliced):
            split //= 2
        widths = [k // split for k in sliced] + [w.qkv.shape[2]]
        return split, min(tiles.block_k, *(k & -k for k in widths))

    def timeline(self) -> Tensor:
        """The last launch's stamps [2 * phases, programs] (ns; written when `StepTiles.timeline` was on)."""
        programs = self._programs
        return self.stamps[: 2 * self.phases * programs].view(2 * self.phases, programs)

    @property
    def phases(self) -> int:
        return 3 + PHASES_PER_LAYER * self.weights.qkv.shape[0]

    def logits(self, x: Tensor, index: Tensor | None, head: int, cos: Tensor, sin: Tensor, start: int,
               tokens: int) -> Tensor:  # fmt: skip
        """x [R, KIN] token rows (or, with index [R] int64 of any stride, the rows x[index[r]] of a table), the
        step's tokens at positions start..start+tokens-1 (row b*tokens + t, cache slot b), the group's head
        `head` (0-based) -> logits [R / tokens, V] in the activation dtype."""
        rows = index.shape[0] if index is not None else x.shape[0]
        w = self.weights
        if not use_triton(x):
            return step_reference(w, x, index, head, cos, sin, self.kv, start, tokens)
        assert rows <= self.max_rows and rows % tokens == 0 and x.stride(-1) == 1
        n = rows // tokens
        t = self.tiles
        dtype = x.dtype
        fp32_dot = INTERPRET or dtype == torch.float32  # (Triton's interpreter computes bf16 `tl.dot` wrongly)
        kv = self.kv
        persistent = t.persistent and not INTERPRET
        split, block_k = self.slicing(t)
        assert 1 <= t.programs_per_sm <= MAX_PROGRAMS_PER_SM
        key = (tokens, index is None, dtype, x.shape[1], t)
        programs = _sms(x.device) * min(t.programs_per_sm, self._resident.get(key, 1))
        self._programs = programs
        spans = [(0, self.phases)] if persistent else [(p, p + 1) for p in range(self.phases)]
        options = {"maxnreg": t.max_registers} if t.max_registers and not INTERPRET else {}
        for first, last in spans:
            compiled = _cp_step_kernel[(programs,)](
                x, x.stride(0), index if index is not None else x, index.stride(0) if index is not None else 0,
                w.proj_w if w.proj_w is not None else x, w.proj_b if w.proj_b is not None else x,
                w.norms, w.qkv, w.o, w.gate_up, w.down, w.q_norm, w.k_norm, w.final_norm, w.heads[head],
                cos, sin, kv, kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3), kv.stride(4),
                self.res, self.parts, self.parts.stride(0), self.xn, self.qkv, self.att, self.act, self.out, self.sync,
                self.stamps, n, start, w.eps, 1.0 / math.sqrt(self.head_dim), first, last,
                T=tokens, KIN=x.shape[1], HID=self.hidden, H=w.num_heads, KV=w.num_kv_heads, D=self.head_dim,
                INTER=self.intermediate, VOCAB=self.vocab, L=w.qkv.shape[0],
                BLOCK_L=triton.next_power_of_2(kv.shape[4]), HAS_INDEX=index is not None,
                QKV=w.qkv.shape[1], G=w.num_heads // w.num_kv_heads,
                GP=triton.next_power_of_2(w.num_heads // w.num_kv_heads), BLOCK_H=triton.next_power_of_2(self.hidden),
                HAS_PROJ=w.proj_w is not None, BLOCK_R=max(16, min(t.block_r, triton.next_power_of_2(rows))),
                SPLIT=split, PROJ_SLICES=split if w.proj_w is not None else 1, BLOCK_N=t.block_n, BLOCK_K=block_k,
                STAGES=t.stages, DTYPE=TRITON_DTYPES[dtype],
                DOT_DTYPE=tl.float32 if fp32_dot else TRITON_DTYPES[dtype],
                PRECISION="ieee" if fp32_dot else "tf32", PERSISTENT=persistent,
                PREFETCH=persistent and t.prefetch, LAYER_PHASES=PHASES_PER_LAYER,
                TIMELINE=persistent and t.timeline, QUERIES_FIRST=t.queries_first and tokens == 1,
                num_warps=t.num_warps, **options,
            )  # fmt: skip
        if key not in self._resident and x.is_cuda:
            self._resident[key] = self._resident_for(compiled, x.device)
        return self.out[:n]

    @staticmethod
    def _resident_for(compiled: object, device: torch.device) -> int:
        """Programs per SM the compiled kernel fits (`resident_per_sm`), from its registers and shared memory."""
        properties = triton.runtime.driver.active.utils.get_device_properties(device.index or 0)
        kernel: Any = compiled  # Triton's CompiledKernel (registers known once loaded, after its first launch)
        fits = resident_per_sm(kernel.n_regs, kernel.metadata.shared, kernel.metadata.num_warps,
                               properties["max_shared_mem"], properties.get("max_num_regs", 65536))  # fmt: skip
        return max(1, fits)
