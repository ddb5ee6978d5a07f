"""SnakeBeta with its neighbours folded in: one read of each input, one write of each output, the plain rounding.

The plain codec runs SnakeBeta as five elementwise kernels and the bias and residual adds around it as two
more, each a full pass over a [B, C, L] activation. Here one pass does all of it, per row (b, c):

    v = x                                      conv output (bias-free), or any activation
    v = v + head[b, c, t]     for t < H       transposed-conv overlap carried from the last call (optional)
    v = v + bias[c]                            the conv's bias (optional)
    v = v + residual[b, c, t]                  the residual branch (optional)
    sum_out = v                                written only when asked (the next residual)
    out = v + inv_beta[c] * sin(v * alpha[c])^2

`alpha` = exp(log alpha) and `inv_beta` = 1 / (exp(log beta) + 1e-9) are precomputed by the caller in the
activation dtype, exactly as the plain module computes them. Every step is computed in fp32 and rounded to the
activation dtype where the plain op sequence rounds (after each add, after x*alpha, sin, the square, the
product and the final add), so bf16 results equal the plain modules' up to the sin implementation; in fp32 the
rounding steps are no-ops. Rounding faithfully matters: a bf16 SnakeBeta rounded once instead of five times
moves the full-size decoder's waveform ~4e-2 (relative L2) away from the plain bf16 decoder.

Tensors: x, residual, outputs [B, C, L] (views into larger buffers too, e.g. after a conv's history); head
[B, C, H]; params [C]. Two layouts, two programs, the same arithmetic:
- NCL (every tensor's time axis contiguous): one program per (b, c) row and time block, the params scalars;
- anything else, e.g. the channels-last vocoder's [B, L, C] memory seen as [B, C, L] (`FastCodecDecoder`
  with `channels_last`): tiles of [time block, channel block] over each tensor's own strides, so a tensor
  whose channels are contiguous is read and written along them (Triton specializes a stride of 1).
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, INTERPRET, use_triton

if HAVE_TRITON:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import libdevice

    @triton.jit
    def round_to(v, DTYPE: tl.constexpr):
        # fp32 -> DTYPE -> fp32, round to nearest even. bf16 in integer arithmetic: no compiler pass can fold
        # it away (a cast pair could be), and Triton's CPU interpreter rounds its float casts differently.
        if DTYPE == tl.bfloat16:  # noqa: SIM300
            bits = v.to(tl.uint32, bitcast=True)
            bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
            return bits.to(tl.float32, bitcast=True)
        else:
            return v.to(DTYPE).to(tl.float32)

    @triton.jit
    def round_hw(v, DTYPE: tl.constexpr, HW: tl.constexpr):
        # `round_to` by the hardware's own conversion (one cvt.rn instruction each way, RNE as `round_to`) where
        # HW: the integer form costs ~6 instructions, and SnakeBeta rounds 7 times per element, enough to make
        # the bf16 kernel compute-bound (slower than the fp32 one on the H200). The interpreter keeps the integer
        # form (its casts round differently); tests/fast/test_codec_kernels.py checks both agree bitwise on CUDA.
        if HW:
            return v.to(DTYPE).to(tl.float32)
        else:
            return round_to(v, DTYPE)

    @triton.jit
    def snake_activation(v, alpha, inv_beta, DTYPE: tl.constexpr, HW_ROUND: tl.constexpr, PRECISE_SIN: tl.constexpr):
        # v + inv_beta * sin(v * alpha)^2 over fp32 values of any shape, rounded to DTYPE where the plain module's
        # five ops round (after x*alpha, sin, the square, the product and the add): every SnakeBeta kernel's last step
        scaled = round_hw(v * alpha, DTYPE, HW_ROUND)
        if PRECISE_SIN:  # noqa: SIM108 (libdevice sinf, as torch.sin; the interpreter has no libdevice)
            s = round_hw(libdevice.sin(scaled), DTYPE, HW_ROUND)
        else:
            s = round_hw(tl.sin(scaled), DTYPE, HW_ROUND)
        return round_hw(v + round_hw(inv_beta * round_hw(s * s, DTYPE, HW_ROUND), DTYPE, HW_ROUND), DTYPE, HW_ROUND)

    @triton.jit
    def _snake_kernel(
        x_ptr, head_ptr, bias_ptr, res_ptr, sum_ptr, out_ptr, alpha_ptr, inv_beta_ptr,
        channels, length, head_len,
        sx_b, sx_c, sh_b, sh_c, sr_b, sr_c, ss_b, ss_c, so_b, so_c,
        HAS_HEAD: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, WRITE_SUM: tl.constexpr,
        PRECISE_SIN: tl.constexpr, HW_ROUND: tl.constexpr, DTYPE: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)  # one (batch, channel) row per program: the params are scalars
        b = row // channels
        c = row % channels
        t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = t < length
        v = tl.load(x_ptr + b * sx_b + c * sx_c + t, mask=mask, other=0.0).to(tl.float32)
        if HAS_HEAD:
            in_head = mask & (t < head_len)
            h = tl.load(head_ptr + b * sh_b + c * sh_c + t, mask=in_head, other=0.0).to(tl.float32)
            v = tl.where(in_head, round_hw(v + h, DTYPE, HW_ROUND), v)
        if HAS_BIAS:
            v = round_hw(v + tl.load(bias_ptr + c).to(tl.float32), DTYPE, HW_ROUND)
        if HAS_RES:
            r = tl.load(res_ptr + b * sr_b + c * sr_c + t, mask=mask, other=0.0).to(tl.float32)
            v = round_hw(v + r, DTYPE, HW_ROUND)
        if WRITE_SUM:
            tl.store(sum_ptr + b * ss_b + c * ss_c + t, v.to(DTYPE), mask=mask)
        alpha = tl.load(alpha_ptr + c).to(tl.float32)
        inv_beta = tl.load(inv_beta_ptr + c).to(tl.float32)
        y = snake_activation(v, alpha, inv_beta, DTYPE, HW_ROUND, PRECISE_SIN)
        tl.store(out_ptr + b * so_b + c * so_c + t, y.to(DTYPE), mask=mask)

    @triton.jit
    def _snake_tile_kernel(
        x_ptr, head_ptr, bias_ptr, res_ptr, sum_ptr, out_ptr, alpha_ptr, inv_beta_ptr,
        channels, length, head_len,
        sx_b, sx_c, sx_t, sh_b, sh_c, sh_t, sr_b, sr_c, sr_t, ss_b, ss_c, ss_t, so_b, so_c, so_t,
        HAS_HEAD: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, WRITE_SUM: tl.constexpr,
        PRECISE_SIN: tl.constexpr, HW_ROUND: tl.constexpr, DTYPE: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    ):  # fmt: skip
        # One [BLOCK_T, BLOCK_C] tile of batch row b; the same steps and roundings as `_snake_kernel`.
        b = tl.program_id(2)
        t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T))[:, None]
        c = (tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C))[None, :]
        in_c = c < channels
        mask = (t < length) & in_c
        v = tl.load(x_ptr + b * sx_b + c * sx_c + t * sx_t, mask=mask, other=0.0).to(tl.float32)
        if HAS_HEAD:
            in_head = mask & (t < head_len)
            h = tl.load(head_ptr + b * sh_b + c * sh_c + t * sh_t, mask=in_head, other=0.0).to(tl.float32)
            v = tl.where(in_head, round_hw(v + h, DTYPE, HW_ROUND), v)
        if HAS_BIAS:
            v = round_hw(v + tl.load(bias_ptr + c, mask=in_c, other=0.0).to(tl.float32), DTYPE, HW_ROUND)
        if HAS_RES:
            r = tl.load(res_ptr + b * sr_b + c * sr_c + t * sr_t, mask=mask, other=0.0).to(tl.float32)
            v = round_hw(v + r, DTYPE, HW_ROUND)
        if WRITE_SUM:
            tl.store(sum_ptr + b * ss_b + c * ss_c + t * ss_t, v.to(DTYPE), mask=mask)
        alpha = tl.load(alpha_ptr + c, mask=in_c, other=0.0).to(tl.float32)
        inv_beta = tl.load(inv_beta_ptr + c, mask=in_c, other=0.0).to(tl.float32)
        y = snake_activation(v, alpha, inv_beta, DTYPE, HW_ROUND, PRECISE_SIN)
        tl.store(out_ptr + b * so_b + c * so_c + t * so_t, y.to(DTYPE), mask=mask)

    TRITON_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def snake_params(log_alpha: Tensor, log_beta: Tensor) -> tuple[Tensor, Tensor]:
    """(alpha, inv_beta) [C] from the module's stored logs, with the plain module's ops and dtype."""
    return torch.exp(log_alpha), 1.0 / (torch.exp(log_beta) + 1e-9)


def snake_reference(
    x: Tensor,
    alpha: Tensor,
    inv_beta: Tensor,
    *,
    head: Tensor | None = None,
    bias: Tensor | None = None,
    residual: Tensor | None = None,
    out: Tensor | None = None,
    sum_out: Tensor | None = None,
) -> Tensor:
    """The PyTorch twin: the plain modules' op sequence (each op rounds to the activation dtype)."""
    v = x
    if head is not None:
        overlap = head.shape[-1]
        v = torch.cat([v[..., :overlap] + head, v[..., overlap:]], dim=-1)
    if bias is not None:
        v = v + bias[:, None]
    if residual is not None:
        v = v + residual
    if sum_out is not None:
        sum_out.copy_(v)
    y = v + inv_beta[None, :, None] * torch.pow(torch.sin(v * alpha[None, :, None]), 2)
    if out is None:
        return y
    out.copy_(y)
    return out


