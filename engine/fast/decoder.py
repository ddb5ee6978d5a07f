"""The decoder stack on the fast path: fused weights and about nine kernels per layer instead of ~55.

Per layer:  rms_norm(+residual) -> qkv GEMM -> qk_norm_rope (writes K/V into the cache) -> attention
            -> o GEMM -> rms_norm(+residual) -> gate|up GEMM -> silu_mul -> down GEMM.
For one or two token rows (`run_layers_streamed`), six:
            qkv gemv(norm prologue) -> qk_norm_rope -> attention -> o gemv -> gate|up gemv(norm prologue,
            SwiGLU epilogue) -> down gemv,
where each product streams its weight once at full width (`kernels.gemv`, tiles per shape in `StreamTiles`).
For tens of rows (`run_layers_chained`), the `run_layers` chain without `silu_mul`, in `gemv`'s
tensor-core tiles and launched as programmatic dependents, each kernel starting in the tail of the one before.
The arithmetic is the plain `engine.model.layers` arithmetic, rounded at the same places; only GEMM
shapes change (q|k|v and gate|up as one product), so bf16 results match the plain twin within GEMM
rounding. `fuse_layers` concatenates the projection weights once and re-points the plain modules'
parameters at views of the fused tensors, so both paths share one copy of the weights.

Rows are flattened token rows: R = B*T, hidden width Hd; `attend(layer, q [R,H,D]) -> [R,H*D]` is
supplied by the caller (decode over per-row lengths, or the code predictor's short dense context).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from engine.fast.kernels.gemv import GemvConfig, gemv
from engine.fast.kernels.qk_norm_rope import qk_norm_rope
from engine.fast.kernels.rmsnorm import rms_norm
from engine.fast.kernels.silu_mul import silu_mul
from engine.model.layers import DecoderLayer


@dataclass(frozen=True, slots=True)
class FusedLayer:
    input_norm: Tensor  # [Hd]
    post_norm: Tensor  # [Hd]
    qkv: Tensor  # [(H+2K)D, Hd]
    o: Tensor  # [Hd, H*D]
    gate_up: Tensor  # [2I, Hd]
    down: Tensor  # [Hd, I]
    q_norm: Tensor  # [D]
    k_norm: Tensor  # [D]
    eps: float
    num_heads: int
    num_kv_heads: int


def _fuse(linears: list[nn.Linear]) -> Tensor:
    """Concatenate the weights along the output dim; the modules then hold views of the result."""
    fused = torch.cat([lin.weight.detach() for lin in linears], dim=0)
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(fused[start : start + rows], requires_grad=False)
        start += rows
    return fused


def fuse_layer(layer: DecoderLayer) -> FusedLayer:
    attn, mlp = layer.self_attn, layer.mlp
    return FusedLayer(
        input_norm=layer.input_layernorm.weight.detach(),
        post_norm=layer.post_attention_layernorm.weight.detach(),
        qkv=_fuse([attn.q_proj, attn.k_proj, attn.v_proj]),
        o=attn.o_proj.weight.detach(),
        gate_up=_fuse([mlp.gate_proj, mlp.up_proj]),
        down=mlp.down_proj.weight.detach(),
        q_norm=attn.q_norm.weight.detach(),
        k_norm=attn.k_norm.weight.detach(),
        eps=layer.input_layernorm.eps,
        num_heads=attn.num_heads,
        num_kv_heads=attn.num_kv_heads,
    )


def fuse_layers(layers: nn.ModuleList) -> list[FusedLayer]:
    return [fuse_layer(layer) for layer in layers]  # type: ignore[arg-type]


Attend = Callable[[int, Tensor], Tensor]


def run_layers(
    layers: list[FusedLayer], x: Tensor, final_norm: Tensor, cos: Tensor, sin: Tensor,
    caches: list[tuple[Tensor, Tensor]], slot: Tensor, position: Tensor, attend: Attend,
    attend_qkv: Attend | None = None,
) -> Tensor:  # fmt: skip
    """x [R,Hd] at rows (slot[r], position[r]) of the caches; cos/sin [R,D] -> final-norm hidden [R,Hd].
    `attend_qkv(layer, qkv [R,(H+2K)D]) -> [R,H*D]`, when given, replaces `qk_norm_rope` + `attend`: it norms and
    rotates q and k and writes the cache itself."""
    residual: Tensor | None = None
    for index, layer in enumerate(layers):
        normed, residual = rms_norm(x, layer.input_norm, layer.eps, residual)  # residual: the layer input
        x = _attention(layer, index, normed @ layer.qkv.T, cos, sin, caches, slot, position, attend, attend_qkv)
        x = x @ layer.o.T  # [R,Hd]
        normed, residual = rms_norm(x, layer.post_norm, layer.eps, residual)  # residual: h = x + attn
        x = silu_mul(normed @ layer.gate_up.T) @ layer.down.T  # [R,Hd]
    return rms_norm(x, final_norm, layers[0].eps, residual)[0]


def _attention(layer: FusedLayer, index: int, qkv: Tensor, cos: Tensor, sin: Tensor,
               caches: list[tuple[Tensor, Tensor]], slot: Tensor, position: Tensor, attend: Attend,
               attend_qkv: Attend | None) -> Tensor:  # fmt: skip
    """qkv [R,(H+2K)D] -> attention output [R,H*D], the new keys and values written into the layer's cache."""
    if attend_qkv is not None:
        return attend_qkv(index, qkv)
    k_cache, v_cache = caches[index]
    q = qk_norm_rope(qkv, cos, sin, layer.q_norm, layer.k_norm, layer.eps, k_cache, v_cache, slot, position,
                     layer.num_heads, layer.num_kv_heads)  # [R,H,D]  # fmt: skip
    return attend(index, q)


