"""Token selection inside captured graphs: the plain sampler's arithmetic with a static top-k width.

`engine.model.sampling.processed_probs` sizes its `topk` by the rows' largest top-k, a host value that
changes with the batch; a graph needs one width. Here `topk` always takes `cap` values: a row with
0 < top_k <= cap reads the same k-th value as the plain sampler, a row with top_k = 0 (or >= vocab)
keeps every token (threshold -inf, which the plain k-th value, the row minimum, equals in effect).
Rows with cap < top_k < vocab cannot be served: `check_top_k` says so before anything runs.
Greedy rows take the argmax, which is what the plain exponential race returns for a one-hot row.
Same logits and same RNG counters give the same tokens as the plain sampler.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from engine.model import rng

DEFAULT_TOP_K_CAP = 64


def check_top_k(top_ks: Sequence[int], cap: int, vocab: int) -> None:
    bad = [k for k in top_ks if cap < k < vocab]
    if bad:
        raise ValueError(f"top_k {bad[0]} is above the fast path's cap of {cap} (0 or >= {vocab} disable top-k)")


def sample_tokens(
    scores: Tensor, greedy: Tensor, temperature: Tensor, top_k: Tensor, cap: int,
    seeds: Tensor, frames: Tensor, group: int,
) -> Tensor:  # fmt: skip
    """scores [B,V] fp32, greedy [B] bool, temperature [B,1], top_k [B], seeds/frames [B] -> tokens [B] int64."""
    vocab = scores.shape[-1]
    warped = scores / temperature
    top_values = torch.topk(warped, min(cap, vocab), dim=-1).values  # [B,cap], sorted descending
    limited = (top_k > 0) & (top_k <= min(cap, vocab))  # [B]
    kth = top_values.gather(1, (top_k.clamp(1, min(cap, vocab)) - 1)[:, None])  # [B,1]
    kth = torch.where(limited[:, None], kth, float("-inf"))
    probs = torch.softmax(warped.masked_fill(warped < kth, float("-inf")), dim=-1)
    u = rng.uniforms(seeds, frames, group, vocab)
    race = (probs / -torch.log(u)).argmax(-1)
    return torch.where(greedy, scores.argmax(-1), race)
