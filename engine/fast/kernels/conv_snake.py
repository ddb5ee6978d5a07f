"""A vocoder conv and the SnakeBeta after it in one kernel: a causal, dilated conv1d over channels-last activations
as an implicit GEMM on tensor cores, then bias, the residual and SnakeBeta with `kernels/snake.py`'s roundings.

The channels-last fast codec runs each residual unit as cuDNN conv1 (k 7, dilation d) -> SnakeBeta pass (bias, act2)
-> cuDNN conv2 (k 1) -> SnakeBeta pass (bias, residual, the next act1): two full passes over the unit's [B, L, C]
activations and four launches. Here each conv writes SnakeBeta's output itself (and the pre-activation sum where the
next residual needs it): two launches, and the passes' reads and writes are gone (at 8 streams x 25 frames in bf16
the 29 SnakeBeta passes were 1.08 of a 5.29 ms step on the H200; docs/benchmarks.md, fourteenth session).

    x        [B, C_in, H + L]   the conv's input buffer (history first) in [B, H + L, C_in] memory (channels-last)
    taps     [k, C_in, C_out]   the conv weight, tap-major and contiguous (`conv_taps`)
    conv[b, n, t] = sum over taps j and channels c of x[b, c, t + j * dilation] * taps[j, c, n],  t < L
    v = round(conv) + bias[n] (+ residual[b, n, t]), each add rounded;  sum_out = v;  out = snake(v)
    residual, sum_out, out  [B, C_out, L] in [B, L, C_out] memory (views into larger buffers too)

One program computes a [BLOCK_M rows of the flattened (b, t), BLOCK_N output channels] tile: per tap and per
BLOCK_K input channels, a [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] product accumulated in fp32 (bf16 products are
exact in fp32; fp32 activations multiply in TF32 or exactly, as the codec's precision says). The conv output is
rounded to the activation dtype before the bias, where cuDNN's output would be, so the steps after it are the
SnakeBeta kernel's, rounding for rounding; only the conv's summation order differs from cuDNN's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, INTERPRET, use_triton
from engine.fast.kernels.snake import snake_reference

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from engine.fast.kernels.snake import TRITON_DTYPES, round_hw, snake_activation

    @triton.jit
    def _conv_snake_kernel(
        x_ptr, w_ptr, bias_ptr, res_ptr, sum_ptr, out_ptr, alpha_ptr, inv_beta_ptr,
        rows, length, c_in, c_out, dilation,
        sx_b, sx_t, sr_b, sr_t, ss_b, ss_t, so_b, so_t,
        TAPS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, WRITE_SUM: tl.constexpr,
        PRECISE_SIN: tl.constexpr, HW_ROUND: tl.constexpr, DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
        UPCAST_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # output rows: flattened (b, t)
        r_in = r < rows
        b = (r // length).to(tl.int64)
        t = (r % length).to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_in = n < c_out
        k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        x_rows = x_ptr + b * sx_b + t * sx_t  # [BLOCK_M]: each row's first input sample (tap 0, channel 0)
        for tap in range(TAPS):
            a_rows = x_rows + tap * dilation * sx_t
            for c0 in range(0, c_in, BLOCK_K):
                c = c0 + k
                c_ok = c < c_in
                a = tl.load(a_rows[:, None] + c[None, :], mask=r_in[:, None] & c_ok[None, :], other=0.0)
                w = tl.load(w_ptr + (tap * c_in + c)[:, None] * c_out + n[None, :],
                            mask=c_ok[:, None] & n_in[None, :], other=0.0)  # fmt: skip
                if UPCAST_DOT:  # the interpreter multiplies bf16 as raw bits: give it the (exact) fp32 values
                    acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
                else:
                    acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)

        mask = r_in[:, None] & n_in[None, :]
        v = round_hw(acc, DTYPE, HW_ROUND)  # the conv's output in the activation dtype
        if HAS_BIAS:
            v = round_hw(v + tl.load(bias_ptr + n, mask=n_in, other=0.0).to(tl.float32)[None, :], DTYPE, HW_ROUND)
        if HAS_RES:
            res = tl.load(res_ptr + b[:, None] * sr_b + t[:, None] * sr_t + n[None, :], mask=mask, other=0.0)
            v = round_hw(v + res.to(tl.float32), DTYPE, HW_ROUND)
        if WRITE_SUM:
            tl.store(sum_ptr + b[:, None] * ss_b + t[:, None] * ss_t + n[None, :], v.to(DTYPE), mask=mask)
        alpha = tl.load(alpha_ptr + n, mask=n_in, other=0.0).to(tl.float32)[None, :]
        inv_beta = tl.load(inv_beta_ptr + n, mask=n_in, other=0.0).to(tl.float32)[None, :]
        y = snake_activation(v, alpha, inv_beta, DTYPE, HW_ROUND, PRECISE_SIN)
        tl.store(out_ptr + b[:, None] * so_b + t[:, None] * so_t + n[None, :], y.to(DTYPE), mask=mask)


@dataclass(frozen=True, slots=True)
class ConvTile:
    """One program's tile: rows of the flattened (b, t) (`block_m`), output channels (`block_n`, at most; fewer for
    narrow convs), input channels a step (`block_k`; None: 64 for 16-bit activations, 32 for fp32), warps and
    software-pipelining stages. `tools/conv_snake_bench.py` sweeps these at the vocoder's shapes."""

    block_m: int = 64
    block_n: int = 128
    block_k: int | None = None
    num_warps: int = 4
    num_stages: int = 3


