"""The state pool's accounting, and decodes that would need state they do not have failing loudly."""

from __future__ import annotations

import pytest
import torch

from engine.codec.config import codec_preset
from engine.codec.state_layout import codec_state_layout, state_bytes
from engine.codec.stream import CodecStateError, CodecStatePool, decode_incremental
from tests.codec.helpers import decode_in_chunks, random_codes, relative_l2


def reallocate(pool: CodecStatePool, slot: int) -> None:
    """Allocate until `slot` is handed out again (freed slots are reused oldest-first)."""
    while pool.alloc() != slot:
        pass


@pytest.fixture
def pool(tiny):
    return CodecStatePool(tiny.config, 3, "cpu", torch.float32)


def test_pool_hands_out_each_slot_once_and_reports_exhaustion(pool):
    slots = [pool.alloc() for _ in range(3)]
    assert sorted(slots) == [0, 1, 2]
    assert (pool.used_slots, pool.free_slots) == (3, 0)
    with pytest.raises(CodecStateError, match="exhausted"):
        pool.alloc()
    pool.free(slots[1])
    assert (pool.used_slots, pool.free_slots) == (2, 1)
    assert pool.alloc() == slots[1]


def test_freeing_a_slot_twice_or_an_unknown_slot_fails(pool):
    slot = pool.alloc()
    pool.free(slot)
    with pytest.raises(CodecStateError, match="not allocated"):
        pool.free(slot)
    with pytest.raises(CodecStateError, match="does not exist"):
        pool.free(7)


def test_bytes_per_slot_match_the_state_layout_for_fp32_and_bf16():
    for name in ("tiny", "full"):
        config = codec_preset(name)
        for dtype, width in ((torch.float32, 4), (torch.bfloat16, 2)):
            pool = CodecStatePool(config, 1, "meta", dtype)
            assert pool.bytes_per_slot == state_bytes(config, width)
            assert set(pool.tensors) == set(codec_state_layout(config))
    full = CodecStatePool(codec_preset("full"), 1, "meta", torch.float32)
    assert full.bytes_per_slot == 5_218_952  # the figure in docs/codec.md


def test_decoding_a_slot_that_was_never_allocated_fails(tiny, pool):
    with pytest.raises(CodecStateError, match="not allocated"):
        decode_incremental(tiny, pool, [0], random_codes(1, 2, seed=1))


def test_decoding_a_freed_slot_fails_and_changes_nothing(tiny, pool):
    keep, gone = pool.alloc(), pool.alloc()
    decode_incremental(tiny, pool, [keep, gone], random_codes(2, 3, seed=1))
    pool.free(gone)
    with pytest.raises(CodecStateError, match=f"slot {gone} is not allocated"):
        decode_incremental(tiny, pool, [keep, gone], random_codes(2, 3, seed=2))
    assert pool.position(keep) == 3  # the failed batch left the good stream untouched


def test_decoding_with_a_position_the_slot_does_not_have_fails(tiny, pool):
    slot = pool.alloc()
    decode_incremental(tiny, pool, [slot], random_codes(1, 4, seed=1), expected_positions=[0])
    with pytest.raises(CodecStateError, match="has decoded 4 frames but the caller expects 5"):
        decode_incremental(tiny, pool, [slot], random_codes(1, 1, seed=2), expected_positions=[5])
    # A slot freed and handed to another request starts again at 0: the old owner's position check catches it.
    pool.free(slot)
    reallocate(pool, slot)
    with pytest.raises(CodecStateError, match="has decoded 0 frames but the caller expects 4"):
        decode_incremental(tiny, pool, [slot], random_codes(1, 1, seed=3), expected_positions=[4])


def test_a_slot_twice_in_one_batch_fails(tiny, pool):
    slot = pool.alloc()
    with pytest.raises(CodecStateError, match="twice"):
        decode_incremental(tiny, pool, [slot, slot], random_codes(2, 1, seed=1))


