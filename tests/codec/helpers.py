"""Helpers for the codec tests: seeded codes, relative error, the hybrid config."""

from __future__ import annotations

import dataclasses

import torch

from engine.codec.config import CodecConfig, codec_preset


def hybrid_config() -> CodecConfig:
    """Full widths up to the vocoder (quantizer, pre-conv, 8-layer transformer, upsample, decoder.0) with a
    narrow vocoder, so full-width transformer state can be tested across the 72-frame window on a CPU."""
    return dataclasses.replace(codec_preset("full"), decoder_dim=64)


def random_codes(batch: int, frames: int, seed: int, codebook_size: int = 2048) -> torch.Tensor:
    return torch.randint(0, codebook_size, (batch, 16, frames), generator=torch.Generator().manual_seed(seed))


def relative_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.double(), expected.double()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))
