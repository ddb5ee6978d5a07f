"""RMSNorm with the residual add folded in: one pass per row instead of the eight kernels of the plain layer.

    s   = residual + x                     (activation dtype, as the plain `h = x + attn(...)`)
    out = weight * (s32 * rsqrt(mean(s32^2) + eps)).to(dtype)     (the plain RMSNorm's rounding)

Rows R, width N. Returns (out [R,N], s [R,N]); without a residual s is x itself.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, use_triton
from engine.fast.kernels.pdl import enabled as pdl_enabled
from engine.fast.kernels.pdl import launch_options

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from engine.fast.kernels.pdl import wait_for_producer

    @triton.jit
    def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, n, eps,
                         HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # a constant: before the wait
        wait_for_producer(PDL)
        x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * n + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)  # rounded like the plain add
            tl.store(sum_ptr + row * n + cols, x, mask=mask)
        x32 = x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x32 * x32, axis=0) / n + eps)  # rsqrtf, as torch.rsqrt
        normed = (x32 * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + row * n + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None) -> tuple[Tensor, Tensor]:
    s = x if residual is None else residual + x
    s32 = s.to(torch.float32)
    normed = (s32 * torch.rsqrt(s32.pow(2).mean(-1, keepdim=True) + eps)).to(s.dtype)
    return weight * normed, s


def rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None, *,
             pdl: bool = False) -> tuple[Tensor, Tensor]:  # fmt: skip
    """x, residual [R,N] contiguous, weight [N] -> (normed [R,N], residual + x [R,N]). `pdl`: launched as a
    programmatic dependent of the kernel before it (`kernels.pdl`), the norm weight read before waiting for it."""
    if not use_triton(x):
        return rms_norm_reference(x, weight, eps, residual)
    x = x.contiguous()
    residual = residual.contiguous() if residual is not None else None
    rows, n = x.shape
    out = torch.empty_like(x)
    s = torch.empty_like(x) if residual is not None else x
    _rms_norm_kernel[(rows,)](
        x, residual if residual is not None else x, weight, out, s, n, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(n), PDL=pdl_enabled(pdl),
        num_warps=8 if n >= 2048 else 4, **launch_options(pdl),
    )  # fmt: skip
    return out, s