def test_bad_codes_fail_before_any_state_changes(tiny, pool):
    slot = pool.alloc()
    bad_value = random_codes(1, 2, seed=1)
    bad_value[0, 3, 1] = 2048
    with pytest.raises(ValueError, match=r"\[0, 2048\)"):
        decode_incremental(tiny, pool, [slot], bad_value)
    with pytest.raises(ValueError, match="shape"):
        decode_incremental(tiny, pool, [slot], random_codes(1, 2, seed=1)[:, :8])
    with pytest.raises(ValueError, match="rows"):
        decode_incremental(tiny, pool, [slot], random_codes(2, 2, seed=1))
    with pytest.raises(ValueError, match="at least one"):
        decode_incremental(tiny, pool, [slot], random_codes(1, 0, seed=1))
    assert pool.position(slot) == 0


def test_a_pool_of_another_dtype_or_config_is_refused(tiny, hybrid):
    with pytest.raises(CodecStateError, match="bfloat16"):
        decode_incremental(
            tiny, CodecStatePool(tiny.config, 1, "cpu", torch.bfloat16), [0], random_codes(1, 1, 1)
        )
    with pytest.raises(CodecStateError, match="different codec config"):
        decode_incremental(
            hybrid, CodecStatePool(tiny.config, 1, "cpu", torch.float32), [0], random_codes(1, 1, 1)
        )


def test_a_reallocated_slot_starts_from_empty_state(tiny, pool):
    """A slot reused after another stream decodes exactly like a fresh pool (its old state was cleared)."""
    slot = pool.alloc()
    decode_incremental(tiny, pool, [slot], random_codes(1, 30, seed=1))
    pool.free(slot)
    reallocate(pool, slot)
    codes = random_codes(1, 10, seed=2)
    reused = torch.cat(
        [
            decode_incremental(tiny, pool, [slot], codes[..., :4]),
            decode_incremental(tiny, pool, [slot], codes[..., 4:]),
        ],
        dim=-1,
    )
    assert relative_l2(reused, decode_in_chunks(tiny, codes, [4, 6])) == 0.0


def test_a_reserved_slot_leaves_the_stream_accounting_and_cannot_be_decoded_or_freed(tiny):
    pool = CodecStatePool(tiny.config, 3, "cpu", torch.float32)
    scratch = pool.reserve()
    assert pool.is_allocated(scratch) and (pool.rows, pool.slots, pool.free_slots, pool.used_slots) == (3, 2, 2, 0)
    assert pool.total_bytes == 3 * pool.bytes_per_slot  # the reserved row still takes memory
    assert scratch not in {pool.alloc(), pool.alloc()}
    with pytest.raises(CodecStateError, match="exhausted"):
        pool.alloc()
    for refused in (lambda: pool.free(scratch), lambda: decode_incremental(tiny, pool, [scratch], random_codes(1, 1, 1)),
                    lambda: pool.advance([scratch], 1)):  # fmt: skip
        with pytest.raises(CodecStateError, match="reserved as a scratch row"):
            refused()


def test_advance_moves_only_the_host_positions_and_clone_copies_everything(tiny):
    pool = CodecStatePool(tiny.config, 3, "cpu", torch.float32)
    scratch, a, b = pool.reserve(), pool.alloc(), pool.alloc()
    decode_incremental(tiny, pool, [a], random_codes(1, 3, seed=2))
    pool.advance([a, b], 2)  # as a runner whose captured step already wrote state and device positions
    assert (pool.position(a), pool.position(b)) == (5, 2)
    assert pool.positions.tolist()[a] == 3  # the device copy is the step's business
    with pytest.raises(ValueError, match="at least one frame"):
        pool.advance([a], 0)
    copy = pool.clone()
    assert (copy.slots, copy.free_slots, copy.position(a), copy.position(b)) == (2, 0, 5, 2)
    assert all(torch.equal(copy.tensors[n], t) for n, t in pool.tensors.items())
    with pytest.raises(CodecStateError, match="reserved"):
        copy.free(scratch)
    copy.free(a)  # independent of the original
    assert pool.is_allocated(a) and not copy.is_allocated(a)
