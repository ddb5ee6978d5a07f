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


def chunks_of(frames: int, schedule: list[int]) -> list[int]:
    """Split `frames` by `schedule` (the last entry repeats; the final chunk takes what is left)."""
    sizes, done = [], 0
    while done < frames:
        size = min(schedule[min(len(sizes), len(schedule) - 1)], frames - done)
        sizes.append(size)
        done += size
    return sizes


def decode_in_chunks(decoder, codes: torch.Tensor, schedule: list[int]) -> torch.Tensor:
    """Stream codes [B, 16, T] through decode_incremental with the given chunk sizes; concatenated audio."""
    from engine.codec.stream import CodecStatePool, decode_incremental

    pool = CodecStatePool(decoder.config, codes.shape[0], decoder.device, decoder.dtype)
    slots = [pool.alloc() for _ in range(codes.shape[0])]
    pieces, start = [], 0
    for size in chunks_of(codes.shape[-1], schedule):
        pieces.append(decode_incremental(decoder, pool, slots, codes[..., start : start + size]))
        start += size
    assert [pool.position(s) for s in slots] == [codes.shape[-1]] * len(slots)
    return torch.cat(pieces, dim=-1)