def snake(
    x: Tensor,
    alpha: Tensor,
    inv_beta: Tensor,
    *,
    head: Tensor | None = None,
    bias: Tensor | None = None,
    residual: Tensor | None = None,
    out: Tensor | None = None,
    sum_out: Tensor | None = None,
) -> Tensor:
    """Fused [head +] [bias +] [residual +] SnakeBeta over x [B, C, L]; writes `out` (new if None) and returns it.

    `sum_out`, when given, receives the pre-activation sum v (the next residual unit's skip input).
    """
    _check(x, alpha, inv_beta, head, bias, residual, out, sum_out)
    if not use_triton(x):
        return snake_reference(
            x, alpha, inv_beta, head=head, bias=bias, residual=residual, out=out, sum_out=sum_out
        )
    batch, channels, length = x.shape
    if out is None:
        out = torch.empty((batch, channels, length), device=x.device, dtype=x.dtype)
    head_t = head if head is not None else x
    res_t = residual if residual is not None else x
    sum_t = sum_out if sum_out is not None else out
    if not all(_time_contiguous(t) for t in (x, head_t, res_t, sum_t, out)):
        _snake_tiles(x, head, head_t, bias, res_t, sum_t, out, alpha, inv_beta, residual is not None,
                     sum_out is not None)  # fmt: skip
        return out
    block = min(1024, max(16, triton.next_power_of_2(length)))
    grid = (batch * channels, triton.cdiv(length, block))  # rows on axis 0: up to 2^31 - 1 (axis 1: 65535)
    _snake_kernel[grid](
        x, head_t, bias if bias is not None else alpha, res_t, sum_t, out, alpha, inv_beta,
        channels, length, head.shape[-1] if head is not None else 0,
        x.stride(0), x.stride(1), head_t.stride(0), head_t.stride(1), res_t.stride(0), res_t.stride(1),
        sum_t.stride(0), sum_t.stride(1), out.stride(0), out.stride(1),
        HAS_HEAD=head is not None, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
        WRITE_SUM=sum_out is not None, PRECISE_SIN=not INTERPRET, HW_ROUND=not INTERPRET,
        DTYPE=TRITON_DTYPES[x.dtype], BLOCK=block, num_warps=4 if block >= 512 else 2,
    )  # fmt: skip
    return out


