"""The cost model interpolates the measured table and refuses malformed ones."""

from __future__ import annotations

import json

import pytest

from engine.request import WorkKind
from engine.scheduling import COSTS_DIR, DEFAULT_COSTS, CostModel, fast_costs_for, gpu_family
from engine.scheduling.costmodel import interpolate


def test_costs_equal_the_measured_points_and_lie_between_them():
    costs = CostModel.load()
    overhead = costs.step_overhead_ms
    assert costs.ms(WorkKind.TALKER_DECODE, 64) == pytest.approx(3.535 + overhead)
    assert costs.ms(WorkKind.CODE_PREDICT, 1) == pytest.approx(6.715 + overhead)
    assert costs.ms(WorkKind.CODEC_CHUNK, 32, 12) == pytest.approx(22.05 + overhead)
    assert costs.ms(WorkKind.TALKER_PREFILL, 1, tokens=10) == pytest.approx(3.186 + overhead)
    between = costs.ms(WorkKind.TALKER_DECODE, 48)
    assert costs.ms(WorkKind.TALKER_DECODE, 32) < between < costs.ms(WorkKind.TALKER_DECODE, 64)
    codec = costs.ms(WorkKind.CODEC_CHUNK, 16, 8)
    assert costs.ms(WorkKind.CODEC_CHUNK, 8, 4) < codec < costs.ms(WorkKind.CODEC_CHUNK, 32, 12)


def test_costs_keep_growing_past_the_largest_measured_shape():
    costs = CostModel.load()
    assert costs.ms(WorkKind.TALKER_DECODE, 256) > costs.ms(WorkKind.TALKER_DECODE, 128)
    assert costs.ms(WorkKind.CODEC_CHUNK, 128, 25) > costs.ms(WorkKind.CODEC_CHUNK, 64, 25)
    assert interpolate((1, 2), (10.0, 12.0), 4) == pytest.approx(16.0)
    assert interpolate((1, 2), (10.0, 12.0), 0.5) == pytest.approx(10.0)


def test_capacity_grows_with_batch():
    costs = CostModel.load()
    assert costs.frames_per_second(128, 64, 12) > costs.frames_per_second(8, 8, 4) > 0


@pytest.mark.parametrize("mutate, words", [
    (lambda t: t.pop("code_predict"), "code_predict"),
    (lambda t: t["talker_decode"].update(batch=[4, 1, 16, 32, 64, 128]), "increasing"),
    (lambda t: t["talker_decode"].update(ms=[1.0]), "equally long"),
    (lambda t: t["codec_chunk"]["ms"][0].__setitem__(0, -1.0), "positive"),
])
def test_malformed_tables_are_refused(mutate, words):
    table = json.loads(DEFAULT_COSTS.read_text())
    mutate(table)
    with pytest.raises(ValueError, match=words):
        CostModel(table)


def test_the_codec_row_follows_the_precision_the_engine_decodes_in():
    from engine.scheduling.costmodel import REFERENCE_FAST_COSTS as FAST_COSTS

    table = json.loads(FAST_COSTS.read_text(encoding="utf-8"))
    bf16, tf32 = CostModel(table, "bf16"), CostModel(table, "tf32")
    assert bf16.ms(WorkKind.CODEC_CHUNK, 8, 25) == pytest.approx(table["codec_chunk"]["ms"][1][-1] + bf16.step_overhead_ms)
    assert tf32.ms(WorkKind.CODEC_CHUNK, 8, 25) == pytest.approx(
        table["codec_chunk_tf32"]["ms"][1][-1] + tf32.step_overhead_ms
    )
    assert tf32.ms(WorkKind.CODEC_CHUNK, 32, 4) > bf16.ms(WorkKind.CODEC_CHUNK, 32, 4)  # H200: tf32 is slower
    # No row of its own (fp32, or no precision given): the table's own codec_chunk.
    assert CostModel(table, "fp32").ms(WorkKind.CODEC_CHUNK, 8, 25) == bf16.ms(WorkKind.CODEC_CHUNK, 8, 25)
    assert CostModel(table).ms(WorkKind.CODEC_CHUNK, 8, 25) == bf16.ms(WorkKind.CODEC_CHUNK, 8, 25)


@pytest.mark.parametrize("name, family", [
    ("NVIDIA H200", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA GeForce RTX 4090", None),
    ("", None),
])
def test_a_gpu_name_gives_the_card_family_its_cost_table_is_named_for(name, family):
    assert gpu_family(name) == family


def test_the_fast_path_predicts_from_the_table_measured_on_its_card_else_the_h200s():
    assert fast_costs_for("NVIDIA H200").name == "h200_fast.json"
    assert fast_costs_for("NVIDIA H100 80GB HBM3").name == "h100_fast.json"
    for card in ("NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090", ""):  # no table measured on these
        assert fast_costs_for(card).name == "h200_fast.json"
    for path in COSTS_DIR.glob("*_fast.json"):  # every shipped table loads, in both codec precisions
        table = json.loads(path.read_text(encoding="utf-8"))
        assert table["name"] == path.stem
        CostModel(table, "bf16"), CostModel(table, "tf32")
