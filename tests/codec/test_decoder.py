"""CodecDecoder's whole-sequence decodes: shape, range, causality, and the official 300/25 chunking."""

from __future__ import annotations

import pytest
import torch

from tests.codec.helpers import random_codes, relative_l2


def test_decode_gives_1920_samples_per_frame_in_range(tiny):
    wav = tiny.decode(random_codes(2, 7, seed=1))
    assert wav.shape == (2, 7 * 1920) and wav.dtype == torch.float32
    assert wav.abs().max() <= 1.0
    assert wav.std() > 0.01  # not a silent or dead network
    assert tiny.decode(random_codes(1, 0, seed=1)).shape == (1, 0)


def test_decode_is_causal_a_prefix_decodes_to_the_prefix_of_the_audio(tiny):
    codes = random_codes(1, 40, seed=2)
    whole = tiny.decode(codes)
    assert relative_l2(tiny.decode(codes[..., :25]), whole[..., : 25 * 1920]) < 1e-5
    changed = codes.clone()
    changed[..., 30:] = (changed[..., 30:] + 1) % 2048
    after = tiny.decode(changed)
    assert torch.equal(after[..., : 30 * 1920], whole[..., : 30 * 1920])  # the future never leaks back
    assert not torch.allclose(after[..., 30 * 1920 :], whole[..., 30 * 1920 :])


def test_every_code_column_and_the_distant_past_shape_the_audio(tiny):
    codes = random_codes(1, 80, seed=3)
    whole = tiny.decode(codes)
    for column in (0, 1, 15):  # semantic codebook, first and last acoustic codebooks
        changed = codes.clone()
        changed[0, column, 40] = (changed[0, column, 40] + 7) % 2048
        assert relative_l2(tiny.decode(changed)[..., 40 * 1920 :], whole[..., 40 * 1920 :]) > 1e-3
    # Frame 10 reaches frame 79 only through the transformer (8 x 71-frame windows; the convs see ~10 frames).
    changed = codes.clone()
    changed[0, :, 10] = (changed[0, :, 10] + 7) % 2048
    assert relative_l2(tiny.decode(changed)[..., 79 * 1920 :], whole[..., 79 * 1920 :]) > 1e-5


def test_official_chunked_decode_equals_full_decode_up_to_300_frames_and_departs_after(tiny):
    codes = random_codes(1, 330, seed=4)
    full = tiny.decode(codes)
    official = tiny.decode_official(codes)
    assert official.shape == full.shape
    assert (
        relative_l2(official[..., : 300 * 1920], full[..., : 300 * 1920]) < 1e-5
    )  # 300 vs 330 frames: kernel shapes differ
    # Frames 300.. were decoded from scratch with only 25 frames of context: audibly not the full decode.
    assert relative_l2(official[..., 300 * 1920 :], full[..., 300 * 1920 :]) > 1e-4
    # ... but exactly a fresh decode of frames 275..329 with the first 25 frames' audio dropped.
    assert torch.equal(official[..., 300 * 1920 :], tiny.decode(codes[..., 275:])[..., 25 * 1920 :])
    short = random_codes(2, 17, seed=5)
    assert torch.equal(tiny.decode_official(short), tiny.decode(short))


@pytest.mark.parametrize(
    ("codes", "message"),
    [
        (torch.zeros(1, 16, 3), "integer"),
        (torch.zeros(1, 15, 3, dtype=torch.int64), "shape"),
        (torch.zeros(16, 3, dtype=torch.int64), "shape"),
        (torch.full((1, 16, 3), -1, dtype=torch.int64), "strip EOS"),
        (torch.full((1, 16, 3), 2150, dtype=torch.int64), "strip EOS"),
    ],
)
def test_bad_codes_are_rejected_with_a_clear_error(tiny, codes, message):
    with pytest.raises(ValueError, match=message):
        tiny.decode(codes)
    with pytest.raises(ValueError, match=message):
        tiny.decode_official(codes)
