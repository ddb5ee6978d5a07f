"""Residual codebook lookup in one kernel: out[b, :, t] = sum over k of table[k, codes[b, k, t]], summed in order.

The plain dequantizer looks each codebook up separately (clamp, two gathers, a division) and adds the results
one by one: about five kernels per codebook, 80 for 16 codebooks, all tiny. Here the per-entry division is
done once (`codebook_tables`: the same elementwise `embedding_sum / clamp(cluster_usage, 1e-5)` in the
weights' dtype, so every entry equals what the plain lookup computes) and one kernel gathers and sums, rounding
after each add in codebook order like the plain `total = total + next`.

    tables [K, S, D] (K codebooks of S entries, width D)   codes [B, K, T] int64   ->   out [B, D, T]
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, use_triton

USAGE_EPSILON = 1e-5  # the plain quantizer's clamp

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from engine.fast.kernels.snake import TRITON_DTYPES, round_to

    @triton.jit
    def _codebook_sum_kernel(
        table_ptr, codes_ptr, out_ptr, entries, width, frames,
        sc_b, sc_k, so_b, so_d, BOOKS: tl.constexpr, DTYPE: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0) // frames
        t = tl.program_id(0) % frames
        d = tl.arange(0, BLOCK_D)
        mask = d < width
        code = tl.load(codes_ptr + b * sc_b + t)
        acc = tl.load(table_ptr + code * width + d, mask=mask, other=0.0).to(tl.float32)
        for k in tl.static_range(1, BOOKS):
            code = tl.load(codes_ptr + b * sc_b + k * sc_k + t)
            row = tl.load(table_ptr + (k * entries + code) * width + d, mask=mask, other=0.0)
            acc = round_to(acc + row.to(tl.float32), DTYPE)  # rounded like the plain add
        tl.store(out_ptr + b * so_b + d * so_d + t, acc.to(DTYPE), mask=mask)


def codebook_tables(embedding_sums: list[Tensor], cluster_usages: list[Tensor]) -> Tensor:
    """[K, S, D]: each codebook's entries divided by its clamped usage, in the weights' dtype."""
    return torch.stack(
        [e / u.clamp(min=USAGE_EPSILON)[:, None] for e, u in zip(embedding_sums, cluster_usages, strict=True)]
    ).contiguous()


def codebook_sum_reference(tables: Tensor, codes: Tensor) -> Tensor:
    """The PyTorch twin: per-codebook lookups added in order (each add rounds to the table dtype)."""
    total = tables[0][codes[:, 0]]
    for k in range(1, tables.shape[0]):
        total = total + tables[k][codes[:, k]]
    return total.transpose(1, 2)  # [B, D, T], a view like the plain quantizer's


def codebook_sum(tables: Tensor, codes: Tensor) -> Tensor:
    """tables [K, S, D] contiguous, codes [B, K, T] int64 in [0, S) -> [B, D, T] in the tables' dtype."""
    if tables.dim() != 3 or codes.dim() != 3 or codes.shape[1] != tables.shape[0]:
        raise ValueError(
            f"codebook_sum: tables [K, S, D] and codes [B, K, T] must agree on K, got {tuple(tables.shape)} "
            f"and {tuple(codes.shape)}"
        )
    if not use_triton(tables):
        return codebook_sum_reference(tables, codes)
    books, entries, width = tables.shape
    batch, _, frames = codes.shape
    codes = codes.contiguous()
    out = torch.empty((batch, width, frames), device=tables.device, dtype=tables.dtype)
    if batch * frames == 0:
        return out
    _codebook_sum_kernel[(batch * frames,)](
        tables.contiguous(), codes, out, entries, width, frames,
        codes.stride(0), codes.stride(1), out.stride(0), out.stride(1),
        BOOKS=books, DTYPE=TRITON_DTYPES[tables.dtype], BLOCK_D=triton.next_power_of_2(width), num_warps=2,
    )  # fmt: skip
    return out
