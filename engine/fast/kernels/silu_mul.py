"""SwiGLU activation on the fused gate|up projection: out = silu(gate) * up, one kernel instead of three.

Input [R, 2I] (gate columns first, then up), output [R, I]; silu is taken in fp32 and rounded to the
activation dtype before the product, as the plain `F.silu(gate) * up` rounds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, use_triton
from engine.fast.kernels.l2_prefetch import Prefetch

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from engine.fast.kernels.l2_prefetch import prefetch_l2

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, inter, pf0, pf_bytes0, pf1, pf_bytes1, BLOCK: tl.constexpr,
                         PREFETCH: tl.constexpr):  # fmt: skip
        prefetch_l2(pf0, pf_bytes0, pf1, pf_bytes1, PREFETCH)  # the next products' weights (fire and forget)
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inter
        gate = tl.load(x_ptr + row * 2 * inter + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * 2 * inter + inter + cols, mask=mask, other=0.0).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + row * inter + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul_reference(gate_up: Tensor) -> Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_mul(gate_up: Tensor, *, prefetch: Prefetch | None = None) -> Tensor:
    """gate_up [R, 2I] contiguous -> [R, I]. `prefetch`: ranges requested into L2 (`kernels.l2_prefetch`)."""
    if not use_triton(gate_up):
        return silu_mul_reference(gate_up)
    gate_up = gate_up.contiguous()
    rows, width = gate_up.shape
    inter = width // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    prefetch = prefetch or Prefetch.none()
    _silu_mul_kernel[(rows, triton.cdiv(inter, block))](
        gate_up, out, inter, *prefetch.args(), BLOCK=block, PREFETCH=prefetch.enabled, num_warps=4
    )
    return out
