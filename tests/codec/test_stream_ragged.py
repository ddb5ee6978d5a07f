"""A ragged codec batch (each row decodes its own number of real frames, padded to the longest) leaves every
stream exactly where decoding only its real frames would have: same audio, same state, same position."""

from __future__ import annotations

import pytest
import torch

from engine.codec.config import codec_preset
from engine.codec.stream import CodecStatePool, decode_incremental
from engine.codec.weights import random_codec
from engine.fast.codec_fast import FastCodecDecoder
from tests.codec.helpers import decode_in_chunks, random_codes, relative_l2


def _ragged_then_whole(decoder, histories: list[int], real: list[int], pad: int, after: int, seed: int):
    """Streams at `histories` frames decode real[b] frames in one ragged call of max(real) + pad frames
    (padding: random codes), then `after` more frames each in one whole call. Returns (the ragged call's
    real audio per row, the last call's audio, the pool, slots, each stream's codes)."""
    n = max(real) + pad
    codes = [random_codes(1, h + r + after, seed=seed + i) for i, (h, r) in enumerate(zip(histories, real, strict=True))]
    pool = CodecStatePool(decoder.config, len(histories), "cpu", decoder.dtype)
    slots = [pool.alloc() for _ in histories]
    for slot, h, c in zip(slots, histories, codes, strict=True):
        if h:
            decode_incremental(decoder, pool, [slot], c[..., :h])
    garbage = random_codes(len(histories), n, seed=seed + 99)
    batch = garbage.clone()
    for row, (h, r, c) in enumerate(zip(histories, real, codes, strict=True)):
        batch[row, :, :r] = c[0, :, h : h + r]
    wav = decode_incremental(decoder, pool, slots, batch, expected_positions=histories, frames=real)
    ragged = [wav[row, : r * 1920] for row, r in enumerate(real)]
    tail = torch.cat([c[..., h + r :] for h, r, c in zip(histories, real, codes, strict=True)], dim=0)
    last = decode_incremental(decoder, pool, slots, tail, expected_positions=[h + r for h, r in zip(histories, real, strict=True)])
    return ragged, last, pool, slots, codes


@pytest.mark.parametrize(("histories", "real", "pad"), [
    ([0, 0, 0], [1, 4, 3], 0),  # first chunks: fresh state
    ([5, 80, 2], [2, 1, 4], 3),  # mid-stream, one past the 72-frame window, padding beyond the longest row
    ([70, 71, 0], [25, 1, 12], 0),  # the transformer ring wraps inside the call
])  # fmt: skip
def test_each_row_of_a_ragged_batch_equals_its_stream_decoded_alone(tiny64, histories, real, pad):
    ragged, last, pool, slots, codes = _ragged_then_whole(tiny64, histories, real, pad, after=6, seed=40)
    for row, (h, r, c) in enumerate(zip(histories, real, codes, strict=True)):
        full = tiny64.decode(c)[0]
        assert relative_l2(ragged[row], full[h * 1920 : (h + r) * 1920]) < 1e-12
        # The state it left continues the stream exactly: the next whole call equals the full decode.
        assert relative_l2(last[row], full[(h + r) * 1920 :]) < 1e-12
    assert [pool.position(s) for s in slots] == [h + r + 6 for h, r in zip(histories, real, strict=True)]
    assert pool.positions.tolist()[: len(slots)] == [pool.position(s) for s in slots]


def test_a_ragged_batch_whose_rows_are_all_whole_equals_the_plain_call(tiny):
    codes = random_codes(3, 9, seed=7)
    plain_pool = CodecStatePool(tiny.config, 3, "cpu", torch.float32)
    slots = [plain_pool.alloc() for _ in range(3)]
    ragged_pool = plain_pool.clone()
    plain = decode_incremental(tiny, plain_pool, slots, codes)
    ragged = decode_incremental(tiny, ragged_pool, slots, codes, frames=[9, 9, 9])
    assert torch.equal(plain, ragged)
    assert torch.equal(plain_pool.flat, ragged_pool.flat)


def test_ragged_counts_outside_one_to_n_or_a_window_wide_call_are_refused(tiny):
    pool = CodecStatePool(tiny.config, 2, "cpu", torch.float32)
    slots = [pool.alloc(), pool.alloc()]
    for frames in ([0, 2], [3, 2], [1]):
        with pytest.raises(ValueError, match="frames"):
            decode_incremental(tiny, pool, slots, random_codes(2, 2, seed=1), frames=frames)
    window = tiny.config.sliding_window
    with pytest.raises(ValueError, match="ragged codec step"):
        decode_incremental(tiny, pool, slots, random_codes(2, window, seed=1), frames=[1, window])
    assert [pool.position(s) for s in slots] == [0, 0]  # nothing advanced


def test_the_fast_codec_decodes_a_ragged_batch_as_the_plain_codec_does(tiny):
    """Same contract on the fused path (fp32 on a CPU: bf16 parity between the paths is a GPU-check item)."""
    fast = FastCodecDecoder(tiny, precision="fp32")
    histories, real = [3, 74, 0], [4, 1, 2]
    results = [_ragged_then_whole(d, histories, real, pad=1, after=3, seed=60) for d in (tiny, fast)]
    (plain_ragged, plain_last, plain_pool, _, _), (fast_ragged, fast_last, fast_pool, _, _) = results
    for a, b in zip(plain_ragged, fast_ragged, strict=True):
        assert relative_l2(b, a) < 1e-5
    assert relative_l2(fast_last, plain_last) < 1e-5
    assert relative_l2(fast_pool.flat, plain_pool.flat) < 1e-5


def test_in_bf16_fast_ragged_rows_are_as_close_to_fp32_as_the_stream_decoded_alone():
    """bf16 rounding depends on buffer lengths, so not bitwise: the ragged rows' error against the fp32 decode
    must stay within that of the same streams decoded alone in bf16 (the error bf16 has anyway)."""
    reference = random_codec(codec_preset("tiny"), dtype=torch.float32, seed=3)
    fast = FastCodecDecoder(reference.to(torch.bfloat16), precision="bf16")
    histories, real = [3, 74, 0], [4, 1, 2]
    ragged, last, _, _, codes = _ragged_then_whole(fast, histories, real, pad=1, after=3, seed=61)
    for row, (h, r, c) in enumerate(zip(histories, real, codes, strict=True)):
        exact = reference.decode(c)[0]
        alone = decode_in_chunks(fast, c, [h, r, 3] if h else [r, 3])[0].float()
        for got, span in ((ragged[row], slice(h * 1920, (h + r) * 1920)), (last[row], slice((h + r) * 1920, None))):
            assert relative_l2(got.float(), exact[span]) < 1.5 * relative_l2(alone[span], exact[span]) + 1e-3
