"""`CodecGraphs` bookkeeping: shapes planned from captured sizes, padding through a scratch slot, buffer reuse.

On a CPU the runner executes the same static buffers and plan without graphs (mode "eager"), so everything but
the capture itself is covered here; a GPU test checks replay against eager and incremental against full.
"""

from __future__ import annotations

import pytest
import torch

from engine.codec.config import codec_preset
from engine.codec.stream import CodecStateError, CodecStatePool, decode_incremental
from engine.codec.weights import random_codec
from engine.fast.codec_fast import FastCodecDecoder
from engine.fast.codec_graphs import RESERVED_SLOTS, CodecGraphs, Piece, plan_pieces
from tests.codec.helpers import random_codes, relative_l2


@pytest.fixture(scope="module", autouse=True)
def single_thread_torch():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny():
    return random_codec(codec_preset("tiny"), seed=11)


def test_plan_pads_each_row_group_to_the_next_captured_batch():
    assert plan_pieces(3, 4, [1, 2, 4, 8], [1, 2, 4]) == [Piece(0, 3, 0, 4, 4)]
    assert plan_pieces(8, 1, [1, 2, 4, 8], [1]) == [Piece(0, 8, 0, 1, 8)]


def test_plan_splits_oversize_cohorts_and_uncaptured_frame_counts():
    pieces = plan_pieces(70, 7, [1, 2, 4, 8, 16, 32, 64], [1, 2, 4, 8])
    assert [(p.row_start, p.row_stop, p.batch) for p in pieces[:2]] == [(0, 64, 64), (64, 70, 8)]
    assert [(p.frame_start, p.frame_stop) for p in pieces[::2]] == [(0, 4), (4, 6), (6, 7)]  # 7 = 4 + 2 + 1
    # every stream's frame parts run in order, and every (row, frame) is covered exactly once
    covered = sorted((r, f) for p in pieces for r in range(p.row_start, p.row_stop)
                     for f in range(p.frame_start, p.frame_stop))  # fmt: skip
    assert covered == [(r, f) for r in range(70) for f in range(7)]
    assert all(p.rows <= p.batch for p in pieces)


def test_plan_needs_size_one_in_both_axes():
    with pytest.raises(ValueError, match="include 1"):
        plan_pieces(2, 2, [2, 4], [1, 2])
    with pytest.raises(ValueError, match="include 1"):
        plan_pieces(2, 2, [1, 2], [2, 4])
    with pytest.raises(ValueError, match="at least one"):
        plan_pieces(0, 2, [1], [1])


def _runner(decoder, streams: int, batch_sizes=(1, 2, 4), frame_sizes=(1, 2, 4), ragged=False, fast=True,
            channels_last=False):  # fmt: skip
    step = FastCodecDecoder(decoder, "fp32", channels_last=channels_last) if fast else decoder
    pool = CodecStatePool(decoder.config, streams + RESERVED_SLOTS, "cpu", decoder.dtype)
    graphs = CodecGraphs(step, pool, batch_sizes, frame_sizes, ragged=ragged)
    return graphs, pool, [pool.alloc() for _ in range(streams)]


@pytest.mark.parametrize(("fast", "channels_last"), [(True, False), (True, True), (False, False)],
                         ids=["fast", "fast-channels-last", "plain"])  # fmt: skip
def test_a_ragged_runner_advances_each_row_by_its_own_frames_across_split_pieces(tiny, fast, channels_last):
    """5 rows (split 4 + 1 and padded), 3 frames per call (2 + 1 captured parts: a row with one real frame
    has none in the second part), real frames 1..3 per row: same audio and state as the plain ragged decode."""
    graphs, pool, slots = _runner(tiny, 5, ragged=True, fast=fast, channels_last=channels_last)
    plain_pool = CodecStatePool(tiny.config, 5, "cpu", tiny.dtype)
    plain_slots = [plain_pool.alloc() for _ in range(5)]
    codes = random_codes(5, 30, seed=4)
    done = [0] * 5
    for real in ([1, 3, 2, 3, 1], [3, 3, 3, 3, 3], [2, 1, 1, 3, 2]):
        chunk = torch.stack([codes[r, :, done[r] : done[r] + 3] for r in range(5)])
        ours = graphs.decode(slots, chunk, expected_positions=done, frames=real)
        theirs = decode_incremental(tiny, plain_pool, plain_slots, chunk, frames=real)
        for r, f in enumerate(real):
            assert relative_l2(ours[r, : f * 1920], theirs[r, : f * 1920]) < 1e-5
            done[r] += f
    assert [pool.position(s) for s in slots] == done
    assert torch.equal(pool.positions[slots], plain_pool.positions[plain_slots])
    for name, tensor in plain_pool.tensors.items():
        assert relative_l2(pool.tensors[name][slots], tensor[plain_slots]) < 1e-5, name


