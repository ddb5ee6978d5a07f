"""Talker fast path: decode captured per batch size, prefill per (batch size, length bucket), over the
preallocated slot KV cache with per-request lengths. A drop-in for `TalkerExecutor.prefill/decode`.

Decode replay (n padded rows), inputs kv_slot/position/text_row/frame/eos_never [n]:
    x = frame_embed[slot] + text.rows[text_row] (P(text id), projected once an id: `text_rows.py`)  ->
    fused 28-layer stack, keys of row b = its slot's 0..position[b]
    (Triton split-KV decode attention)  ->  codec head  ->  repetition penalty, EOS/control masks  ->
    temperature, top-k, counter-based draw (seed, frame+1, group 0) in the code predictor's one-kernel sampler
    (`kernels/sampler.py`; `sample_tokens`' ~20 small kernels took ~0.1 ms of a 1.8 ms B=1 step)  ->  hidden,
    code0, seen, generated updated at the slot; the tokens also land in `tokens` for the one optional read-back.
Prefill replay (n rows, bucket L): the prompt rows, right-padded to L in a static buffer, run causally
from position 0 (padded queries come after every real one, so they change nothing that is kept; their
keys past the prompt are overwritten by later decode steps before anything reads them).
Host work per step: project the text ids not held yet, fill the static inputs (one copy), replay, advance the
host lengths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.executors.slots import GenerationSlots
from engine.fast.decoder import (
    ChainTiles,
    fuse_layers,
    rope_tables,
    run_layers,
    run_layers_chained,
    run_layers_streamed,  # fmt: skip
)
from engine.fast.graphs import CapturedSteps, StaticInputs, check_sizes, pad_rows, padded_size, split_cohort
from engine.fast.kernels.decode_attention import decode_attention, decode_attention_rope
from engine.fast.kernels.gemv import GemvConfig
from engine.fast.kernels.sampler import sample
from engine.fast.kernels.talker_draw import talker_draw
from engine.fast.sampling import DEFAULT_TOP_K_CAP, check_top_k
from engine.fast.text_rows import DEFAULT_TEXT_ROWS, ProjectedText
from engine.ipc.messages import Sampling
from engine.model import sampling as sampler
from engine.model.kv_cache import TalkerKVCache
from engine.model.qwen3_tts import Qwen3TTS
from engine.settings import TALKER_CHAINS

# cuDNN attention is left out of captured prefill: its graph-capture safety is not established here.
CAPTURE_SAFE_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# Decode row counts that run `run_layers_chained` (tensor-core tiles from 16 rows). H200, 2026-12-05, talker step ms
# chained / not: at context 128 B = 16 1.62 / 1.74, 32 1.82 / 1.83, 64 1.98 / 2.05 (`tools/frame_profile.py`); at
# contexts 256..511 (`loadtest.gpu_check`) B = 16 1.83 / 1.93, 64 2.55 / 2.58, but 32 2.42 / 2.21: 32 rows stay
# unchained (frame_profile's `talker_chain_all` chains them too).
CHAIN_ROWS = (16, 64)
# The 64-row steps' down product (2048 x 6144) in 64-column tensor-core tiles, K in 4 slices (128 programs) instead
# of cuBLAS. H100, 2026-12-06, `tools/frame_profile.py` at context 128 (`talker_wide64_down`):
# talker step at B = 64 2.290 -> 2.164 ms, B = 1 unchanged; `loadtest.gpu_check`: error against fp32 no worse than
# the plain bf16 talker's
# (docs/bench/frame-profile-2026-12-06-s30-h100-wide-tma-draw-io.json). At 16 rows cuBLAS's down stays.
WIDE_DOWN = GemvConfig(block_n=64, block_k=128, num_warps=4, use_dot=True, loop_stages=4, split_k=4)
CHAIN_TILES = {16: ChainTiles(), 64: replace(ChainTiles(), down=WIDE_DOWN)}


def chain_options(mode: str) -> tuple[tuple[int, ...], dict[int, ChainTiles] | None]:
    """The engine's `--talker-chain` as (`chain_rows`, `chain_tiles`) for `TalkerGraphs`: off (none) or on
    (`run_layers_chained` at `CHAIN_ROWS`, each row count with its `CHAIN_TILES`)."""
    if mode not in TALKER_CHAINS:
        raise ValueError(f"talker chain mode must be one of {', '.join(TALKER_CHAINS)}, got {mode!r}")
    if mode == "off":
        return (), None
    return CHAIN_ROWS, dict(CHAIN_TILES)


class TalkerGraphs:
    def __init__(self, model: Qwen3TTS, slots: GenerationSlots, cache: TalkerKVCache, capture_sizes: Sequence[int],
                 *, prefill_sizes: Sequence[int] = (), prefill_buckets: Sequence[int] = (),
                 use_graphs: bool | None = None, top_k_cap: int = DEFAULT_TOP_K_CAP,
                 gemv_max_rows: int = 0, fused_rope: bool = False,
                 chain_rows: Sequence[int] = (),
                 chain_tiles: ChainTiles | Mapping[int, ChainTiles] | None = None,
                 fused_draw: bool = False, text_rows: int = DEFAULT_TEXT_ROWS) -> None:  # fmt: skip
        """`gemv_max_rows`: decode steps of up to this many rows run `run_layers_streamed` (products as weight
        streams in `gemv`, norms and SwiGLU folded in); above it, and at 0, cuBLAS products (`run_layers`).
        `fused_rope`: decode steps norm and rotate q and k inside the attention's split kernel
        (`decode_attention_rope`) instead of a `qk_norm_rope` kernel a layer. `chain_rows` (with `fused_rope`):
        decode steps of exactly these row counts run `run_layers_chained` (tensor-core `gemv` products, every
        kernel a programmatic dependent launch), with `chain_tiles` (None: `ChainTiles()`; a mapping: each row
        count's own, `ChainTiles()` for counts it leaves out). `fused_draw`: each step's scores, draw and slot-state
        writes in one kernel (`kernels.talker_draw`) instead of the separate steps of `_draw`. `text_rows`: distinct
        text ids whose projected rows stay on the device (`ProjectedText`)."""
        self.model = model
        self.gemv_max_rows = gemv_max_rows
        self.chain_rows = tuple(chain_rows) if fused_rope else ()
        by_rows = chain_tiles if isinstance(chain_tiles, Mapping) else dict.fromkeys(self.chain_rows, chain_tiles)
        self.chain_tiles = {rows: by_rows.get(rows) or ChainTiles() for rows in self.chain_rows}
        self.fused_rope = fused_rope
        self.fused_draw = fused_draw
        self.talker = model.talker
        self.config = model.config.talker
        self.slots = slots
        self.cache = cache
        self.sizes = check_sizes(capture_sizes)
        self.prefill_sizes = check_sizes(prefill_sizes) if prefill_sizes else ()
        self.buckets = check_sizes(prefill_buckets) if prefill_buckets else ()
        if self.buckets and self.buckets[-1] > cache.max_len:
            raise ValueError(f"prefill bucket {self.buckets[-1]} exceeds the KV cache's {cache.max_len} positions")
        self.top_k_cap = top_k_cap
        self.layers = fuse_layers(self.talker.model.layers)
        self.caches = [cache.layer(i) for i in range(self.config.num_layers)]
        device = model.device
        # cos, sin [L,D] of every cache position, computed once: a step gathers its rows (2 launches where
        # computing them took ~7; the same elementwise fp32 ops on the same angles, so the same values)
        self.rope = rope_tables(self.talker.rotary, torch.arange(cache.max_len, device=device), model.dtype)
        use = device.type == "cuda" if use_graphs is None else use_graphs
        largest = max(self.sizes[-1], self.prefill_sizes[-1] if self.prefill_sizes else 1)
        self.inputs = StaticInputs(("kv_slot", "position", "text_row", "frame", "eos_never"), largest, device)
        self.text = ProjectedText(self.talker.embed_text, self.config.hidden_size, capacity=text_rows,
                                  max_step_rows=self.sizes[-1], dtype=model.dtype, device=device)  # fmt: skip
        self.tokens = torch.zeros(largest, dtype=torch.int64, device=device)  # last replay's draws
        self.decode_steps = CapturedSteps("talker decode", self._decode, self.sizes, use_graphs=use)
        self.prefill_x = torch.zeros(self.prefill_sizes[-1] if self.prefill_sizes else 1,
                                     self.buckets[-1] if self.buckets else 1, self.config.hidden_size,
                                     dtype=model.dtype, device=device)  # fmt: skip
        keys = [(n, length) for n in self.prefill_sizes for length in self.buckets]
        self.prefill_steps = CapturedSteps("talker prefill", self._prefill, keys, use_graphs=use)

    def capture(self) -> None:
        self.decode_steps.capture()
        if self.prefill_steps.keys:
            self.prefill_steps.capture()

    # ------------------------------------------------------------ host side (same contract as TalkerExecutor)

    def decode(self, kv_slots: list[int], positions: list[int], frame_index: list[int], text_ids: list[int],
               eos_allowed: list[bool], read_tokens: bool) -> list[int] | None:  # fmt: skip
        tokens = self.decode_tokens(kv_slots, positions, frame_index, text_ids, eos_allowed, read_tokens)
        return None if tokens is None else tokens.tolist()

    def decode_tokens(self, kv_slots: list[int], positions: list[int], frame_index: list[int], text_ids: list[int],
                      eos_allowed: list[bool], read_tokens: bool) -> Tensor | None:  # fmt: skip
        """`decode` without the read: the drawn tokens [B] stay on the device (None unless `read_tokens`)."""
        for slot, position in zip(kv_slots, positions, strict=True):
            assert self.cache.lengths[slot] == position, (
                f"KV slot {slot} holds {self.cache.lengths[slot]} positions, the plan expects {position}")
            if position + 1 > self.cache.max_len:
                raise RuntimeError(f"talker KV cache slot {slot} is full ({self.cache.max_len} positions)")
        check_top_k(self.slots.talker.host_top_k(kv_slots), self.top_k_cap, self.config.vocab_size)
        tokens: list[Tensor] = []
        for part in split_cohort(len(kv_slots), self.sizes):
            size = padded_size(len(part), self.sizes)
            text_rows = self.text.rows_for([text_ids[i] for i in part])
            self.inputs.load(size, kv_slot=pad_rows([kv_slots[i] for i in part], size),
                             position=pad_rows([positions[i] for i in part], size),
                             text_row=pad_rows(text_rows, size),
                             frame=pad_rows([frame_index[i] for i in part], size),
                             eos_never=pad_rows([int(not eos_allowed[i]) for i in part], size))  # fmt: skip
            self.decode_steps.replay(size)
            if read_tokens:  # the next replay overwrites the static buffer: keep this part's draw
                tokens.append(self.tokens[: len(part)].clone())
        self.cache.advance(kv_slots, [1] * len(kv_slots))
        return torch.cat(tokens) if read_tokens else None

    def prefill(self, kv_slots: list[int], embeds: list[Tensor], samplings: list[Sampling], seeds: list[int]) -> None:
        """Same contract as `TalkerExecutor.prefill`: embeds[i] [L_i,H] into slot kv_slots[i]."""
        if not self.prefill_steps.keys:
            raise RuntimeError("talker prefill graphs were not configured (prefill_sizes, prefill_buckets)")
        lengths = [e.shape[0] for e in embeds]
        bucket = padded_size(max(lengths), self.buckets)
        if min(lengths) < 1 or len(lengths) != len(kv_slots):
            raise ValueError("a prefill needs one non-empty prompt per KV slot")
        for slot in kv_slots:
            self.cache.reset(slot)
        self.slots.start_many(kv_slots, samplings, seeds)
        check_top_k([s.top_k for s in samplings], self.top_k_cap, self.config.vocab_size)
        for part in split_cohort(len(kv_slots), self.prefill_sizes):
            size = padded_size(len(part), self.prefill_sizes)
            rows = pad_rows(list(part), size)
            for i, r in enumerate(rows):
                self.prefill_x[i, : lengths[r]] = embeds[r]
            self.inputs.load(size, kv_slot=[kv_slots[r] for r in rows], position=[lengths[r] for r in rows],
                             text_row=[0] * size, frame=[0] * size, eos_never=[1] * size)  # fmt: skip
            self.prefill_steps.replay((size, bucket))
        self.cache.advance(kv_slots, lengths)

    # ------------------------------------------------------------ captured steps

    def _decode(self, n: int) -> None:
        index, positions = self.inputs["kv_slot"][:n], self.inputs["position"][:n]
        x = self.slots.frame_embed[index] + self.text.rows[self.inputs["text_row"][:n]]  # [n,H]
        cos, sin = (table[positions] for table in self.rope)  # [n,D]
        lengths = positions + 1

        def attend(layer: int, q: Tensor) -> Tensor:  # q [n,Hq,D] -> [n,Hq*D]
            k_cache, v_cache = self.caches[layer]
            return decode_attention(q, k_cache, v_cache, index, lengths).view(n, -1)

        chained = n in self.chain_rows

        def attend_qkv(layer: int, qkv: Tensor) -> Tensor:  # qkv [n,(Hq+2K)D] -> [n,Hq*D]
            k_cache, v_cache = self.caches[layer]
            fused = self.layers[layer]
            return decode_attention_rope(qkv, cos, sin, fused.q_norm, fused.k_norm, fused.eps, k_cache, v_cache,
                                         index, lengths, fused.num_heads, fused.num_kv_heads,
                                         pdl=chained).view(n, -1)  # fmt: skip

        norm = self.talker.model.norm.weight
        if chained:
            hidden = run_layers_chained(self.layers, x, norm, attend_qkv, self.chain_tiles[n])
        else:
            stack = run_layers_streamed if n <= self.gemv_max_rows else run_layers
            hidden = stack(self.layers, x, norm, cos, sin, self.caches, index, positions, attend,
                           attend_qkv if self.fused_rope else None)  # fmt: skip
        self._draw(hidden, index, self.inputs["frame"][:n] + 1, self.inputs["eos_never"][:n].bool())

    def _prefill(self, key: tuple[int, int]) -> None:
        n, length = key
        index = self.inputs["kv_slot"][:n]
        x = self.prefill_x[:n, :length].reshape(n * length, -1)  # [n*L,H]
        positions = torch.arange(length, device=index.device).repeat(n)  # [n*L]
        cos, sin = (table[positions] for table in self.rope)  # [n*L,D]

        def attend(layer: int, q: Tensor) -> Tensor:  # causal over the slot's fresh keys 0..L-1
            k_cache, v_cache = self.caches[layer]
            q4 = q.view(n, length, q.shape[1], q.shape[2]).transpose(1, 2)  # [n,Hq,L,D]
            with sdpa_kernel(CAPTURE_SAFE_SDPA):
                out = F.scaled_dot_product_attention(q4, k_cache[index, :, :length], v_cache[index, :, :length],
                                                     is_causal=True, enable_gqa=True)  # fmt: skip
            return out.transpose(1, 2).reshape(n * length, -1)

        hidden = run_layers(self.layers, x, self.talker.model.norm.weight, cos, sin, self.caches,
                            index[:, None].expand(n, length).reshape(-1), positions, attend)  # fmt: skip
        last = hidden.view(n, length, -1)[torch.arange(n, device=index.device), self.inputs["position"][:n] - 1]
        self._draw(last, index, torch.zeros_like(index), torch.ones_like(index, dtype=torch.bool))

    def _draw(self, hidden: Tensor, index: Tensor, frames: Tensor, eos_never: Tensor) -> None:
        s, c = self.slots, self.config
        if self.fused_draw:  # the same steps in one kernel, reading the head's output in its own dtype
            talker_draw(self.talker.codec_head(hidden), index, frames, eos_never, s.seen, s.generated, s.penalty,
                        s.talker.greedy, s.talker.temperature, s.talker.top_k, s.seeds, s.code0,
                        eos_id=c.codec_eos_id, num_codes=c.num_codes, cap=self.top_k_cap,
                        out=self.tokens[: hidden.shape[0]])  # fmt: skip
            s.hidden[index] = hidden
            return
        logits = self.talker.logits(hidden)  # [n,V] fp32
        scores = sampler.talker_scores(logits, s.seen[index], s.generated[index], s.penalty[index], c.codec_eos_id,
                                       c.num_codes, eos_never)  # fmt: skip
        tokens = sample(scores, s.talker.greedy[index], s.talker.temperature[index], s.talker.top_k[index],
                               self.top_k_cap, s.seeds[index], frames, 0)  # fmt: skip
        s.seen.index_put_((index, tokens), torch.ones_like(tokens, dtype=torch.bool))  # no host scalar in a graph
        s.generated[index] += 1
        s.hidden[index] = hidden
        s.code0[index] = tokens
        self.tokens[: tokens.shape[0]] = tokens