def _time_contiguous(t: Tensor) -> bool:
    return t.shape[-1] <= 1 or t.stride(-1) == 1


def _snake_tiles(
    x: Tensor, head: Tensor | None, head_t: Tensor, bias: Tensor | None, res_t: Tensor, sum_t: Tensor,
    out: Tensor, alpha: Tensor, inv_beta: Tensor, has_res: bool, write_sum: bool,
) -> None:
    """The tile program (module docstring): any strides, e.g. channels-last tensors."""
    batch, channels, length = x.shape
    block_c = min(64, max(16, triton.next_power_of_2(channels)))
    block_t = max(16, 2048 // block_c)
    grid = (triton.cdiv(length, block_t), triton.cdiv(channels, block_c), batch)
    strides = [s for t in (x, head_t, res_t, sum_t, out) for s in t.stride()]
    _snake_tile_kernel[grid](
        x, head_t, bias if bias is not None else alpha, res_t, sum_t, out, alpha, inv_beta,
        channels, length, head.shape[-1] if head is not None else 0, *strides,
        HAS_HEAD=head is not None, HAS_BIAS=bias is not None, HAS_RES=has_res, WRITE_SUM=write_sum,
        PRECISE_SIN=not INTERPRET, HW_ROUND=not INTERPRET, DTYPE=TRITON_DTYPES[x.dtype], BLOCK_T=block_t,
        BLOCK_C=block_c, num_warps=4,
    )  # fmt: skip


def _check(
    x: Tensor,
    alpha: Tensor,
    inv_beta: Tensor,
    head: Tensor | None,
    bias: Tensor | None,
    residual: Tensor | None,
    out: Tensor | None,
    sum_out: Tensor | None,
) -> None:
    if x.dim() != 3:
        raise ValueError(f"snake expects x [B, C, L], got {tuple(x.shape)}")
    channels = x.shape[1]
    for name, param in (("alpha", alpha), ("inv_beta", inv_beta), ("bias", bias)):
        if param is not None and (param.shape != (channels,) or not param.is_contiguous()):
            raise ValueError(
                f"snake: {name} must be a contiguous [{channels}] tensor, got {tuple(param.shape)}"
            )
    for name, t in (("x", x), ("residual", residual), ("out", out), ("sum_out", sum_out)):
        if t is None:
            continue
        if t.shape != x.shape or t.dtype != x.dtype or t.device != x.device:
            raise ValueError(
                f"snake: {name} must match x ({tuple(x.shape)}, {x.dtype}), got {tuple(t.shape)}"
            )
    if head is not None and (head.shape[:2] != x.shape[:2] or head.shape[-1] > x.shape[-1]):
        raise ValueError(f"snake: head must be [B, C, H <= L], got {tuple(head.shape)}")
