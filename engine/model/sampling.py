"""Token selection with the official logits processors, in their order (reference 6.3), batched per row.

Talker:         fp32 logits -> repetition penalty over this request's codebook-0 history -> EOS masked
                while fewer than 2 tokens were generated (or always, for random-weight models) ->
                control ids suppressed -> [greedy: argmax] | temperature -> top-k -> softmax -> draw.
Code predictor: fp32 logits -> [greedy: argmax] | temperature -> top-k -> softmax -> draw.

Draws are an exponential race over the processed probabilities, argmax(p / -log u), with u from
`rng.uniforms` addressed by (seed, frame, group): distributed exactly as multinomial(p), but a pure
function of the request's own counters. Every per-request setting is a per-row tensor, so rows with
different sampling settings share one call; nothing here reads a tensor back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.ipc.messages import Sampling
from engine.model import rng

MIN_NEW_TOKENS = 2  # the official generate forbids EOS as the first two codebook-0 tokens


@dataclass(frozen=True, slots=True)
class RowSettings:
    """One sampler's settings for B rows: greedy [B] bool, temperature [B,1] fp32, top_k [B] int64.

    `kmax` is a host-side bound on the rows' top-k (0: the whole vocabulary), known when the rows are
    admitted, so `topk` never needs a tensor read back.
    """

    greedy: Tensor
    temperature: Tensor
    top_k: Tensor
    kmax: int

    @staticmethod
    def talker(samplings: list[Sampling], device: torch.device | str) -> RowSettings:
        return _rows([(s.greedy, s.temperature, s.top_k) for s in samplings], device)

    @staticmethod
    def code_predictor(samplings: list[Sampling], device: torch.device | str) -> RowSettings:
        rows = [(s.subtalker_greedy, s.subtalker_temperature, s.subtalker_top_k) for s in samplings]
        return _rows(rows, device)

    def take(self, rows: Tensor) -> RowSettings:
        return RowSettings(self.greedy[rows], self.temperature[rows], self.top_k[rows], self.kmax)


def _rows(values: list[tuple[bool, float, int]], device: torch.device | str) -> RowSettings:
    for greedy, temperature, top_k in values:
        if not greedy and not temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")
    return RowSettings(
        greedy=torch.tensor([v[0] for v in values], dtype=torch.bool, device=device),
        temperature=torch.tensor(
            [[v[1] if not v[0] else 1.0] for v in values], dtype=torch.float32, device=device
        ),
        top_k=torch.tensor([v[2] for v in values], dtype=torch.int64, device=device),
        kmax=0 if any(v[2] == 0 for v in values) else max(v[2] for v in values),
    )


def talker_scores(
    logits: Tensor,
    seen: Tensor,
    generated: Tensor,
    penalty: Tensor,
    eos_id: int,
    num_codes: int,
    eos_never: Tensor,
) -> Tensor:
    """Penalised and masked talker scores [B,V] (the official processors before temperature).

    logits [B,V] fp32; seen [B,V] bool marks codebook-0 ids this request generated; generated [B]
    int64 counts them; penalty [B,1] fp32; eos_never [B] bool forbids EOS outright (length model).
    """
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    scores = torch.where(seen, penalised, logits)
    vocab = torch.arange(scores.shape[-1], device=scores.device)
    eos_masked = (generated < MIN_NEW_TOKENS) | eos_never  # [B]
    scores = torch.where((vocab == eos_id) & eos_masked[:, None], float("-inf"), scores)
    suppressed = (vocab >= num_codes) & (vocab != eos_id)  # control, language and speaker ids
    return torch.where(suppressed, float("-inf"), scores)


def processed_probs(scores: Tensor, settings: RowSettings) -> Tensor:
    """scores [B,V] -> the distribution each row draws from [B,V] fp32 (one-hot argmax for greedy rows)."""
    warped = scores / settings.temperature
    vocab = scores.shape[-1]
    k = torch.where(settings.top_k > 0, settings.top_k.clamp(max=vocab), vocab)  # [B]
    kmax = vocab if settings.kmax == 0 else min(settings.kmax, vocab)
    top_values = torch.topk(warped, kmax, dim=-1).values  # [B,kmax], sorted descending
    kth = top_values.gather(1, (k.clamp(max=kmax) - 1)[:, None])  # [B,1]: ties at the threshold stay
    probs = torch.softmax(warped.masked_fill(warped < kth, float("-inf")), dim=-1)
    one_hot = torch.nn.functional.one_hot(scores.argmax(-1), vocab).to(probs.dtype)
    return torch.where(settings.greedy[:, None], one_hot, probs)


def draw(probs: Tensor, seeds: Tensor, frames: Tensor, group: int) -> Tensor:
    """Exponential race: argmax(p / -log u) over [B,V]; one-hot rows return their hot index. -> [B] int64."""
    u = rng.uniforms(seeds, frames, group, probs.shape[-1])
    return (probs / -torch.log(u)).argmax(-1)
