"""The GPU check's cost table keeps what it did not measure: the codec rows come from the repository's table."""

from __future__ import annotations

import json

from engine.scheduling import CostModel
from engine.scheduling.costmodel import REFERENCE_FAST_COSTS as FAST_COSTS
from loadtest.gpu_check import BATCHES, cost_table


def _timings() -> dict:
    return {
        "talker_decode": {b: {"ms": 1.0 + b / 100} for b in BATCHES},
        "code_predict": {b: {"ms": 2.0 + b / 100} for b in BATCHES},
        "talker_prefill": {f"1x{t}": {"tokens": t, "ms": 1.0 + t / 1000} for t in (16, 64, 256)},
    }


def test_a_check_without_the_codec_keeps_every_codec_row_of_the_repository_table():
    current = json.loads(FAST_COSTS.read_text(encoding="utf-8"))
    table = cost_table(_timings(), None, "abc1234")
    assert table["codec_chunk"] == current["codec_chunk"]
    assert table["codec_chunk_tf32"] == current["codec_chunk_tf32"]
    assert table["sources"]["codec_chunk_tf32"] == current["sources"]["codec_chunk_tf32"]
    assert table["talker_decode"]["ms"][0] == round(1.0 + BATCHES[0] / 100, 4)
    CostModel(table, "tf32")  # a well-formed table in both precisions
    CostModel(table, "bf16")


def test_a_measured_codec_replaces_the_default_row_only():
    current = json.loads(FAST_COSTS.read_text(encoding="utf-8"))
    measured = {"batch": [1, 8], "frames": [1, 4], "ms": [[0.5, 0.6], [0.7, 0.9]]}
    table = cost_table(_timings(), {"codec_chunk": measured}, "abc1234")
    assert table["codec_chunk"] == measured and "abc1234" in table["sources"]["codec_chunk"]
    assert table["codec_chunk_tf32"] == current["codec_chunk_tf32"]


def test_a_table_measured_on_another_card_is_named_for_it_and_says_whose_codec_rows_it_carries():
    table = cost_table(_timings(), None, "abc1234", gpu="NVIDIA A100-SXM4-80GB")
    assert table["name"] == "a100_fast" and "NVIDIA A100-SXM4-80GB" in table["description"]
    current = json.loads(FAST_COSTS.read_text(encoding="utf-8"))
    assert table["codec_chunk"] == current["codec_chunk"]  # no A100 table in the repository: the H200's rows
    assert all("carried from h200_fast.json" in table["sources"][k] for k in ("codec_chunk", "codec_chunk_tf32"))
    measured = {"batch": [1, 8], "frames": [1, 4], "ms": [[0.5, 0.6], [0.7, 0.9]]}
    table = cost_table(_timings(), {"codec_chunk": measured}, "abc1234", gpu="NVIDIA A100-SXM4-80GB")
    assert "carried" not in table["sources"]["codec_chunk"] and "carried" in table["sources"]["codec_chunk_tf32"]
    CostModel(table, "bf16")