DEFAULT_TILE = ConvTile()  # a first guess, not yet tuned (fifteenth session: slower than cuDNN + SnakeBeta)


def conv_taps(weight: Tensor) -> Tensor:
    """A Conv1d weight [C_out, C_in, k] as the kernel reads it: [k, C_in, C_out], contiguous."""
    return weight.detach().permute(2, 1, 0).contiguous()


def conv_snake_reference(
    x: Tensor, taps: Tensor, dilation: int, alpha: Tensor, inv_beta: Tensor, *, bias: Tensor | None = None,
    residual: Tensor | None = None, out: Tensor | None = None, sum_out: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """The PyTorch twin: the conv (bias-free, in the activation dtype), then `snake_reference`."""
    conv = F.conv1d(x, taps.permute(2, 1, 0), dilation=dilation)
    return snake_reference(conv, alpha, inv_beta, bias=bias, residual=residual, out=out, sum_out=sum_out)


def conv_snake(
    x: Tensor, taps: Tensor, dilation: int, alpha: Tensor, inv_beta: Tensor, *, bias: Tensor | None = None,
    residual: Tensor | None = None, out: Tensor | None = None, sum_out: Tensor | None = None,
    tf32: bool = True, tile: ConvTile = DEFAULT_TILE,
) -> Tensor:  # fmt: skip
    """Conv (module docstring) + [bias] + [residual] + SnakeBeta into `out` (new, channels-last, if None); returns
    `out`. `sum_out` receives the pre-activation sum. `tf32`: fp32 activations multiply in 3xTF32 (else exactly):
    Triton's one-pass TF32 truncates both operands where cuDNN's convs round them, and on the H200 that put the
    decoder at 3.5x plain tf32's error against fp32 (codec_check, fifteenth session; the rule allows 1.1x)."""
    k, c_in, c_out = taps.shape
    batch, channels, total = x.shape
    length = total - (k - 1) * dilation
    if channels != c_in or length < 1 or taps.dtype != x.dtype:
        raise ValueError(f"conv_snake: x {tuple(x.shape)} {x.dtype} does not fit taps {tuple(taps.shape)} {taps.dtype}")
    if out is None:
        out = torch.empty(batch, length, c_out, device=x.device, dtype=x.dtype).transpose(1, 2)
    if not use_triton(x):
        return conv_snake_reference(x, taps, dilation, alpha, inv_beta, bias=bias, residual=residual, out=out,
                                    sum_out=sum_out)  # fmt: skip
    res_t = residual if residual is not None else out
    sum_t = sum_out if sum_out is not None else out
    for name, t in (("x", x), ("residual", res_t), ("sum_out", sum_t), ("out", out)):
        if t.stride(1) != 1 and t.shape[1] > 1:
            raise ValueError(f"conv_snake: {name} must be channels-last ([B, C, L] with channel stride 1)")
    if not taps.is_contiguous():
        raise ValueError("conv_snake: taps must be contiguous [k, C_in, C_out] (conv_taps)")
    rows = batch * length
    block_m = tile.block_m
    block_n = min(tile.block_n, max(16, triton.next_power_of_2(c_out)))
    block_k = tile.block_k or (64 if x.dtype != torch.float32 else 32)
    block_k = min(block_k, max(16, triton.next_power_of_2(c_in)))
    grid = (triton.cdiv(rows, block_m), triton.cdiv(c_out, block_n))
    _conv_snake_kernel[grid](
        x, taps, bias if bias is not None else alpha, res_t, sum_t, out, alpha, inv_beta,
        rows, length, c_in, c_out, dilation,
        x.stride(0), x.stride(2), res_t.stride(0), res_t.stride(2), sum_t.stride(0), sum_t.stride(2),
        out.stride(0), out.stride(2),
        TAPS=k, HAS_BIAS=bias is not None, HAS_RES=residual is not None, WRITE_SUM=sum_out is not None,
        PRECISE_SIN=not INTERPRET, HW_ROUND=not INTERPRET, DTYPE=TRITON_DTYPES[x.dtype],
        DOT_PRECISION=("tf32x3" if tf32 else "ieee") if x.dtype == torch.float32 else "tf32",
        UPCAST_DOT=INTERPRET and x.dtype != torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=tile.num_warps, num_stages=tile.num_stages,
    )  # fmt: skip
    return out