@dataclass(frozen=True, slots=True)
class StreamTiles:
    """`gemv` tiles of the talker's four products at 1-2 token rows, as `run_layers_streamed` calls them (RMSNorm and
    residual prologues in qkv and gate|up, SwiGLU epilogue in gate|up): the fastest of a grid of 23-30 tiles per
    product on the H200 at one row, weights from HBM (2026-12-04, seventeenth session; `tools/gemv_tiles.py`,
    raw docs/bench/talker-tiles-2026-12-04-s17.json). us per call, against the tiles before and cuBLAS's bare product:
    qkv 8.43 (9.31; 7.31), o 4.56 (5.18; 6.10), gate|up 19.72 (29.09; 15.97), down 8.79 (8.79; 11.27). The K = 2048
    products unroll their K loop (2 tiles), which also requests the first weight tile before the norm pass;
    down (K = 6144) keeps the 3-stage pipelined runtime loop, the fastest of its grid. gate|up's 4 columns are 4 gate
    and 4 up rows."""

    qkv: GemvConfig = GemvConfig(block_n=8, block_k=1024, num_warps=8)
    o: GemvConfig = GemvConfig(block_n=4, block_k=512, num_warps=4, loop_stages=3)
    gate_up: GemvConfig = GemvConfig(block_n=4, block_k=1024, num_warps=8)
    down: GemvConfig = GemvConfig(block_n=8, block_k=1024, num_warps=4, loop_stages=3)


def run_layers_streamed(
    layers: list[FusedLayer], x: Tensor, final_norm: Tensor, cos: Tensor, sin: Tensor,
    caches: list[tuple[Tensor, Tensor]], slot: Tensor, position: Tensor, attend: Attend,
    attend_qkv: Attend | None = None, tiles: StreamTiles | None = None,
) -> Tensor:  # fmt: skip
    """`run_layers` for a few token rows with every product in `gemv`: the RMSNorms (and their residual adds) in
    the qkv and gate|up products' prologues, SwiGLU in gate|up's epilogue. Same arithmetic and roundings as
    `run_layers`; the products accumulate in fp32 in another order than cuBLAS, so bf16 results agree within
    GEMM rounding (on the CPU both run the same PyTorch twins)."""
    tiles = tiles or StreamTiles()
    residual: Tensor | None = None
    for index, layer in enumerate(layers):
        qkv, total = gemv(x, layer.qkv, residual=residual, norm_weight=layer.input_norm, eps=layer.eps,
                          config=tiles.qkv)  # fmt: skip
        residual = x if total is None else total  # the layer input
        attended = _attention(layer, index, qkv, cos, sin, caches, slot, position, attend, attend_qkv)
        x, _ = gemv(attended, layer.o, config=tiles.o)  # [R,Hd]
        act, residual = gemv(x, layer.gate_up, residual=residual, norm_weight=layer.post_norm, eps=layer.eps,
                             silu_mul=True, config=tiles.gate_up)  # residual: h = x + attn  # fmt: skip
        x, _ = gemv(act, layer.down, config=tiles.down)  # [R,Hd]
    return rms_norm(x, final_norm, layers[0].eps, residual)[0]


