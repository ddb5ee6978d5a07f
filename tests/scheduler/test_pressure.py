"""Admission's pressure: the share of recent planned time that went to rescues, by kind, forgetting old plans."""

from __future__ import annotations

import pytest

from engine.request import WorkKind
from engine.scheduling.pressure import RescuePressure


def test_pressure_is_the_share_of_planned_time_that_went_to_rescues_split_by_kind():
    pressure = RescuePressure()
    assert pressure.share == 0.0 and pressure.describe() == ""
    pressure.record(WorkKind.CODE_PREDICT, 3.0, rescue=True)
    pressure.record(WorkKind.CODEC_CHUNK, 1.0, rescue=True)
    pressure.record(WorkKind.TALKER_DECODE, 4.0, rescue=False)
    parts = pressure.share_by_kind()
    assert sum(parts.values()) == pytest.approx(pressure.share)
    assert parts[WorkKind.CODE_PREDICT] > parts[WorkKind.CODEC_CHUNK] > 0.0 == parts[WorkKind.TALKER_DECODE]
    assert 0.4 < pressure.share < 0.5  # 4 of 8 ms, the older plans weighing a little less
    assert pressure.describe().startswith("code_predict ") and ", codec_chunk " in pressure.describe()


def test_old_rescues_fade_as_plans_without_rescue_follow_and_reset_forgets_them():
    pressure = RescuePressure()
    for _ in range(20):
        pressure.record(WorkKind.CODE_PREDICT, 2.0, rescue=True)
    assert pressure.share == pytest.approx(1.0)
    for _ in range(200):
        pressure.record(WorkKind.CODE_PREDICT, 2.0, rescue=False)
    assert pressure.share < 0.02  # a few hundred plans later the rescues hardly count
    pressure.reset()
    assert pressure.share == 0.0 and not any(pressure.share_by_kind().values())
