"""SwiGLU activation on the fused gate|up projection: out = silu(gate) * up, one kernel instead of three.

Input [R, 2I] (gate columns first, then up), output [R, I]; silu is taken in fp32 and rounded to the
activation dtype before the product, as the plain `F.silu(gate) * up` rounds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, use_triton

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, inter, BLOCK: tl.constexpr):
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


def silu_mul(gate_up: Tensor) -> Tensor:
    """gate_up [R, 2I] contiguous -> [R, I]."""
    if not use_triton(gate_up):
        return silu_mul_reference(gate_up)
    gate_up = gate_up.contiguous()
    rows, width = gate_up.shape
    inter = width // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(inter, block))](gate_up, out, inter, BLOCK=block, num_warps=4)
    return out
