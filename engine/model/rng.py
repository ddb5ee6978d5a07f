"""Counter-based randomness: every uniform is a pure hash of (seed, frame, group, vocab index).

No generator state, no host sync, only int64 tensor ops, so it can live inside a captured CUDA graph
and a request's draws never depend on which other requests share its batch or in what order they
run. The hash is SplitMix64 (Steele et al., 2014): a Weyl step followed by the 64-bit finaliser.

    key(seed, frame, group) = mix(mix(seed) + (16 * frame + group + 1) * GAMMA)
    u[v]                    = (top 23 bits of mix(key + (v + 1) * GAMMA) + 0.5) / 2^23   in (0, 1)

Why 23 bits and not 24: with 24, the largest pattern gives (2^24 - 0.5) / 2^24, which float32 rounds
up to exactly 1.0; then -log(u) = 0 and the exponential race computes 0 / 0 = NaN for every
zero-probability token, which argmax picks: a masked control id (e.g. 2718) as a codebook-0 code.
With 23 bits every uniform, the extremes included, is exact in float32 and strictly inside (0, 1).

int64 multiplication wraps modulo 2^64 on CPU and CUDA, which is the arithmetic SplitMix64 wants;
right shifts are made logical by masking off the sign-extended bits.
"""

from __future__ import annotations

import torch
from torch import Tensor

GROUPS_PER_FRAME = 16  # group 0: the talker's codebook-0 draw; 1..15: the code predictor's draws

# SplitMix64 constants as signed int64 (the same 64-bit patterns).
_GAMMA = -7046029254386353131  # 0x9E3779B97F4A7C15
_MUL1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MUL2 = -7723592293110705685  # 0x94D049BB133111EB
_UNIFORM_BITS = 23  # (bits + 0.5) / 2^23 is exact in float32 for every pattern (see the docstring)


def _shift_right(x: Tensor, bits: int) -> Tensor:
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(z: Tensor) -> Tensor:
    """SplitMix64 finaliser on int64 tensors (bijective on 64-bit patterns)."""
    z = (z ^ _shift_right(z, 30)) * _MUL1
    z = (z ^ _shift_right(z, 27)) * _MUL2
    return z ^ _shift_right(z, 31)


def seed_tensor(seeds: list[int], device: torch.device | str) -> Tensor:
    """Python ints of any size -> int64 [B], reduced modulo 2^64 to the signed range."""
    wrapped = [((s + 2**63) % 2**64) - 2**63 for s in seeds]
    return torch.tensor(wrapped, dtype=torch.int64, device=device)


def uniforms(seeds: Tensor, frames: Tensor, group: int, vocab: int) -> Tensor:
    """seeds [B] int64, frames [B] int64 -> float32 [B, vocab] in the open interval (0, 1)."""
    counter = frames * GROUPS_PER_FRAME + (group + 1)
    key = mix64(mix64(seeds) + counter * _GAMMA)  # [B]
    index = torch.arange(1, vocab + 1, device=seeds.device, dtype=torch.int64)  # [V]
    bits = _shift_right(mix64(key[:, None] + index * _GAMMA), 64 - _UNIFORM_BITS)  # [B,V]
    return bits_to_uniform(bits)


def bits_to_uniform(bits: Tensor) -> Tensor:
    """int64 patterns in [0, 2^23) -> float32 uniforms (bits + 0.5) / 2^23, exact and in (0, 1)."""
    return (bits.to(torch.float32) + 0.5) * (1.0 / (1 << _UNIFORM_BITS))