@dataclass(frozen=True, slots=True)
class ChainTiles:
    """Tensor-core `gemv` tiles of the talker's products in `run_layers_chained` (None: cuBLAS): the fastest of
    each at 64 rows on the H200, bare (2026-12-04, `tools/gemv_tiles.py --model talker --rows 64`, raw
    docs/bench/gemv-tiles-2026-12-04-s18-talker.json), us a call against cuBLAS: qkv 8.57 (7.54), o 7.10 (6.49),
    gate|up with its SwiGLU 17.20 (17.16, and `silu_mul` apart); down lost by 4.4 us (16.02 against 11.63), so
    it stays on cuBLAS here (and in the chain too: a 16-column down tile, alone or in 2 K slices, lost on the H200,
    2026-12-05, docs/benchmarks.md, twenty-third session); the 64-row steps take a 64-column one in 4 K slices
    (`talker_graph.CHAIN_TILES`).

    Norms folded into gate|up (its post-attention norm's weight in its columns, the rows' RMS scale in its epilogue)
    were built and measured slower on the H200 and H100 (docs/benchmarks.md, twenty-third to twenty-fifth sessions;
    the code is in git history at commit b58e277)."""

    qkv: GemvConfig | None = GemvConfig(block_n=32, block_k=128, num_warps=4, loop_stages=4)
    o: GemvConfig | None = GemvConfig(block_n=16, block_k=128, num_warps=4, loop_stages=4)
    gate_up: GemvConfig | None = GemvConfig(block_n=64, block_k=128, num_warps=4, loop_stages=4)
    down: GemvConfig | None = None


def run_layers_chained(
    layers: list[FusedLayer], x: Tensor, final_norm: Tensor, attend_qkv: Attend, tiles: ChainTiles | None = None,
) -> Tensor:  # fmt: skip
    """`run_layers` (with `attend_qkv`) for tens of token rows as a chain of programmatic dependent launches
    (`kernels.pdl`): the products in `gemv`'s tensor-core tiles (or cuBLAS where `tiles` says None), SwiGLU in
    gate|up's epilogue, the norms in `rms_norm`, all launched so each starts while the one before finishes;
    `attend_qkv` should launch its kernels the same way. Same arithmetic and roundings as `run_layers`."""
    tiles = tiles or ChainTiles()

    def product(x: Tensor, weight: Tensor, config: GemvConfig | None, silu: bool = False) -> Tensor:
        if config is None:
            y = x @ weight.T
            return silu_mul(y) if silu else y
        return gemv(x, weight, silu_mul=silu, config=config, pdl=True)[0]

    residual: Tensor | None = None
    for index, layer in enumerate(layers):
        normed, residual = rms_norm(x, layer.input_norm, layer.eps, residual, pdl=True)  # residual: layer input
        attended = attend_qkv(index, product(normed, layer.qkv, tiles.qkv))
        x = product(attended, layer.o, tiles.o)  # [R,Hd]
        normed, residual = rms_norm(x, layer.post_norm, layer.eps, residual, pdl=True)  # residual: h = x + attn
        x = product(product(normed, layer.gate_up, tiles.gate_up, silu=True), layer.down, tiles.down)
    return rms_norm(x, final_norm, layers[0].eps, residual, pdl=True)[0]


def rope_tables(rotary: nn.Module, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions [R] -> the plain RotaryEmbedding's cos, sin as [R,D] rows."""
    cos, sin = rotary(positions[:, None], dtype)  # [R,1,1,D]
    return cos[:, 0, 0], sin[:, 0, 0]
