"""Talker executor: batched prefill and batched decode over the slot KV cache, sampling codebook 0.

Prefill: rows of different prompt lengths, right-padded to the longest, each into its own KV slot; draws
codebook 0 of frame 0 (EOS masked). Decode: one token per row, rows at different positions; the input is
the frame's summed code embedding (from the code predictor) plus the text row of this step, and the draw
is codebook 0 of the next frame. Every draw uses the request's own counter-based RNG stream addressed by
(seed, frame, group 0), so a row's result never depends on its batch. Results stay on the device in
`GenerationSlots`; the sampled tokens are read back only when some row may sample EOS.

The arithmetic mirrors `engine.model.generate` (the reference loop) operation for operation, so a batch of
one reproduces `generate_codes` exactly; the tests hold the executors to that.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.executors.slots import GenerationSlots
from engine.ipc.messages import Sampling
from engine.model import sampling as sampler
from engine.model.host_copy import device_ids
from engine.model.kv_cache import TalkerKVCache
from engine.model.qwen3_tts import Qwen3TTS


class TalkerExecutor:
    def __init__(self, model: Qwen3TTS, slots: GenerationSlots, cache: TalkerKVCache) -> None:
        self.model = model
        self.talker = model.talker
        self.slots = slots
        self.cache = cache
        self.eos_id = model.config.talker.codec_eos_id
        self.num_codes = model.config.talker.num_codes

    def prefill(self, kv_slots: list[int], embeds: list[Tensor], samplings: list[Sampling], seeds: list[int]) -> None:
        """embeds[i] [L_i,H]: the prompt rows of request i (`generate.embed_prefill`), into slot kv_slots[i]."""
        for slot in kv_slots:
            self.cache.reset(slot)
        self.slots.start_many(kv_slots, samplings, seeds)
        lengths = [e.shape[0] for e in embeds]
        x = torch.nn.utils.rnn.pad_sequence(embeds, batch_first=True)  # [B,Lmax,H], zero rows after each prompt
        hidden = self.talker(x, self.cache, self.cache.prefill_batch(kv_slots, lengths))  # [B,Lmax,H]
        self.cache.advance(kv_slots, lengths)
        logits = self.talker.logits(hidden)  # [B,Lmax,V]: the official head runs over every prefill row
        rows = torch.arange(len(kv_slots), device=x.device)
        last = device_ids(lengths, x.device) - 1
        index = self.slots.index(kv_slots)
        frames = torch.zeros(len(kv_slots), dtype=torch.int64, device=x.device)  # codebook 0 of frame 0
        eos_never = torch.ones(len(kv_slots), dtype=torch.bool, device=x.device)
        tokens = self._draw(logits[rows, last], index, kv_slots, frames, eos_never)
        self.slots.hidden[index] = hidden[rows, last]
        self.slots.code0[index] = tokens

    def decode(self, kv_slots: list[int], positions: list[int], frame_index: list[int], text_ids: list[int],
               eos_allowed: list[bool], read_tokens: bool) -> list[int] | None:
        """One step per row: feed frame `frame_index[i]` plus text id `text_ids[i]`, draw codebook 0 of the
        next frame. Returns the drawn tokens only when `read_tokens` (some row may sample EOS)."""
        tokens = self.decode_tokens(kv_slots, positions, frame_index, text_ids, eos_allowed, read_tokens)
        return None if tokens is None else tokens.tolist()

    def decode_tokens(self, kv_slots: list[int], positions: list[int], frame_index: list[int], text_ids: list[int],
                      eos_allowed: list[bool], read_tokens: bool) -> Tensor | None:
        """`decode` without the read: the drawn tokens [B] stay on the device (None unless `read_tokens`)."""
        for slot, position in zip(kv_slots, positions, strict=True):
            assert self.cache.lengths[slot] == position, (
                f"KV slot {slot} holds {self.cache.lengths[slot]} positions, the plan expects {position}")
        device = self.slots.device
        index = self.slots.index(kv_slots)
        text = self.talker.embed_text(torch.tensor(text_ids, device=device))  # [B,H]
        x = self.slots.frame_embed[index][:, None] + text[:, None]  # [B,1,H]
        hidden = self.talker(x, self.cache, self.cache.decode_batch(kv_slots))[:, 0]  # [B,H]
        self.cache.advance(kv_slots, [1] * len(kv_slots))
        logits = self.talker.logits(hidden)  # [B,V] fp32
        frames = device_ids(frame_index, device) + 1
        eos_never = device_ids([not allowed for allowed in eos_allowed], device, torch.bool)
        tokens = self._draw(logits, index, kv_slots, frames, eos_never)
        self.slots.hidden[index] = hidden
        self.slots.code0[index] = tokens
        # The only device -> host read of the generation lane, and only when EOS can fire: the caller copies
        # these asynchronously and reads them once an event says they arrived.
        return tokens.clone() if read_tokens else None

    def _draw(self, logits: Tensor, index: Tensor, kv_slots: list[int], frames: Tensor, eos_never: Tensor) -> Tensor:
        """Official processors (penalty, EOS and control masks, temperature, top-k) then the seeded draw. -> [B]"""
        s = self.slots
        scores = sampler.talker_scores(logits, s.seen[index], s.generated[index], s.penalty[index], self.eos_id,
                                       self.num_codes, eos_never)
        probs = sampler.processed_probs(scores, s.talker.rows(index, kv_slots))
        tokens = sampler.draw(probs, s.seeds[index], frames, group=0)
        s.seen[index, tokens] = True
        s.generated[index] += 1
        return tokens
