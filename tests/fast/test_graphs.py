"""Graph bookkeeping without a GPU: padding to captured sizes, splitting oversize cohorts, static buffers
reused across steps, and steps run at padded shapes (eagerly off the GPU, never for an uncaptured key)."""

from __future__ import annotations

import pytest
import torch

from engine.fast.graphs import CapturedSteps, StaticInputs, check_sizes, pad_rows, padded_size, split_cohort

SIZES = (1, 2, 4, 8, 16)


@pytest.mark.parametrize(("rows", "size"), [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (16, 16)])
def test_rows_pad_to_the_smallest_captured_size_that_holds_them(rows: int, size: int) -> None:
    assert padded_size(rows, SIZES) == size


def test_more_rows_than_the_largest_size_are_refused_by_padding() -> None:
    with pytest.raises(ValueError, match="split the cohort"):
        padded_size(17, SIZES)


def test_oversize_cohorts_split_into_pieces_of_at_most_the_largest_size_covering_every_row_once() -> None:
    parts = split_cohort(37, SIZES)
    assert [len(p) for p in parts] == [16, 16, 5]
    assert [i for p in parts for i in p] == list(range(37))
    assert split_cohort(3, SIZES) == [range(0, 3)]
    with pytest.raises(ValueError):
        split_cohort(0, SIZES)


def test_padding_repeats_the_last_row_so_padded_rows_write_what_it_writes() -> None:
    assert pad_rows([7, 3, 9], 4) == [7, 3, 9, 9]
    assert pad_rows([5], 1) == [5]
    with pytest.raises(ValueError):
        pad_rows([1, 2, 3], 2)
    with pytest.raises(ValueError):
        pad_rows([], 2)


def test_capture_sizes_are_sorted_unique_and_positive() -> None:
    assert check_sizes([4, 1, 2, 4]) == (1, 2, 4)
    with pytest.raises(ValueError):
        check_sizes([0, 2])
    with pytest.raises(ValueError):
        check_sizes([])


def test_static_inputs_reuse_one_device_buffer_and_check_their_fields() -> None:
    inputs = StaticInputs(("slot", "frame"), 8, torch.device("cpu"))
    storage = inputs.table.data_ptr()
    inputs.load(3, slot=[4, 5, 6], frame=[0, 1, 2])
    assert inputs["slot"][:3].tolist() == [4, 5, 6] and inputs["frame"][:3].tolist() == [0, 1, 2]
    inputs.load(2, slot=[9, 8], frame=[7, 7])
    assert inputs["slot"][:2].tolist() == [9, 8]
    assert inputs.table.data_ptr() == storage  # a captured graph keeps reading the same memory
    with pytest.raises(ValueError, match="fields"):
        inputs.load(1, slot=[1])
    with pytest.raises(ValueError, match="exceed"):
        inputs.load(9, slot=[0] * 9, frame=[0] * 9)
    with pytest.raises(ValueError, match="expected 2"):
        inputs.load(2, slot=[1], frame=[1, 2])


def test_steps_run_eagerly_at_the_padded_key_when_graphs_are_off() -> None:
    seen: list[int] = []
    steps = CapturedSteps("test", seen.append, SIZES, use_graphs=False)
    steps.capture()  # nothing to capture off the GPU
    assert steps.captured
    steps.replay(4)
    steps.replay(16)
    assert seen == [4, 16] and steps.eager_runs == 2 and steps.replays == 0


def test_replaying_a_key_that_was_never_captured_is_an_error_not_an_eager_run() -> None:
    seen: list[int] = []
    steps = CapturedSteps("test", seen.append, SIZES, use_graphs=True)
    assert not steps.captured
    with pytest.raises(RuntimeError, match="no graph captured"):
        steps.replay(4)
    assert seen == []
