"""Code-predictor executor: the 15-step loop that completes one frame for a batch of requests.

Per row: a causal 2-token prefill [h_k, C(c_k^0)] predicts group 1, then group g-1's code embedding
predicts group g for g = 2..15, each draw from the request's RNG stream addressed by (seed, frame k,
group g). The finished frame [16] is written to the request's codec stream row of the code buffer, and
the sum of its 16 code embeddings (the next talker input, before the text row) to `frame_embed`.

The 16-position scratch cache is preallocated for the largest batch and every row moves through the
positions in lockstep, so the whole frame (sampling included) has static shapes per batch size: the
unit a CUDA graph will capture. Nothing is read back to the host.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.executors.slots import GenerationSlots
from engine.model import sampling as sampler
from engine.model.host_copy import device_ids
from engine.model.qwen3_tts import Qwen3TTS


class CodePredictorExecutor:
    def __init__(self, model: Qwen3TTS, slots: GenerationSlots, codes: Tensor, max_batch: int) -> None:
        self.model = model
        self.predictor = model.code_predictor
        self.slots = slots
        self.codes = codes  # [C,F,16] int64, see engine/executors/slots.py
        self.cache = self.predictor.new_cache(max_batch)
        self.max_batch = max_batch

    def predict(self, kv_slots: list[int], stream_slots: list[int], frame_index: list[int]) -> None:
        """Complete frame `frame_index[i]` of the request in KV slot `kv_slots[i]` / codec stream `stream_slots[i]`."""
        if len(kv_slots) > self.max_batch:
            raise ValueError(f"code-predictor batch of {len(kv_slots)} exceeds the preallocated {self.max_batch}")
        device = self.slots.device
        index = self.slots.index(kv_slots)
        hidden, code0 = self.slots.hidden[index], self.slots.code0[index]  # [B,H], [B]
        settings = self.slots.predictor.rows(index, kv_slots)
        seeds = self.slots.seeds[index]
        frames = device_ids(frame_index, device)

        def draw(group: int, logits: Tensor) -> Tensor:
            return sampler.draw(sampler.processed_probs(logits, settings), seeds, frames, group)

        x = torch.stack((hidden, self.model.talker.embed_codec(code0)), dim=1)  # [B,2,H]
        logits = self.predictor.logits(1, self.predictor(x, self.cache, start=0))[:, -1]  # head over both rows
        groups = [draw(1, logits)]
        for group in range(2, self.predictor.config.num_code_groups):
            x = self.predictor.embed_code(group - 1, groups[-1])[:, None]  # [B,1,H]
            logits = self.predictor.logits(group, self.predictor(x, self.cache, start=group))[:, 0]
            groups.append(draw(group, logits))
        frame = torch.cat((code0[:, None], torch.stack(groups, dim=1)), dim=1)  # [B,16]

        streams = device_ids(stream_slots, device)
        self.codes[streams, frames] = frame
        parts = [self.model.talker.embed_codec(frame[:, 0])]
        parts += [self.predictor.embed_code(g, frame[:, g]) for g in range(1, frame.shape[1])]
        self.slots.frame_embed[index] = torch.stack(parts, dim=1).sum(1)  # [B,H], the reference's 16-way sum
