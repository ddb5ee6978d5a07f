"""Code-predictor fast path: the whole 15-step frame, sampling and the summed code embedding included,
as ONE captured CUDA graph per batch size. A drop-in for `CodePredictorExecutor.predict`.

One replay, for n (padded) rows, reads  kv_slot/stream/frame [n] from the static inputs and
GenerationSlots.hidden/code0 and sampler settings at the kv slots, then runs
    [h, C(c0)] at positions 0,1 -> group 1;  E_{g-1}(c_{g-1}) at position g -> group g, g = 2..15
over the preallocated 16-position cache, draws each group from the request's counter-based RNG
(seed, frame, group), and writes
    codes[stream, frame] = the frame [16]        frame_embed[kv_slot] = sum of its 16 code embeddings.
Nothing is read back to the host. Positions are static per step, so RoPE tables are constants.

Two ways to run a step (`FrameKernels.fused`):
- fused (default): 5 kernels per layer and 3 around them. `gemv` products with the RMSNorm folded into
  their prologue (input, post-attention and final norm, residual adds included), the embedding lookup of the
  previous group's code folded into the projection, SwiGLU into gate|up; `cp_attention` does q/k norm,
  RoPE, the cache write and attention in one kernel; `sampler.sample` draws the group in one kernel and adds
  its code embedding to the frame's fp32 running sum. Above `gemv_max_rows` token rows the products run on
  tensor cores, in `gemv` tiles at the token rows `dot_gemv` lists (16, 32, 64), where every kernel's launch overlaps
  the tail of the one before, else in cuBLAS; the norms then run in `rms_norm`.
- layers: the fused decoder stack (`decoder.run_layers`, ~10 kernels per layer) and the torch graph sampler.
(A persistent kernel for a whole step, the norms streamed between products as partial sums of squares, and
`cp_attention`'s products on tensor cores were built, checked and measured slower on the H200; docs/benchmarks.md,
nineteenth and twenty-second sessions, has the numbers and the commits that held them.)
Both compute the plain arithmetic and rounding (fp32 accumulation, activation-dtype rounding where the plain
layers round); off the GPU every kernel runs its PyTorch twin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.executors.slots import GenerationSlots
from engine.fast.decoder import fuse_layers, rope_tables, run_layers
from engine.fast.graphs import CapturedSteps, StaticInputs, check_sizes, pad_rows, padded_size, split_cohort
from engine.fast.kernels import INTERPRET, use_triton
from engine.fast.kernels.cp_attention import cp_attention
from engine.fast.kernels.decode_attention import decode_attention
from engine.fast.kernels.frame_io import frame_end, frame_start
from engine.fast.kernels.gemv import STREAM_TILE, GemvConfig, gemv
from engine.fast.kernels.rmsnorm import rms_norm
from engine.fast.kernels.sampler import sample
from engine.fast.kernels.silu_mul import silu_mul as swiglu
from engine.fast.sampling import DEFAULT_TOP_K_CAP, check_top_k, sample_tokens
from engine.model.qwen3_tts import Qwen3TTS

if TYPE_CHECKING:
    from engine.settings import KernelOptions

DEFAULT_GEMV = {name: STREAM_TILE for name in ("proj", "qkv", "o", "gate_up", "down", "head")}
# Tensor-core tiles (columns / K per load / warps / pipelined K tiles) by token rows, for the steps whose products
# run in `gemv` on tensor cores: at 16 and 64 rows the fastest of each product at 64 rows in `tools/gemv_tiles.py`
# (H200, 2026-12-04; within -0.4..+1.1 us of cuBLAS a call, bare), at 32 rows 32 columns a program for every
# product (tools/frame_profile.py: CP frame at B=32 3.91 ms with the 64-row tiles, 3.11 with these, 3.36 cuBLAS).
# Every tile loads by bulk tensor copies (`GemvConfig.tma`; pointer loads before Hopper): H100, 2026-12-06,
# `tools/frame_profile.py` at context 128 (`gemv_tma`), CP frame at B = 1 / 64 2.210 / 2.744 -> 2.198 / 2.673 ms, the
# same codes bit for bit (docs/bench/frame-profile-2026-12-06-s30-h100-wide-tma-draw-io.json).
_DOT_TILES = {
    "proj": GemvConfig(16, 128, 4, loop_stages=4, tma=True), "qkv": GemvConfig(32, 128, 4, loop_stages=4, tma=True),
    "o": GemvConfig(16, 128, 4, loop_stages=4, tma=True), "gate_up": GemvConfig(32, 128, 4, loop_stages=4, tma=True),
    "down": GemvConfig(16, 128, 4, loop_stages=4, tma=True), "head": GemvConfig(16, 128, 4, loop_stages=4, tma=True),
}  # fmt: skip
_DOT_TILES_32 = {name: replace(tile, block_n=32) for name, tile in _DOT_TILES.items()}
# 4 and 8 token rows (the steps of B = 2..8 frames) on the 16-row tiles with the rows masked (`use_dot`, else such a
# tile runs on CUDA cores): H200, 2026-12-05, `tools/frame_profile.py` at context 128, CP frame 3.44 -> 2.38 ms at
# B = 4 and 3.14 -> 2.41 at B = 8 against cuBLAS with `rms_norm` kernels; teacher-forced logits' error 1.04 and 1.03x
# the plain bf16 predictor's (docs/bench/frame-profile-2026-12-05-s25.json).
_DOT_TILES_SMALL = {name: replace(tile, use_dot=True) for name, tile in _DOT_TILES.items()}
DEFAULT_DOT_GEMV = {4: _DOT_TILES_SMALL, 8: _DOT_TILES_SMALL, 16: _DOT_TILES, 32: _DOT_TILES_32, 64: _DOT_TILES}
PRODUCTS = ("proj", "qkv", "o", "gate_up", "down", "head")
# The products whose 16-64 token-row steps run the fewest programs (64: projection, o and down; gate|up 96, qkv and
# head 128, against 132 SMs), so the ones split-K pays for: H200, 2026-12-05, `tools/frame_profile.py` at context
# 128, CP frame ms at B = 16 / 32 / 64, unsplit 2.84 / 3.11 / 3.07, these in 4 slices 2.51 / 2.71 / 2.85 (2 slices:
# 2.65 / 2.88 / 2.87; 8: 2.50 / 2.77 / 3.36); every product in 4: 2.96 / 3.39 / 3.82, and gate|up, qkv or head in 2
# beside these never helped (raw docs/bench/frame-profile-2026-12-05-s22-*.json).
SPLIT_PRODUCTS = ("proj", "o", "down")


def split_products(dot_gemv: Mapping[int, Mapping[str, GemvConfig]], slices: int,
                   names: Sequence[str] = SPLIT_PRODUCTS) -> dict[int, dict[str, GemvConfig]]:  # fmt: skip
    """Tensor-core tiles (`FrameKernels.dot_gemv`) with the named products' K in `slices` slices
    (`GemvConfig.split_k`: that many times the programs streaming a product; 1 joins them again); a split gate|up
    takes 16 columns a program (32 spill with its norm and SwiGLU, compiled for sm_90:
    tests/fast/test_kernels_compile.py)."""
    def split(name: str, tile: GemvConfig) -> GemvConfig:
        if name not in names:
            return tile
        return replace(tile, split_k=slices, block_n=16 if name == "gate_up" and slices > 1 else tile.block_n)

    return {rows: {name: split(name, tile) for name, tile in tiles.items()} for rows, tiles in dot_gemv.items()}


@dataclass(frozen=True)
class FrameKernels:
    """How a frame's steps run on the fast path (module docstring). Products are named proj, qkv, o, gate_up,
    down, head; `gemv` maps a name to its tile shape. Rows below are token rows (2n in a frame's first step).
    Norms folded into the products (each norm's weight in the next product's columns, the rows' RMS scale in its
    epilogue) were built and measured slower in every form on the H200 and H100 (docs/benchmarks.md, twenty-third
    to twenty-fifth sessions; the code is in git history at commit b58e277)."""

    fused: bool = True
    # Up to here products run in `gemv` on CUDA cores; above, cuBLAS (or `dot_gemv`). Measured on the H200
    # (2026-12-01): the CUDA-core gemv wins at 1-2 token rows (frame 3.8 ms at B=1 against 5.7 ms layered) but
    # loses badly at 4-8 (16.9 ms at B=4).
    gemv_max_rows: int = 2
    prologue_max_rows: int = 2  # up to here the RMSNorm runs inside the product; above, its own kernel
    gemv: Mapping[str, GemvConfig] = field(default_factory=lambda: dict(DEFAULT_GEMV))
    # Token-row counts whose steps run their products in `gemv` on tensor cores, each with its tiles; every kernel
    # of such a step is a programmatic dependent launch when `pdl`. Other counts above `gemv_max_rows`: cuBLAS.
    # On the H200 (2026-12-04, tools/frame_profile.py, context 128; bare, these tiles are 0-1 us a call slower
    # than cuBLAS, but the kernels start in each other's tails): CP frame at B=16 / 32 / 64 3.30 / 3.36 / 3.57 ms
    # -> 2.82 / 3.11 / 3.06, teacher-forced logits' error 1.01x the plain bf16 predictor's; at 128 rows these
    # tiles lost (B=128 3.95 -> 4.79 ms).
    dot_gemv: Mapping[int, Mapping[str, GemvConfig]] = field(default_factory=lambda: dict(DEFAULT_DOT_GEMV))
    # the sampler's top-k search: 32 / radix_bits counting passes over 2^bits candidates, or (8) at most 4
    # histogram passes, one a byte
    radix_bits: int = 2
    sampler_warps: int | None = None  # warps of a sampler program (None: 8 for a 2048+ vocabulary, else 4)
    attention_warps: int = 4  # warps of a broadcast-form `cp_attention` program (one per frame row and kv head)
    # the frame's inputs and outputs in one kernel each (`kernels.frame_io`) and the sampler reading its settings
    # by slot, instead of ~13 small launches: the same codes bit for bit; H100, 2026-12-06 (`tools/frame_profile.py`
    # at context 128, `cp_frame_io`), CP frame at B = 1 / 64 2.210 / 2.744 -> 2.169 / 2.705 ms
    frame_io: bool = True
    # From this many token rows, `cp_attention` walks the query heads one at a time (`attend_heads`) in programs of
    # `attention_per_head_warps` warps, each kv head's query heads over `attention_query_split` programs. The
    # broadcast form issues 3.2 M warp-instructions at B = 64, the per-head one 0.84 M in 1-warp programs
    # (`python tools/kernel_compile.py`). H100, 2026-12-05 (`tools/frame_profile.py`, context 128, CP frame ms at B =
    # 1 / 4 / 16 / 64): broadcast 2.186 / 2.511 / 2.573 / 2.897, per head in 1 warp 2.111 / 2.548 / 2.572 / 2.798
    # (4 warps: 2.282 / - / 2.652 / 3.154); so from 16 rows (a B = 8 frame's first step) on. The two query heads
    # of a kv head in two programs (each with its own copy of the keys; the same codes bit for bit): B = 16 / 64
    # 2.562 / 2.779 -> 2.484 / 2.739 (H100, same run).
    attention_per_head_rows: int = 16
    attention_per_head_warps: int = 1
    attention_query_split: int = 2
    # `cp_attention` loads the earlier positions' keys and values before its PDL wait (they were written dozens of
    # launches back), so only the qkv loads follow the product it waits for. The same codes bit for bit; H200,
    # 2026-12-05: CP frame 2.76 / 3.05 / 3.01 ms at B = 16 / 32 / 64 against 2.82 / 3.10 / 3.05.
    attention_early_cache: bool = True
    # Programmatic dependent launch (`kernels.pdl`) in the steps whose products all run in `gemv` (`runs_gemv`):
    # each kernel may start in the tail of the one before and fetch its weights while
    # that one finishes. On the H200 (2026-12-02, tools/frame_profile.py, round-robin): CP frame 2.41 -> 2.16 ms
    # at B=1, same codes bit for bit (at B=64, where cuBLAS runs the products, it cost 3.58 -> 3.64 ms, hence
    # the row limit). Off by default: in the whole server, 1 RPS p95 TTFA was 16.7 and 29.6 ms in two runs with
    # it against 13.0 and 13.9 without (docs/benchmarks.md, ninth session), a tail not yet explained.
    pdl: bool = False

    @classmethod
    def from_options(cls, options: KernelOptions) -> FrameKernels:
        """The frame's kernels as the engine's options choose them (`cp_kernels == "fused"`, `cp_pdl`,
        `cp_split_k`: `SPLIT_PRODUCTS` in that many K slices), every other field at its default:
        the one place the engine, `loadtest.gpu_check` and `tools/frame_profile.py` build them."""
        return cls(fused=options.cp_kernels == "fused", pdl=options.cp_pdl,
                   dot_gemv=split_products(DEFAULT_DOT_GEMV, options.cp_split_k))  # fmt: skip

    def runs_gemv(self, token_rows: int) -> bool:
        """Whether a step of this many token rows runs its products in `gemv` (else cuBLAS)."""
        return token_rows <= self.gemv_max_rows or token_rows in self.dot_gemv


class CodePredictorGraphs:
    def __init__(self, model: Qwen3TTS, slots: GenerationSlots, codes: Tensor, capture_sizes: Sequence[int], *,
                 use_graphs: bool | None = None, top_k_cap: int = DEFAULT_TOP_K_CAP,
                 kernels: FrameKernels | None = None) -> None:  # fmt: skip
        self.model = model
        self.predictor = model.code_predictor
        self.config = self.predictor.config
        self.slots = slots
        self.codes = codes  # [C,F,16] int64
        self.sizes = check_sizes(capture_sizes)
        self.max_batch = self.sizes[-1]
        self.top_k_cap = top_k_cap
        self.kernels = kernels or FrameKernels()
        self.layers = fuse_layers(self.predictor.model.layers)
        projection = self.predictor.small_to_mtp_projection
        self.projection = (projection.weight, projection.bias) if isinstance(projection, nn.Linear) else None
        self.heads = [head.weight for head in self.predictor.lm_head]  # [V,Hc] per group 1..15
        self.tables = [
            table.weight for table in self.predictor.model.codec_embedding
        ]  # [V,H] per group 1..15
        self.cache = self.predictor.new_cache(self.max_batch)
        device = model.device
        self.inputs = StaticInputs(("kv_slot", "stream", "frame"), self.max_batch, device)
        positions = torch.arange(self.config.num_code_groups, device=device)
        self.cos, self.sin = rope_tables(self.predictor.rotary, positions, model.dtype)  # [16,D] constants
        use = device.type == "cuda" if use_graphs is None else use_graphs
        self.steps = CapturedSteps("code predictor frame", self._frame, self.sizes, use_graphs=use)

    def capture(self) -> None:
        self.steps.capture()

    def predict(self, kv_slots: list[int], stream_slots: list[int], frame_index: list[int]) -> None:
        """Same contract as `CodePredictorExecutor.predict`; cohorts beyond the largest size are split."""
        check_top_k(self.slots.predictor.host_top_k(kv_slots), self.top_k_cap, self.config.vocab_size)
        for part in split_cohort(len(kv_slots), self.sizes):
            size = padded_size(len(part), self.sizes)
            self.inputs.load(size, kv_slot=pad_rows([kv_slots[i] for i in part], size),
                             stream=pad_rows([stream_slots[i] for i in part], size),
                             frame=pad_rows([frame_index[i] for i in part], size))  # fmt: skip
            self.steps.replay(size)

    # ------------------------------------------------------------ the captured frame

    def _frame(self, n: int) -> None:
        if self.kernels.fused:
            self._frame_fused(n)
        else:
            self._frame_layers(n)

    def _frame_fused(self, n: int) -> None:
        s, c, k = self.slots, self.config, self.kernels
        index, frames, streams = self.inputs["kv_slot"][:n], self.inputs["frame"][:n], self.inputs["stream"][:n]
        frame = torch.empty(n, c.num_code_groups, dtype=torch.int64, device=index.device)
        if k.frame_io:  # the frame's inputs in one kernel, the sampler reading its settings by slot
            x = torch.empty(2 * n, s.hidden.shape[1], dtype=s.hidden.dtype, device=index.device)  # [h, E_0(c0)]
            embed_sum = torch.empty(n, s.hidden.shape[1], dtype=torch.float32, device=index.device)
            frame_start(index, s.hidden, s.code0, self.model.talker.model.codec_embedding.weight, x, frame, embed_sum)
            settings = (s.predictor.greedy, s.predictor.temperature, s.predictor.top_k, self.top_k_cap, s.seeds, frames)
            by_slot: Tensor | None = index
        else:
            settings = (s.predictor.greedy[index], s.predictor.temperature[index], s.predictor.top_k[index],
                        self.top_k_cap, s.seeds[index], frames)  # fmt: skip
            by_slot = None
            code0 = s.code0[index]  # [n]
            first = self.model.talker.embed_codec(code0)  # [n,H], E_0(c0)
            frame[:, 0] = code0
            embed_sum = first.to(torch.float32)  # the 16-way sum in fp32, rounded once at the end like `sum`
            x = torch.stack((s.hidden[index], first), dim=1).view(2 * n, -1)

        logits = self.step_logits(x, None, 0, 2)
        sample(logits, *settings, 1, out=frame[:, 1], table=self.tables[0], acc=embed_sum, radix_bits=k.radix_bits,
               num_warps=k.sampler_warps, pdl=self._pdl(2 * n), index=by_slot)  # fmt: skip
        for group in range(2, c.num_code_groups):
            logits = self.step_logits(self.tables[group - 2], frame[:, group - 1], group, 1)
            sample(logits, *settings, group, out=frame[:, group], table=self.tables[group - 1], acc=embed_sum,
                   radix_bits=k.radix_bits, num_warps=k.sampler_warps, pdl=self._pdl(n), index=by_slot)  # fmt: skip
        if k.frame_io:
            frame_end(index, streams, frames, frame, embed_sum, self.codes, s.frame_embed)
        else:
            self.codes[streams, frames] = frame
            s.frame_embed[index] = embed_sum.to(s.frame_embed.dtype)

    def step_logits(self, x: Tensor, index: Tensor | None, start: int, tokens: int) -> Tensor:
        """One step of the fused frame: token rows x[index[r]] (or x [n*T,H] when index is None; row b*T + t
        at position start+t, cache slot b) -> the group's logits [n,V] of each row's last token, in the
        activation dtype (as the plain head computes them before its fp32 cast). Group = max(1, start)."""
        c, layers = self.config, self.layers
        eps = layers[0].eps
        if self.projection is not None:
            hidden, _ = self._product("proj", x, self.projection[0], index=index, bias=self.projection[1])
        else:
            hidden = x[index] if index is not None else x
        residual: Tensor | None = None
        for number, layer in enumerate(layers):
            qkv, residual = self._product("qkv", hidden, layer.qkv, residual=residual, norm=layer.input_norm,
                                          eps=eps)  # fmt: skip
            attended = self._attention(number, qkv, start, tokens)
            hidden, _ = self._product("o", attended, layer.o)
            act, residual = self._product("gate_up", hidden, layer.gate_up, residual=residual,
                                          norm=layer.post_norm, eps=eps, silu_mul=True)  # fmt: skip
            hidden, _ = self._product("down", act, layer.down)
        rows = hidden.shape[0] // tokens
        last = (rows, tokens, c.hidden_size)
        hidden, residual = hidden.view(last)[:, -1], residual.view(last)[:, -1]  # type: ignore[union-attr]
        norm = self.predictor.model.norm
        logits, _ = self._product("head", hidden, self.heads[max(1, start) - 1], residual=residual,
                                  norm=norm.weight, eps=norm.eps)  # fmt: skip
        return logits

    def _attention(self, number: int, qkv: Tensor, start: int, tokens: int) -> Tensor:
        """Layer `number`'s `cp_attention` over qkv [rows, (H+2K)D] with this frame's kernel options."""
        layer, k = self.layers[number], self.kernels
        k_cache, v_cache = self.cache.layer(number)
        per_head = qkv.shape[0] >= k.attention_per_head_rows
        return cp_attention(qkv, self.cos, self.sin, layer.q_norm, layer.k_norm, layer.eps, k_cache, v_cache, start,
                            tokens, layer.num_heads, layer.num_kv_heads,
                            num_warps=k.attention_per_head_warps if per_head else k.attention_warps,
                            pdl=self._pdl(qkv.shape[0]), early_cache=k.attention_early_cache, per_head=per_head,
                            query_split=k.attention_query_split if per_head else 1)  # fmt: skip

    def _pdl(self, token_rows: int) -> bool:
        """Whether a kernel of a step with this many token rows launches as a programmatic dependent."""
        return self.kernels.pdl and self.kernels.runs_gemv(token_rows)

    def _product(self, name: str, x: Tensor, weight: Tensor, *, index: Tensor | None = None,
                 residual: Tensor | None = None, norm: Tensor | None = None, eps: float = 1e-6,
                 bias: Tensor | None = None, silu_mul: bool = False) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        """One product with its norm prologue and epilogue -> (y, the residual stream after the norm's add)."""
        k = self.kernels
        rows = index.shape[0] if index is not None else x.shape[0]
        small = k.runs_gemv(rows)
        config = (k.gemv if rows <= k.gemv_max_rows else k.dot_gemv.get(rows, {})).get(name, GemvConfig())
        # The interpreter runs programs one by one in Python: there, one program per product (same code).
        if INTERPRET:
            columns = weight.shape[0] // (2 if silu_mul else 1)
            config = replace(config, block_n=max(config.block_n, 1 << (columns - 1).bit_length()))
        if not use_triton(x) or (small and (norm is None or rows <= k.prologue_max_rows)):
            y, total = gemv(x, weight, index=index, residual=residual, norm_weight=norm, eps=eps, bias=bias,
                            silu_mul=silu_mul, config=config, pdl=self._pdl(rows))  # fmt: skip
            return y, (x if total is None else total) if norm is not None else None
        if index is not None:
            x = x[index]
        total = None
        if norm is not None:
            x, total = rms_norm(x.contiguous(), norm, eps, residual, pdl=self._pdl(rows))
        if small:
            y, _ = gemv(x, weight, bias=bias, silu_mul=silu_mul, config=config, pdl=self._pdl(rows))
        else:
            y = F.linear(x, weight, bias)
            y = swiglu(y) if silu_mul else y
        return y, total

    def _frame_layers(self, n: int) -> None:
        s, predictor, c = self.slots, self.predictor, self.config
        index, streams, frames = (
            self.inputs["kv_slot"][:n],
            self.inputs["stream"][:n],
            self.inputs["frame"][:n],
        )
        settings = (s.predictor.greedy[index], s.predictor.temperature[index], s.predictor.top_k[index])
        seeds = s.seeds[index]
        code0 = s.code0[index]  # [n]
        caches = [self.cache.layer(i) for i in range(c.num_layers)]
        rows = torch.arange(n, device=index.device)

        # Step 1: [h_k, C(c_k^0)] at positions 0,1 (token rows b*2 + t), causal.
        x = torch.stack((s.hidden[index], self.model.talker.embed_codec(code0)), dim=1).view(2 * n, -1)
        two = torch.arange(2, device=index.device).repeat(
            n
        )  # positions 0,1 of each row; they see 1 and 2 keys
        hidden = self._forward(x, rows[:, None].expand(n, 2).reshape(-1), two, caches, two + 1)
        logits = predictor.logits(1, hidden.view(n, 2, -1)[:, 1])  # [n,V] fp32
        groups = [sample_tokens(logits, *settings, self.top_k_cap, seeds, frames, 1)]
        for group in range(2, c.num_code_groups):
            x = predictor.embed_code(group - 1, groups[-1])  # [n,H]
            position = torch.full_like(rows, group)
            hidden = self._forward(x, rows, position, caches, position + 1)
            logits = predictor.logits(group, hidden)
            groups.append(sample_tokens(logits, *settings, self.top_k_cap, seeds, frames, group))
        frame = torch.cat((code0[:, None], torch.stack(groups, dim=1)), dim=1)  # [n,16]

        self.codes[streams, frames] = frame
        parts = [self.model.talker.embed_codec(frame[:, 0])]
        parts += [predictor.embed_code(g, frame[:, g]) for g in range(1, c.num_code_groups)]
        s.frame_embed[index] = torch.stack(parts, dim=1).sum(1)  # [n,H], the reference's 16-way sum

    def _forward(self, x: Tensor, slot: Tensor, position: Tensor, caches: list[tuple[Tensor, Tensor]],
                 visible: Tensor) -> Tensor:  # fmt: skip
        """x [R,H] token rows at (slot, position) -> final-norm hidden [R,Hc]; row r sees keys 0..visible[r]-1.

        Every token row is one query of the per-row-length decode attention kernel, so the frame's causal
        2-token prefill (visible 1 and 2) and its 1-token steps share one kernel and no SDPA runs here."""
        h = self.predictor.small_to_mtp_projection(x)

        def attend(layer: int, q: Tensor) -> Tensor:  # q [R,Hq,D] -> [R,Hq*D]
            k_cache, v_cache = caches[layer]
            return decode_attention(q, k_cache, v_cache, slot, visible).view(q.shape[0], -1)

        cos, sin = self.cos[position], self.sin[position]  # [R,D]
        norm = self.predictor.model.norm.weight
        return run_layers(self.layers, h, norm, cos, sin, caches, slot, position, attend)