def test_a_whole_batch_runner_refuses_ragged_calls(tiny):
    graphs, pool, slots = _runner(tiny, 1)
    with pytest.raises(ValueError, match="ragged"):
        graphs.decode(slots, random_codes(1, 2, seed=1), frames=[1])
    assert pool.position(slots[0]) == 0


def test_runner_equals_plain_decode_with_padding_and_splitting(tiny):
    """5 streams over batch sizes up to 4 (split + padded), uncaptured frame counts (3 = 2 + 1, 7 = 4 + 2 + 1),
    and calls over subsets of the streams (which leaves them at different positions)."""
    graphs, pool, slots = _runner(tiny, 5)
    plain_pool = CodecStatePool(tiny.config, 5, "cpu", tiny.dtype)
    plain_slots = [plain_pool.alloc() for _ in range(5)]
    codes = random_codes(5, 40, seed=3)
    done = [0] * 5
    for frames, rows in [(1, [0, 1, 2, 3, 4]), (3, [0, 1, 2, 3, 4]), (7, [0, 2, 4]), (2, [1, 3]),
                         (5, [1, 3]), (4, [0, 1, 2, 3, 4])]:  # fmt: skip
        chunk = torch.stack([codes[r, :, done[r] : done[r] + frames] for r in rows])
        ours = graphs.decode([slots[r] for r in rows], chunk, expected_positions=[done[r] for r in rows])
        theirs = decode_incremental(tiny, plain_pool, [plain_slots[r] for r in rows], chunk)
        assert ours.shape == theirs.shape == (len(rows), frames * 1920)
        assert relative_l2(ours, theirs) < 1e-5
        for r in rows:
            done[r] += frames
    assert [pool.position(s) for s in slots] == done == [15] * 5
    assert torch.equal(pool.positions[slots], plain_pool.positions[plain_slots])
    for name, tensor in plain_pool.tensors.items():
        assert relative_l2(pool.tensors[name][slots], tensor[plain_slots]) < 1e-5, name
    assert graphs.replays == 2 + 4 + 3 + 1 + 2 + 2  # pieces: 5 rows -> 4 + 1; 3 -> 2 + 1; 7 -> 4 + 2 + 1


def test_padding_and_stale_rows_never_touch_streams_outside_the_call(tiny):
    graphs, pool, slots = _runner(tiny, 4, batch_sizes=(1, 4), frame_sizes=(1, 2))
    graphs.decode(slots, random_codes(4, 2, seed=4))  # the (4, 2) step's index now holds all four slots
    bystander = slots[3]
    saved = {name: tensor[bystander].clone() for name, tensor in pool.tensors.items()}
    graphs.decode(slots[:3], random_codes(3, 2, seed=5))  # same step, padded: row 3 must go to scratch
    graphs.decode(slots[:2], random_codes(2, 1, seed=6))
    assert all(torch.equal(pool.tensors[name][bystander], saved[name]) for name in saved)
    assert pool.position(bystander) == 2 and int(pool.positions[bystander]) == 2
    assert [pool.position(s) for s in slots[:3]] == [5, 5, 4]
    assert [int(pool.positions[s]) for s in slots[:3]] == [5, 5, 4]


