"""The talker's projected text rows: each id projected once, its row P(id), a full table starting over."""

from __future__ import annotations

import pytest
import torch

from engine.fast.text_rows import ProjectedText
from engine.model.qwen3_tts import Qwen3TTS
from engine.model.weights import load_model


@pytest.fixture(scope="module")
def model() -> Qwen3TTS:
    return load_model("tiny")


def _table(model: Qwen3TTS, capacity: int, max_step_rows: int = 4) -> ProjectedText:
    return ProjectedText(model.talker.embed_text, model.config.talker.hidden_size, capacity=capacity,
                         max_step_rows=max_step_rows, dtype=model.dtype, device=model.device)  # fmt: skip


def _projected(model: Qwen3TTS, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model.talker.embed_text(torch.tensor(ids))


def test_each_row_holds_its_ids_projection_and_an_id_is_projected_once(model: Qwen3TTS) -> None:
    table = _table(model, capacity=8)
    with torch.inference_mode():
        first = table.rows_for([5, 9, 5])
        second = table.rows_for([9, 7])
    assert first[0] == first[2] and second[0] == first[1]
    assert table.projected == 3 and table.refills == 0
    torch.testing.assert_close(table.rows[first + second], _projected(model, [5, 9, 5, 9, 7]), rtol=1e-5, atol=1e-6)


def test_a_full_table_starts_over_with_the_asking_steps_ids(model: Qwen3TTS) -> None:
    table = _table(model, capacity=4)
    with torch.inference_mode():
        table.rows_for([1, 2, 3])
        rows = table.rows_for([3, 4, 6])  # 2 new ids do not fit beside 3 held ones
    assert table.refills == 1 and table.projected == 6
    assert sorted(rows) == [0, 1, 2]
    torch.testing.assert_close(table.rows[rows], _projected(model, [3, 4, 6]), rtol=1e-5, atol=1e-6)


def test_a_table_that_cannot_hold_one_step_is_refused(model: Qwen3TTS) -> None:
    with pytest.raises(ValueError, match="cannot hold one step"):
        _table(model, capacity=2, max_step_rows=4)
