"""Incremental decoding equals one full decode, for any chunk schedule, any batch mix, any width."""

from __future__ import annotations

import random

import pytest
import torch

from engine.codec.config import codec_preset
from engine.codec.stream import CodecStatePool, decode_incremental
from engine.codec.weights import random_codec
from tests.codec.helpers import chunks_of, decode_in_chunks, random_codes, relative_l2

TOLERANCE = 1e-5  # relative L2, fp32 (issue 3)


def irregular(seed: int, frames: int) -> list[int]:
    rng = random.Random(seed)
    sizes = []
    while sum(sizes) < frames:
        sizes.append(rng.choice([1, 1, 2, 3, 5, 7, 12, 25, 40, 70, 71, 72, 73, 100]))
    return sizes


# (frames, schedule): 1-frame chunks, the fixed ramps of the peers, irregular ones, chunks that end exactly
# on, just before and just after the 72-frame window, and one chunk larger than the window.
CASES = [
    (1, [1]),
    (2, [1]),
    (5, [2, 3]),
    (73, [1]),
    (160, [1]),  # the ring wraps twice
    (300, [1, 2, 4, 8, 12]),
    (300, [4, 4, 8, 16, 25]),
    (300, [300]),
    (144, [71, 1]),
    (145, [72]),
    (146, [73]),
    (200, [150, 50]),
    (97, irregular(1, 97)),
    (251, irregular(2, 251)),
    (300, irregular(3, 300)),
]


@pytest.fixture(scope="module")
def tiny_full_decodes(tiny):
    cache = {}

    def full(frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        if frames not in cache:
            codes = random_codes(1, frames, seed=frames)
            cache[frames] = (codes, tiny.decode(codes))
        return cache[frames]

    return full


@pytest.mark.parametrize(("frames", "schedule"), CASES, ids=[f"{f}-{s[:5]}" for f, s in CASES])
def test_incremental_decode_equals_full_decode(tiny, tiny_full_decodes, frames, schedule):
    codes, expected = tiny_full_decodes(frames)
    streamed = decode_in_chunks(tiny, codes, schedule)
    assert streamed.shape == (1, frames * 1920)
    assert relative_l2(streamed, expected) < TOLERANCE


def test_incremental_decode_is_exact_in_float64(tiny64):
    """In fp64 the only difference left is rounding: equal to ~1e-15, so no approximation hides in fp32."""
    codes = random_codes(2, 100, seed=3)
    expected = tiny64.decode(codes)
    assert expected.dtype == torch.float64
    assert relative_l2(decode_in_chunks(tiny64, codes, irregular(9, 100)), expected) < 1e-12


def test_incremental_decode_at_full_width_equals_full_decode(full):
    codes = random_codes(1, 6, seed=21)
    expected = full.decode(codes)
    assert relative_l2(decode_in_chunks(full, codes, [1, 2, 3]), expected) < TOLERANCE


def test_full_width_transformer_state_crosses_the_window(hybrid):
    """Full-width quantizer, pre-conv, 8-layer transformer and upsampling over 90 frames (past the 72-frame
    window), narrow vocoder to keep it fast."""
    codes = random_codes(1, 90, seed=22)
    expected = hybrid.decode(codes)
    assert relative_l2(decode_in_chunks(hybrid, codes, [30, 1, 1, 40, 18]), expected) < TOLERANCE


def test_batch_of_streams_with_different_histories_equals_each_alone(tiny):
    """Three streams at positions 0, 5 and 80 decode 4 new frames in one call: each row equals that
    stream decoded alone with the same chunks, and equals its full decode."""
    histories = [0, 5, 80]
    new = 4
    codes = [random_codes(1, h + new, seed=100 + h) for h in histories]

    pool = CodecStatePool(tiny.config, 4, "cpu", torch.float32)
    slots = [pool.alloc() for _ in histories]
    for slot, history, c in zip(slots, histories, codes, strict=True):
        if history:
            decode_incremental(tiny, pool, [slot], c[..., :history])
    batch_codes = torch.cat([c[..., -new:] for c in codes], dim=0)
    batched = decode_incremental(tiny, pool, slots, batch_codes, expected_positions=histories)

    for row, (history, c) in enumerate(zip(histories, codes, strict=True)):
        schedule = [history, new] if history else [new]
        alone = decode_in_chunks(tiny, c, schedule)[..., history * 1920 :]
        assert relative_l2(batched[row : row + 1], alone) < TOLERANCE
        assert relative_l2(batched[row : row + 1], tiny.decode(c)[..., history * 1920 :]) < TOLERANCE
    assert [pool.position(s) for s in slots] == [h + new for h in histories]


def test_batch_order_and_neighbours_do_not_change_a_stream(tiny):
    codes = random_codes(3, 20, seed=8)
    forward = decode_in_chunks(tiny, codes, [3, 5, 12])
    reversed_rows = decode_in_chunks(tiny, codes.flip(0), [3, 5, 12]).flip(0)
    assert relative_l2(reversed_rows, forward) < TOLERANCE


def test_bf16_incremental_decode_is_as_close_to_fp32_as_bf16_full_decode(tiny):
    """bf16 cannot meet 1e-5 (its own rounding is ~1e-2 after the vocoder); streaming must not add to it."""
    tiny16 = random_codec(codec_preset("tiny"), dtype=torch.bfloat16, seed=11)
    codes = random_codes(1, 90, seed=4)
    reference = tiny.decode(codes)
    full16 = tiny16.decode(codes)
    streamed16 = decode_in_chunks(tiny16, codes, [1, 2, 4, 8, 12])
    assert full16.dtype == streamed16.dtype == torch.float32
    full_error = relative_l2(full16, reference)
    assert 0 < full_error < 0.1
    assert relative_l2(streamed16, reference) < 2 * full_error


def test_chunks_of_splits_exactly():
    assert chunks_of(10, [1, 2, 4]) == [1, 2, 4, 3]
    assert sum(chunks_of(300, irregular(5, 300))) == 300