def test_scratch_slot_is_reserved(tiny):
    graphs, pool, slots = _runner(tiny, 2)
    assert graphs.scratch not in slots and pool.is_allocated(graphs.scratch)
    with pytest.raises(CodecStateError, match="scratch"):
        graphs.decode([graphs.scratch], random_codes(1, 1, seed=1))
    full_pool = CodecStatePool(tiny.config, 1, "cpu", tiny.dtype)
    full_pool.alloc()
    with pytest.raises(CodecStateError, match="streams \\+ 1"):
        CodecGraphs(FastCodecDecoder(tiny, "fp32"), full_pool, [1], [1])


def test_runner_validates_before_any_state_changes(tiny):
    graphs, pool, slots = _runner(tiny, 2)
    before = {name: tensor.clone() for name, tensor in pool.tensors.items()}
    with pytest.raises(CodecStateError, match="expects 7"):
        graphs.decode(slots, random_codes(2, 1, seed=1), expected_positions=[0, 7])
    with pytest.raises(ValueError, match="rows"):
        graphs.decode(slots, random_codes(1, 1, seed=1))
    with pytest.raises(ValueError, match="at least one new frame"):
        graphs.decode(slots, torch.zeros(2, 16, 0, dtype=torch.int64))
    assert all(torch.equal(pool.tensors[n], before[n]) for n in before) and graphs.replays == 0
    with pytest.raises(ValueError, match="CUDA"):
        CodecGraphs(graphs.decoder, pool, [1], [1], mode="graph")


def test_plain_decoder_runs_on_the_same_runner(tiny):
    """Graphs of the plain decoder (no fused kernels) use the same bookkeeping."""
    pool = CodecStatePool(tiny.config, 1 + RESERVED_SLOTS, "cpu", tiny.dtype)
    graphs = CodecGraphs(tiny, pool, [1], [1, 4])
    slot = pool.alloc()
    codes = random_codes(1, 9, seed=2)
    wav = torch.cat([graphs.decode([slot], codes[..., :4]), graphs.decode([slot], codes[..., 4:])], dim=-1)
    assert relative_l2(wav, tiny.decode(codes)) < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_replay_equals_eager_and_incremental_equals_full_on_cuda():
    decoder = random_codec(codec_preset("full"), device="cuda", dtype=torch.float32, seed=1)
    fast = FastCodecDecoder(decoder, "fp32")
    pool = CodecStatePool(decoder.config, 2 + RESERVED_SLOTS, "cuda", decoder.dtype)
    graphs = CodecGraphs(fast, pool, [1, 2], [1, 2, 4])
    graphs.capture()
    slots = [pool.alloc() for _ in range(2)]
    codes = torch.randint(0, 2048, (2, 16, 20), device="cuda")
    pieces = [graphs.decode(slots, codes[..., a:b]) for a, b in ((0, 1), (1, 3), (3, 7), (7, 10), (10, 20))]
    reference = CodecStatePool(decoder.config, 2, "cuda", decoder.dtype)
    whole = fast.decode_incremental(reference, [reference.alloc(), reference.alloc()], codes)
    assert relative_l2(torch.cat(pieces, dim=-1), whole) < 1e-5


def test_the_fused_codec_kernels_setting_gives_the_codec_runners_the_one_kernel_state_write_back():
    from engine.settings import parse_args

    assert parse_args(["--model", "tiny", "--socket", "@x"]).codec_kernels == "fused"
    assert parse_args(["--model", "tiny", "--socket", "@x", "--codec-kernels", "ops"]).codec_kernels == "ops"
    assert parse_args(["--model", "tiny", "--socket", "@x"]).codec_layout == "channels-last"
    assert parse_args(["--model", "tiny", "--socket", "@x", "--codec-layout", "ncl"]).codec_layout == "ncl"
    decoder = random_codec(codec_preset("tiny"), seed=5)
    pool = CodecStatePool(decoder.config, 2 + RESERVED_SLOTS, "cpu", decoder.dtype)
    graphs = CodecGraphs(FastCodecDecoder(decoder, "fp32"), pool, [1, 2], [1], state_kernel=True)
    graphs.capture()
    assert graphs.captured and all(step.scatter.fused for step in graphs._steps.values())
