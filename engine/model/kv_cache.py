"""Runtime KV state, preallocated once: the talker's slot cache and the code predictor's 16-position cache.

Talker cache, one tensor (a slot is one request's row; the scheduler hands slot numbers out):

    kv[layer, 0 = keys | 1 = values, slot, kv_head, position, head_dim]     shape [N, 2, S, K, L, D]
    lengths[slot]                                                          positions filled so far

`prefill_batch` / `decode_batch` turn (slots, new-token counts) into the `AttentionBatch` every layer
uses: rows at different lengths share one forward, a boolean mask hides each row's keys beyond its
own length, and batch-1 calls produce the exact mask-free SDPA calls of the official model. Lengths
advance only through `advance`, after the forward succeeded. Code-predictor cache: all rows of a
frame batch move through positions 0..15 in lockstep, so it needs no lengths and no mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.model.host_copy import device_ids
from engine.model.layers import AttentionBatch


class TalkerKVCache:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        *,
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> None:
        self.max_len = max_len
        self.kv = torch.zeros(
            num_layers, 2, num_slots, num_kv_heads, max_len, head_dim, device=device, dtype=dtype
        )
        self.lengths = [0] * num_slots  # host copy: the reference path plans on the host

    @property
    def num_slots(self) -> int:
        return len(self.lengths)

    def layer(self, index: int) -> tuple[Tensor, Tensor]:
        """Keys and values of one layer, each [S,K,L,D] (views, written in place by attention)."""
        return self.kv[index, 0], self.kv[index, 1]

    def reset(self, slot: int) -> None:
        self.lengths[slot] = 0

    def prefill_batch(self, slots: list[int], new_tokens: list[int]) -> AttentionBatch:
        """Rows append `new_tokens[i]` tokens to slot `slots[i]`; inputs are right-padded to the longest."""
        starts = [self.lengths[s] for s in slots]
        width = max(new_tokens)
        ends = [start + n for start, n in zip(starts, new_tokens, strict=True)]
        self._check_room(slots, ends)
        kv_len = max(start + width for start in starts)  # padded queries write (ignored) keys up to here
        device = self.kv.device
        positions = torch.tensor(starts, device=device)[:, None] + torch.arange(width, device=device)  # [B,T]
        if len(slots) == 1 and starts[0] == 0:
            dense = 0 if slots == [0] else None
            return AttentionBatch(_slots(slots, device), positions, kv_len, is_causal=True, dense_start=dense)
        keys = torch.arange(kv_len, device=device)  # [kv_len]
        limit = torch.tensor(ends, device=device)[:, None, None]  # [B,1,1]
        # [B,T,kv_len]: causal, and never past the row's own length (padded queries included)
        mask = (keys <= positions[:, :, None]) & (keys < limit)
        return AttentionBatch(_slots(slots, device), positions, kv_len, mask=mask[:, None])

    def decode_batch(self, slots: list[int]) -> AttentionBatch:
        """One new token per row, each at its own slot's next position."""
        starts = [self.lengths[s] for s in slots]
        self._check_room(slots, [s + 1 for s in starts])
        kv_len = max(starts) + 1
        device = self.kv.device
        positions = torch.tensor(starts, device=device)[:, None]  # [B,1]
        if all(start == kv_len - 1 for start in starts):  # every key visible: no mask
            dense = kv_len - 1 if slots == list(range(len(slots))) else None
            return AttentionBatch(_slots(slots, device), positions, kv_len, dense_start=dense)
        mask = torch.arange(kv_len, device=device) <= positions[:, :, None]  # [B,1,kv_len]
        return AttentionBatch(_slots(slots, device), positions, kv_len, mask=mask[:, None])

    def advance(self, slots: list[int], new_tokens: list[int]) -> None:
        for slot, n in zip(slots, new_tokens, strict=True):
            self.lengths[slot] += n

    def _check_room(self, slots: list[int], ends: list[int]) -> None:
        for slot, end in zip(slots, ends, strict=True):
            if end > self.max_len:
                raise RuntimeError(
                    f"talker KV cache slot {slot} is full: needs {end} positions, has {self.max_len}"
                )


class CodePredictorCache:
    """Scratch keys/values for one frame batch: [N, 2, B, K, 16, D], overwritten every frame."""

    def __init__(
        self, num_layers: int, batch: int, num_kv_heads: int, positions: int, head_dim: int,
        *, device: torch.device | str, dtype: torch.dtype,
    ) -> None:  # fmt: skip
        self.kv = torch.zeros(
            num_layers, 2, batch, num_kv_heads, positions, head_dim, device=device, dtype=dtype
        )
        self.slots = torch.arange(batch, device=device)

    def layer(self, index: int) -> tuple[Tensor, Tensor]:
        return self.kv[index, 0], self.kv[index, 1]

    def batch(self, rows: int, start: int, new_tokens: int) -> AttentionBatch:
        """`rows` frames (the first rows of the cache) add tokens at positions start..start+new_tokens-1."""
        assert new_tokens == 1 or start == 0, "multi-token steps only as the frame's first (causal) prefill"
        positions = torch.arange(start, start + new_tokens, device=self.kv.device).expand(rows, new_tokens)
        return AttentionBatch(
            self.slots[:rows], positions, start + new_tokens, is_causal=new_tokens > 1, dense_start=start
        )


def _slots(slots: list[int], device: torch.device) -> Tensor:
    return device_ids(slots, device)
