"""A ragged codec batch (each row decodes its own number of real frames, padded to the longest) leaves every
stream exactly where decoding only its real frames would have: same audio, same state, same position."""

from __future__ import annotations

import pytest
import torch

from engine.codec.stream import CodecStatePool, decode_incremental
from engine.fast.codec_fast import FastCodecDecoder
from tests.codec.helpers import random_codes, relative_l2


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


def test_the_fast_codec_refuses_ragged_batches_rather_than_decoding_them_whole(tiny):
    fast = FastCodecDecoder(tiny, precision="fp32")
    pool = CodecStatePool(tiny.config, 1, "cpu", fast.dtype)
    positions, state = pool.gather(torch.tensor([pool.alloc()]))
    with pytest.raises(ValueError, match="ragged"):
        fast.forward_stream(random_codes(1, 2, seed=1), positions, state, frames=torch.tensor([1]))
