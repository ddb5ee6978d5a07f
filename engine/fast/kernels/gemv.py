"""Skinny products for a few token rows, y = epilogue(prologue(x) @ W^T), streaming W once at full width.

At a handful of rows a projection is a weight stream: W [N,K] bf16 is read once and every row is a dot
product against it. cuBLAS runs the code predictor's shapes at 0.3-2 TB/s at one row; here the N output
columns are cut into BLOCK_N-wide tiles, one program each (hundreds of programs over 132 SMs), each reading
its [BLOCK_N, K] slice of W in wide contiguous [BLOCK_N, BLOCK_K] loads and accumulating in fp32. Few rows
(BLOCK_R < 16) multiply on the CUDA cores, accumulating the [BLOCK_R, BLOCK_N, BLOCK_K] tile products
elementwise and summing over K once at the end (a cross-thread sum per tile inside the loop, with wider tiles,
ran 1.5-5x slower at one row on the H200); more rows use `tl.dot` (tensor cores) on the same tiles. The first W tile
is requested before the norm prologue reads x, so the two latencies overlap; when K fits one tile the prologue
keeps x (+ residual) and the norm weight in registers for the product instead of reading them twice.

Around the product, in the same kernel, so the layer needs fewer launches (each optional):

    gather    x row r = x[index[r]]                           (an embedding lookup feeding the product)
    prologue  s = x + residual; xn = norm_w * rms_norm(s)     (`rmsnorm.rms_norm`'s rounding; program 0
                                                               writes s, the next residual)
    epilogue  y = acc + bias                                  (nn.Linear with bias, rounded once)
              y = silu(gate) * up                             (W = [gate; up] of 2N rows: `silu_mul`'s rounding)

    x [*, K] (rows addressed by index or 0..R-1; any row stride)   W [N or 2N, K] contiguous
    -> y [R, N] in x's dtype (and s [R, K] when a residual is given)

Each program recomputes the prologue's row norm from x (it reads all of x for its product anyway). With
many rows that extra read of x costs more than a separate norm kernel: the caller chooses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, use_triton
from engine.fast.kernels.arrivals import arrival_counts
from engine.fast.kernels.pdl import enabled as pdl_enabled
from engine.fast.kernels.pdl import launch_options
from engine.fast.kernels.rmsnorm import rms_norm_reference
from engine.fast.kernels.silu_mul import silu_mul_reference

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from engine.fast.kernels.pdl import wait_for_producer
    from engine.fast.kernels.snake import TRITON_DTYPES, round_to

    @triton.jit
    def _rounded(v, DTYPE: tl.constexpr):
        """fp32 values rounded to DTYPE where the plain ops round (no call at all for fp32 twins)."""
        if DTYPE != tl.float32:  # noqa: SIM300
            v = round_to(v, DTYPE)
        return v

    @triton.jit
    def _x_tile(x_rows, res_rows, norm_ptr, kk, r_mask, rstd, K: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                HAS_NORM: tl.constexpr, DTYPE: tl.constexpr):  # fmt: skip
        """The prologue's x tile [BR, BK] at columns kk, from memory: x (+ residual), normed, as fp32."""
        k_mask = kk < K
        mask = r_mask[:, None] & k_mask[None, :]
        x = tl.load(x_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            x = _rounded(x + tl.load(res_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32), DTYPE)
        if HAS_NORM:
            weight = tl.load(norm_ptr + kk, mask=k_mask, other=0.0).to(tl.float32)
            x = _rounded(weight[None, :] * _rounded(x * rstd[:, None], DTYPE), DTYPE)
        return x

    @triton.jit
    def _sum_k_slices(acc, acc_up, part_ptr, count_ptr, pid, SILU_MUL: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, SUM_GROUP: tl.constexpr):  # fmt: skip
        """Split K: store this program's fp32 tile(s) [BR, BN] as slice program_id(1)'s partial, count the arrival
        at count_ptr[pid] (release / acquire), and in the program that arrives last sum every slice's partial in
        slice order, so the sum is the same whichever arrives last; that program also zeroes the count for the
        next launch. Returns the sums and `last` [BR] (every row True in that program only; the others' sums are
        zeros and their stores are masked off by it). (Masks are vectors: the interpreter refuses a scalar one.)
        The partials are read SUM_GROUP slices at a time, their loads in flight together (a slice a round trip
        made the last program's sum of 8 64-column slices 8 L2 round trips long); the adds keep slice order."""
        units: tl.constexpr = 2 if SILU_MUL else 1
        size: tl.constexpr = BLOCK_R * BLOCK_N
        tile = tl.arange(0, BLOCK_R)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # [BR,BN]
        slices = part_ptr + pid * units * size  # partials [SPLIT_K, programs, units, BR, BN] fp32
        stride = tl.num_programs(0) * units * size  # one slice's partials
        mine = slices + tl.program_id(1) * stride
        tl.store(mine + tile, acc)
        if SILU_MUL:
            tl.store(mine + size + tile, acc_up)
        tl.debug_barrier()  # every warp's partial is stored before the release below
        arrived = tl.atomic_add(count_ptr + pid, 1, sem="acq_rel", scope="gpu")
        tl.debug_barrier()
        keep = (tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.int32) + arrived) == SPLIT_K - 1  # [BR,BN]
        total = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
        total_up = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
        for k0 in tl.range(0, SPLIT_K, SUM_GROUP):  # L2 reads (".cg"): another SM wrote these
            for i in tl.static_range(SUM_GROUP):
                at = slices + (k0 + i) * stride
                total += tl.load(at + tile, mask=keep, other=0.0, cache_modifier=".cg")
                if SILU_MUL:
                    total_up += tl.load(at + size + tile, mask=keep, other=0.0, cache_modifier=".cg")
        if arrived == SPLIT_K - 1:
            tl.store(count_ptr + pid, 0)
        return total, total_up, (tl.zeros([BLOCK_R], dtype=tl.int32) + arrived) == SPLIT_K - 1

    @triton.jit
    def _gemv_kernel(
        x_ptr, index_ptr, res_ptr, norm_ptr, w_ptr, bias_ptr, out_ptr, sum_ptr, part_ptr, count_ptr,
        rows, n_out, stride_x, stride_index, stride_res, stride_out, eps,
        K: tl.constexpr, HAS_INDEX: tl.constexpr, HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
        HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr, USE_DOT: tl.constexpr, DTYPE: tl.constexpr,
        PRECISION: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        ONE_CHUNK: tl.constexpr, PDL: tl.constexpr, LOOP_STAGES: tl.constexpr, SPLIT_K: tl.constexpr,
        SUM_GROUP: tl.constexpr, x_desc, w_desc, TMA_W: tl.constexpr = False, TMA_X: tl.constexpr = False,
    ):  # fmt: skip
        pid = tl.program_id(0)
        r = tl.arange(0, BLOCK_R)
        r_mask = r < rows
        res_rows = res_ptr + r[:, None] * stride_res
        n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = n < n_out
        w_rows = w_ptr + n.to(tl.int64)[:, None] * K  # [BN,1]

        # The first weight tile is requested before the norm pass: the two loads' latencies overlap instead of
        # adding up (nothing the norm pass writes aliases W).
        k_first = tl.arange(0, BLOCK_K)
        w_first_mask = n_mask[:, None] & (k_first < K)[None, :]
        if LOOP_STAGES == 0:  # (the pipelined loop loads every tile in its turn)
            w_first = tl.load(w_rows + k_first[None, :], mask=w_first_mask, other=0.0)
            if SILU_MUL:
                w_up_first = tl.load(w_rows + n_out * K + k_first[None, :], mask=w_first_mask, other=0.0)
        wait_for_producer(PDL)  # everything below reads or writes activations
        if HAS_INDEX:  # noqa: SIM108 (a constexpr branch: no load is emitted without an index)
            source = tl.load(index_ptr + r * stride_index, mask=r_mask, other=0)
        else:
            source = r
        x_rows = x_ptr + source.to(tl.int64)[:, None] * stride_x  # [BR,1]

        if HAS_NORM:  # first pass over x: the row norms (and the new residual, written once)
            squares = tl.zeros([BLOCK_R], dtype=tl.float32)
            for k0 in tl.static_range(0, K, BLOCK_K):
                kk = k0 + tl.arange(0, BLOCK_K)
                mask = r_mask[:, None] & (kk < K)[None, :]
                s = tl.load(x_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32)
                if HAS_RESIDUAL:  # rounded like the plain add
                    s = _rounded(
                        s + tl.load(res_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32), DTYPE
                    )
                if HAS_RESIDUAL:  # noqa: SIM102 (constexpr, then a runtime condition)
                    if pid == 0:
                        tl.store(sum_ptr + r[:, None] * K + kk[None, :], s.to(DTYPE), mask=mask)
                if ONE_CHUNK:  # the norm weight is requested with x, before the sum's cross-thread wait
                    norm_first = tl.load(norm_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
                    s_first = s
                squares += tl.sum(s * s, axis=1)
            rstd = 1.0 / tl.sqrt(squares / K + eps)

        if USE_DOT:
            acc = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
            acc_up = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
        else:  # CUDA cores: the tile products accumulate elementwise, summed over K once after the loop
            acc3 = tl.zeros([BLOCK_R, BLOCK_N, BLOCK_K], dtype=tl.float32)
            acc3_up = tl.zeros([BLOCK_R, BLOCK_N, BLOCK_K], dtype=tl.float32)
        if not HAS_NORM:
            rstd = tl.zeros([BLOCK_R], dtype=tl.float32)  # (unused: the prologue has no norm)
        if LOOP_STAGES > 0:
            # A runtime loop, software-pipelined over LOOP_STAGES tiles: for long K the unrolled loop below keeps
            # every tile's loads in flight at once and spills (ptxas: a 6144-wide K at 8 x 1024 tiles put 4.8 KB
            # a thread on the stack).
            if SPLIT_K > 1:  # noqa: SIM108 (constexpr): this program's slice of K (grid axis 1)
                k_lo = tl.program_id(1) * (K // SPLIT_K)
            else:
                k_lo = 0
            for k0 in tl.range(k_lo, k_lo + K // SPLIT_K, BLOCK_K, num_stages=LOOP_STAGES):
                kk = k0 + tl.arange(0, BLOCK_K)
                if TMA_X:  # [BR, BK] as one bulk copy; rows past the last are zeros
                    x = x_desc.load([0, k0])
                else:
                    x = _x_tile(x_rows, res_rows, norm_ptr, kk, r_mask, rstd, K, HAS_RESIDUAL, HAS_NORM, DTYPE)
                if TMA_W:  # [BN, BK] as one bulk copy (gate|up: the up rows n_out further); rows past W are zeros
                    w = w_desc.load([pid * BLOCK_N, k0])
                    if SILU_MUL:
                        w_up = w_desc.load([n_out + pid * BLOCK_N, k0])
                else:
                    w_mask = n_mask[:, None] & (kk < K)[None, :]
                    w = tl.load(w_rows + kk[None, :], mask=w_mask, other=0.0)
                    if SILU_MUL:
                        w_up = tl.load(w_rows + n_out * K + kk[None, :], mask=w_mask, other=0.0)
                if USE_DOT:
                    acc += tl.dot(x.to(DTYPE), tl.trans(w.to(DTYPE)), out_dtype=tl.float32,
                                  input_precision=PRECISION)  # fmt: skip
                    if SILU_MUL:
                        acc_up += tl.dot(x.to(DTYPE), tl.trans(w_up.to(DTYPE)), out_dtype=tl.float32,
                                         input_precision=PRECISION)  # fmt: skip
                else:
                    acc3 += x[:, None, :] * w.to(tl.float32)[None, :, :]
                    if SILU_MUL:
                        acc3_up += x[:, None, :] * w_up.to(tl.float32)[None, :, :]
        else:  # unrolled
            for k0 in tl.static_range(0, K, BLOCK_K):
                kk = k0 + tl.arange(0, BLOCK_K)
                k_mask = kk < K
                if HAS_NORM and ONE_CHUNK:  # x + residual and the norm weight are already in registers
                    x = _rounded(norm_first[None, :] * _rounded(s_first * rstd[:, None], DTYPE), DTYPE)
                else:
                    x = _x_tile(x_rows, res_rows, norm_ptr, kk, r_mask, rstd, K, HAS_RESIDUAL, HAS_NORM, DTYPE)
                if k0 == 0:
                    w = w_first
                    if SILU_MUL:
                        w_up = w_up_first
                else:
                    w_mask = n_mask[:, None] & k_mask[None, :]
                    w = tl.load(w_rows + kk[None, :], mask=w_mask, other=0.0)
                    if SILU_MUL:
                        w_up = tl.load(w_rows + n_out * K + kk[None, :], mask=w_mask, other=0.0)
                if USE_DOT:  # x holds values exact in DTYPE: the cast back is lossless
                    acc += tl.dot(
                        x.to(DTYPE), tl.trans(w.to(DTYPE)), out_dtype=tl.float32, input_precision=PRECISION
                    )
                    if SILU_MUL:
                        acc_up += tl.dot(x.to(DTYPE), tl.trans(w_up.to(DTYPE)), out_dtype=tl.float32,
                                         input_precision=PRECISION)  # fmt: skip
                else:
                    acc3 += x[:, None, :] * w.to(tl.float32)[None, :, :]
                    if SILU_MUL:
                        acc3_up += x[:, None, :] * w_up.to(tl.float32)[None, :, :]
        if not USE_DOT:
            acc = tl.sum(acc3, axis=2)
            acc_up = tl.sum(acc3_up, axis=2)
        if SPLIT_K > 1:  # the K slices' fp32 sums meet in the one program that finishes its columns last
            acc, acc_up, last = _sum_k_slices(acc, acc_up, part_ptr, count_ptr, pid, SILU_MUL, BLOCK_R, BLOCK_N,
                                              SPLIT_K, SUM_GROUP)  # fmt: skip

        if SILU_MUL:  # silu(gate) rounded, times up (each GEMM output rounded first), as `silu_mul`
            gate = _rounded(acc, DTYPE)
            y = _rounded(gate / (1.0 + tl.exp(-gate)), DTYPE) * _rounded(acc_up, DTYPE)
        elif HAS_BIAS:
            y = acc + tl.load(bias_ptr + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        else:
            y = acc
        out_mask = r_mask[:, None] & n_mask[None, :]
        if SPLIT_K > 1:  # only the last slice in stores
            out_mask = out_mask & last[:, None]
        tl.store(
            out_ptr + r[:, None] * stride_out + n[None, :], y.to(out_ptr.dtype.element_ty), mask=out_mask
        )


@dataclass(frozen=True, slots=True)
class GemvConfig:
    """Tile shape of one product: output columns per program, K per load, warps per program, and whether
    the rows multiply on tensor cores (None: from 16 rows up; `tl.dot` needs 16 rows and 16 columns).
    `loop_stages` 0: the K loop unrolled, the first weight tile requested before the norm pass; n > 0: a runtime
    K loop software-pipelined over n tiles (for long K, where the unrolled loop runs out of registers).
    `split_k` > 1 (tensor cores, pipelined loop): each column tile's K cut into that many slices, one program each,
    so a product of few column tiles has that many times the programs streaming it; the slices' fp32 partials are
    summed, in slice order, by the slice program that finishes last (`_sum_k_slices`).
    `tma` (tensor cores, pipelined loop): the weight's [BN, BK] tiles, and the activations' [BR, BK] where they are
    neither gathered by an index nor normed in the prologue, as bulk tensor copies (TMA: one copy a tile where the
    pointer loads are 16 bytes a thread; Hopper and later, pointer loads before) through descriptors. The same
    values as pointer loads (the code predictor's tiles: bitwise the same codes, H100, 2026-12-06)."""

    block_n: int = 16
    block_k: int = 512
    num_warps: int = 4
    use_dot: bool | None = None
    loop_stages: int = 0
    split_k: int = 1
    tma: bool = False


# The tile for 1-2 rows: 4 output columns and the whole K (up to 1024) a program of 8 warps, so a product is
# hundreds to thousands of programs and every SM holds several with their weight loads in flight. Measured on
# the H200 with weights streamed from HBM (`tools/gemv_bench.py`, 2026-12-02): the code predictor's products
# within 0.2-0.4 us of a kernel that only reads the weight, where 16-32 columns a program took 1.5-2.5x as long.
STREAM_TILE = GemvConfig(block_n=4, block_k=1024, num_warps=8)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def launch_tile(rows: int, k: int, config: GemvConfig) -> tuple[bool, int, int, int]:
    """The tile `gemv` launches for `rows` rows of a K-wide product: (tensor cores, BLOCK_R, BLOCK_N, BLOCK_K).
    `config`'s K per load is capped so a thread holds about 64 x (or product) values: configs that differ only
    above the cap launch the same kernel."""
    use_dot = rows >= 16 if config.use_dot is None else config.use_dot
    block_r = max(16 if use_dot else 1, _next_power_of_2(rows))
    block_n = max(16, config.block_n) if use_dot else config.block_n
    block_k = min(config.block_k, _next_power_of_2(k))
    if use_dot:  # the x tile [BR, BK] is loaded as fp32 before the cast: keep it near 64 values per thread
        block_k = max(16, min(block_k, 64 * 32 * config.num_warps // block_r))
    else:  # the broadcast product holds BR*BN*BK values: keep it near 64 per thread
        block_k = max(16, min(block_k, 64 * 32 * config.num_warps // (block_r * block_n)))
    return use_dot, block_r, block_n, block_k


# fp32 partial values a thread may hold in flight while the last slice program sums the others' (`sum_group`)
SUM_VALUES = 128


def sum_group(split: int, tile_values: int, num_warps: int) -> int:
    """How many K slices' partials the last program of a split product reads at once: the most (a power of two
    dividing `split`) whose [BR, BN] fp32 tiles (`tile_values` values, both halves of gate|up counted) keep
    `SUM_VALUES` values a thread in flight: every slice of the engine's 64 x 16 tiles in 4 slices at 4 warps (as the
    compiler unrolled the slice loop itself: the same SASS), 4 of 64 x 64 (94 registers a thread, compiled for
    sm_90), 2 of 64 x 128."""
    per_thread = max(1, tile_values // (32 * num_warps))
    group = 1
    while group * 2 <= split and split % (group * 2) == 0 and group * 2 * per_thread <= SUM_VALUES:
        group *= 2
    return group


def gemv_reference(
    x: Tensor, weight: Tensor, *, index: Tensor | None = None, residual: Tensor | None = None,
    norm_weight: Tensor | None = None, eps: float = 1e-6, bias: Tensor | None = None, silu_mul: bool = False,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """The twin: gather, `rms_norm_reference`, then the plain linear (or `silu_mul_reference` of it)."""
    if index is not None:
        x = x[index]
    s = None
    if norm_weight is not None:
        x, s = rms_norm_reference(x, norm_weight, eps, residual)
        s = s if residual is not None else None
    if silu_mul:
        return silu_mul_reference(x @ weight.T), s
    return F.linear(x, weight, bias), s


def bulk_copies_supported(x: Tensor) -> bool:
    """Whether `x`'s device has bulk tensor copies (TMA: compute capability 9.0 and later; the interpreter
    emulates them)."""
    return not x.is_cuda or torch.cuda.get_device_capability(x.device)[0] >= 9


def gemv(
    x: Tensor, weight: Tensor, *, index: Tensor | None = None, residual: Tensor | None = None,
    norm_weight: Tensor | None = None, eps: float = 1e-6, bias: Tensor | None = None, silu_mul: bool = False,
    config: GemvConfig | None = None, out: Tensor | None = None, sum_out: Tensor | None = None,
    pdl: bool = False,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """x [X,K] (last dim contiguous, any row stride; rows index[r] when index [R] int64 is given, else all
    X rows), weight [N,K] (or [2N,K] = [gate; up] with silu_mul) contiguous, residual [R,K] (last dim
    contiguous), norm_weight [K], bias [N] -> (y [R,N], residual + x [R,K] when a residual is given, else
    None). `out` / `sum_out` (last dim contiguous) receive them when given. `pdl`: launched as a programmatic
    dependent of the kernel before it (`kernels.pdl`), its first weight tile fetched before waiting for it."""
    if residual is not None and norm_weight is None:
        raise ValueError("gemv: a residual is only added in the norm prologue")
    if bias is not None and silu_mul:
        raise ValueError("gemv: bias and silu_mul do not combine")
    if not use_triton(x):
        y, s = gemv_reference(x, weight, index=index, residual=residual, norm_weight=norm_weight, eps=eps,
                              bias=bias, silu_mul=silu_mul)  # fmt: skip
        if out is not None:
            y = out.copy_(y)
        if sum_out is not None and s is not None:
            s = sum_out.copy_(s)
        return y, s
    config = config or GemvConfig()
    if config.tma and not bulk_copies_supported(x):  # TMA is Hopper's and later: the same tile by pointer loads
        config = replace(config, tma=False)
    assert x.stride(-1) == 1 and weight.is_contiguous() and (residual is None or residual.stride(-1) == 1)
    rows = index.shape[0] if index is not None else x.shape[0]
    k = x.shape[1]
    n_out = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    if out is None:
        out = torch.empty(rows, n_out, dtype=x.dtype, device=x.device)
    assert out.shape == (rows, n_out) and out.stride(-1) == 1
    s = None
    if residual is not None:
        s = torch.empty(rows, k, dtype=x.dtype, device=x.device) if sum_out is None else sum_out
        assert s.shape == (rows, k) and s.is_contiguous()
    use_dot, block_r, block_n, block_k = launch_tile(rows, k, config)
    programs = triton.cdiv(n_out, block_n)
    split = config.split_k
    parts, counts = out, out
    if split > 1:
        if not (use_dot and config.loop_stages > 0 and residual is None):
            raise ValueError("gemv split_k: tensor-core tiles, a pipelined loop, no residual prologue")
        if k % (split * block_k):
            raise ValueError(f"gemv split_k: K {k} is not {split} slices of whole {block_k}-wide tiles")
        units = 2 if silu_mul else 1
        parts = torch.empty(split * programs * units * block_r * block_n, dtype=torch.float32, device=x.device)
        counts = arrival_counts("gemv split_k", x.device, programs)
    tma_x, descriptors = False, (x, weight)  # (unread without `config.tma`)
    if config.tma:
        if not (use_dot and config.loop_stages > 0):
            raise ValueError("gemv tma: tensor-core tiles and a pipelined loop")
        from triton.tools.tensor_descriptor import TensorDescriptor  # (only here: Triton 3.4+)

        # a descriptor's row stride and base are whole 16-byte units
        tma_x = index is None and norm_weight is None and x.stride(0) * x.element_size() % 16 == 0
        tma_x = tma_x and x.data_ptr() % 16 == 0
        descriptors = (TensorDescriptor.from_tensor(x, [block_r, block_k]) if tma_x else x,
                       TensorDescriptor.from_tensor(weight, [block_n, block_k]))  # fmt: skip
    _gemv_kernel[(programs, split)](
        x, index if index is not None else x, residual if residual is not None else x,
        norm_weight if norm_weight is not None else x, weight, bias if bias is not None else x, out,
        s if s is not None else out, parts, counts,
        rows, n_out, x.stride(0), index.stride(0) if index is not None else 0,
        residual.stride(0) if residual is not None else 0, out.stride(0), eps,
        K=k, HAS_INDEX=index is not None, HAS_NORM=norm_weight is not None, HAS_RESIDUAL=residual is not None,
        HAS_BIAS=bias is not None, SILU_MUL=silu_mul, USE_DOT=use_dot, DTYPE=TRITON_DTYPES[x.dtype],
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # fp32 twins: no TF32 products
        BLOCK_R=block_r, BLOCK_N=block_n, BLOCK_K=block_k, ONE_CHUNK=block_k >= k and not config.loop_stages,
        PDL=pdl_enabled(pdl), LOOP_STAGES=config.loop_stages, SPLIT_K=split,
        SUM_GROUP=sum_group(split, block_r * block_n * (2 if silu_mul else 1), config.num_warps),
        x_desc=descriptors[0], w_desc=descriptors[1], TMA_W=config.tma, TMA_X=tma_x, num_warps=config.num_warps,
        **launch_options(pdl),
    )  # fmt: skip
    return out, s
