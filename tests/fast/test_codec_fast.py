"""`FastCodecDecoder` is the plain incremental decoder, faster: same audio, same state, any mix of the two.

CPU, fp32 (bf16 parity is a GPU-check item: on a CPU the plain convs fuse their bias, the fast path's kernels
round where cuDNN + PyTorch round).
"""

from __future__ import annotations

import pytest
import torch

from engine.codec.config import codec_preset
from engine.codec.stream import CodecStateError, CodecStatePool, decode_incremental
from engine.codec.weights import random_codec
from engine.fast.codec_fast import FastCodecDecoder, precision_flags
from tests.codec.helpers import chunks_of, random_codes, relative_l2

TOLERANCE = 1e-5  # fp32 relative L2 (issue 10)


@pytest.fixture(scope="module", autouse=True)
def single_thread_torch():
    """Many tiny ops: on a busy 2-core CI machine OpenMP contention makes each ~20x slower (tests/codec)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny():
    return random_codec(codec_preset("tiny"), seed=11)


@pytest.fixture(scope="module")
def tiny64():
    return random_codec(codec_preset("tiny"), dtype=torch.float64, seed=11)


@pytest.fixture(scope="module")
def full():
    return random_codec(codec_preset("full"), seed=5)


def _stream(decode, pool: CodecStatePool, slots: list[int], codes: torch.Tensor, schedule: list[int]):
    pieces, start = [], 0
    for size in chunks_of(codes.shape[-1], schedule):
        pieces.append(decode(pool, slots, codes[..., start : start + size]))
        start += size
    return torch.cat(pieces, dim=-1)


@pytest.mark.parametrize("channels_last", [False, True])
def test_fast_step_equals_plain_step_for_streams_at_their_own_positions(tiny, channels_last):
    fast = FastCodecDecoder(tiny, "fp32", channels_last=channels_last)
    plain_pool = CodecStatePool(tiny.config, 4, "cpu", tiny.dtype)
    fast_pool = CodecStatePool(tiny.config, 4, "cpu", tiny.dtype)
    slots = [plain_pool.alloc() for _ in range(4)]
    assert slots == [fast_pool.alloc() for _ in range(4)]
    for slot, history in zip(slots, [1, 30, 71, 90], strict=True):  # before, at and past the 72-frame window
        codes = random_codes(1, history, seed=history)
        decode_incremental(tiny, plain_pool, [slot], codes)
        decode_incremental(tiny, fast_pool, [slot], codes)
    codes = random_codes(4, 5, seed=99)
    expected = decode_incremental(tiny, plain_pool, slots, codes)
    actual = fast.decode_incremental(fast_pool, slots, codes, expected_positions=[1, 30, 71, 90])
    assert actual.shape == expected.shape and actual.dtype == torch.float32
    assert relative_l2(actual, expected) < TOLERANCE
    for name, tensor in plain_pool.tensors.items():
        assert relative_l2(fast_pool.tensors[name], tensor) < TOLERANCE, name
    assert torch.equal(fast_pool.positions, plain_pool.positions)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("schedule", [[1, 2, 4, 8, 12], [3], [71, 1, 5]])
def test_fast_incremental_decode_equals_full_decode(tiny, schedule, channels_last):
    fast = FastCodecDecoder(tiny, "fp32", channels_last=channels_last)
    codes = random_codes(2, 100, seed=7)
    pool = CodecStatePool(tiny.config, 2, "cpu", tiny.dtype)
    streamed = _stream(fast.decode_incremental, pool, [pool.alloc(), pool.alloc()], codes, schedule)
    assert relative_l2(streamed, tiny.decode(codes)) < TOLERANCE


@pytest.mark.parametrize("channels_last", [False, True])
def test_fast_incremental_decode_is_exact_in_float64(tiny64, channels_last):
    fast = FastCodecDecoder(tiny64, "fp32", channels_last=channels_last)
    codes = random_codes(1, 80, seed=8)
    pool = CodecStatePool(tiny64.config, 1, "cpu", tiny64.dtype)
    streamed = _stream(fast.decode_incremental, pool, [pool.alloc()], codes, [1, 2, 4, 8, 12])
    assert relative_l2(streamed, tiny64.decode(codes)) < 1e-12


@pytest.mark.parametrize("channels_last", [False, True])
def test_fast_and_plain_steps_continue_each_others_state(tiny, channels_last):
    """One state layout: a stream may switch between the paths chunk by chunk (e.g. an uncaptured fallback)."""
    fast = FastCodecDecoder(tiny, "fp32", channels_last=channels_last)
    codes = random_codes(1, 40, seed=9)
    pool = CodecStatePool(tiny.config, 1, "cpu", tiny.dtype)
    slot = pool.alloc()
    pieces = [
        decode_incremental(tiny, pool, [slot], codes[..., :5]),
        fast.decode_incremental(pool, [slot], codes[..., 5:17]),
        decode_incremental(tiny, pool, [slot], codes[..., 17:30]),
        fast.decode_incremental(pool, [slot], codes[..., 30:]),
    ]
    assert relative_l2(torch.cat(pieces, dim=-1), tiny.decode(codes)) < TOLERANCE


@pytest.mark.parametrize("channels_last", [False, True])
def test_fast_step_at_full_width_equals_plain_step(full, channels_last):
    """The released widths (1536 -> 96 channels, 16 x 64 attention), a few frames on the CPU."""
    fast = FastCodecDecoder(full, "fp32", channels_last=channels_last)
    codes = random_codes(1, 4, seed=10)
    plain_pool, fast_pool = (CodecStatePool(full.config, 1, "cpu", full.dtype) for _ in range(2))
    slot = plain_pool.alloc()
    fast_pool.alloc()
    expected = [decode_incremental(full, plain_pool, [slot], codes[..., i : i + 2]) for i in (0, 2)]
    actual = [fast.decode_incremental(fast_pool, [slot], codes[..., i : i + 2]) for i in (0, 2)]
    assert relative_l2(torch.cat(actual, -1), torch.cat(expected, -1)) < TOLERANCE


def test_fast_step_leaves_its_input_state_untouched(tiny):
    fast = FastCodecDecoder(tiny, "fp32")
    pool = CodecStatePool(tiny.config, 1, "cpu", tiny.dtype)
    slot = pool.alloc()
    fast.decode_incremental(pool, [slot], random_codes(1, 9, seed=11))
    positions, state = pool.gather(torch.tensor([slot]))
    before = {k: v.clone() for k, v in state.items()}
    fast.forward_stream(random_codes(1, 3, seed=12), positions, state)
    assert all(torch.equal(state[k], before[k]) for k in before)


def test_precision_must_match_the_decoder_dtype(tiny):
    with pytest.raises(ValueError, match="bf16"):
        FastCodecDecoder(tiny, "bf16")
    with pytest.raises(ValueError, match="unknown codec precision"):
        FastCodecDecoder(tiny, "fp8")
    bf16 = random_codec(codec_preset("tiny"), dtype=torch.bfloat16, seed=3)
    with pytest.raises(ValueError, match="tf32"):
        FastCodecDecoder(bf16, "tf32")
    assert FastCodecDecoder(bf16).precision == "bf16"


def test_precision_flags_switch_tf32_and_restore_it():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with precision_flags("tf32"):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    with precision_flags("fp32"):
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_fast_decode_validates_like_the_plain_one(tiny):
    fast = FastCodecDecoder(tiny, "fp32")
    pool = CodecStatePool(tiny.config, 2, "cpu", tiny.dtype)
    slot = pool.alloc()
    with pytest.raises(CodecStateError, match="not allocated"):
        fast.decode_incremental(pool, [1], random_codes(1, 1, seed=1))
    with pytest.raises(CodecStateError, match="expects 3"):
        fast.decode_incremental(pool, [slot], random_codes(1, 1, seed=1), expected_positions=[3])
    with pytest.raises(ValueError, match="codes must lie"):
        fast.decode_incremental(pool, [slot], torch.full((1, 16, 1), 4096))
    other = CodecStatePool(tiny.config, 1, "cpu", torch.float64)
    with pytest.raises(CodecStateError, match="dtype"):
        fast.decode_incremental(other, [other.alloc()], random_codes(1, 1, seed=1))
    assert pool.position(slot) == 0
