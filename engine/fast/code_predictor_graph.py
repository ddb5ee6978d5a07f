"""Code-predictor fast path: the whole 15-step frame, sampling and the summed code embedding included,
as ONE captured CUDA graph per batch size. A drop-in for `CodePredictorExecutor.predict`.

One replay, for n (padded) rows, reads  kv_slot/stream/frame [n] from the static inputs and
GenerationSlots.hidden/code0 and sampler settings at the kv slots, then runs
    [h, C(c0)] at positions 0,1 -> group 1;  E_{g-1}(c_{g-1}) at position g -> group g, g = 2..15
through the fused decoder stack (`decoder.run_layers`) over the preallocated 16-position cache (attention:
the Triton per-row-length kernel, one query row per token), draws
each group from the request's counter-based RNG (seed, frame, group), and writes
    codes[stream, frame] = the frame [16]        frame_embed[kv_slot] = sum of its 16 code embeddings.
Nothing is read back to the host. Positions are static per step, so RoPE tables are constants.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from engine.executors.slots import GenerationSlots
from engine.fast.decoder import fuse_layers, rope_tables, run_layers
from engine.fast.graphs import CapturedSteps, StaticInputs, check_sizes, pad_rows, padded_size, split_cohort
from engine.fast.kernels.decode_attention import decode_attention
from engine.fast.sampling import DEFAULT_TOP_K_CAP, check_top_k, sample_tokens
from engine.model.qwen3_tts import Qwen3TTS


class CodePredictorGraphs:
    def __init__(self, model: Qwen3TTS, slots: GenerationSlots, codes: Tensor, capture_sizes: Sequence[int], *,
                 use_graphs: bool | None = None, top_k_cap: int = DEFAULT_TOP_K_CAP) -> None:  # fmt: skip
        self.model = model
        self.predictor = model.code_predictor
        self.config = self.predictor.config
        self.slots = slots
        self.codes = codes  # [C,F,16] int64
        self.sizes = check_sizes(capture_sizes)
        self.max_batch = self.sizes[-1]
        self.top_k_cap = top_k_cap
        self.layers = fuse_layers(self.predictor.model.layers)
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
        s, predictor, c = self.slots, self.predictor, self.config
        index, streams, frames = self.inputs["kv_slot"][:n], self.inputs["stream"][:n], self.inputs["frame"][:n]
        settings = (s.predictor.greedy[index], s.predictor.temperature[index], s.predictor.top_k[index])
        seeds = s.seeds[index]
        code0 = s.code0[index]  # [n]
        caches = [self.cache.layer(i) for i in range(c.num_layers)]
        rows = torch.arange(n, device=index.device)

        # Step 1: [h_k, C(c_k^0)] at positions 0,1 (token rows b*2 + t), causal.
        x = torch.stack((s.hidden[index], self.model.talker.embed_codec(code0)), dim=1).view(2 * n, -1)
        two = torch.arange(2, device=index.device).repeat(n)  # positions 0,1 of each row; they see 1 and 2 keys
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
