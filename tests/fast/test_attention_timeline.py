"""tools/attention_timeline.py's summary of a launch's in-kernel stamps, checked on the CPU with stamps made up so
that every number it prints is known."""

from __future__ import annotations

import pytest
import torch

from tools import attention_timeline


def test_a_launch_summary_reads_stages_waves_and_sms_off_the_stamps() -> None:
    # four programs: stamps in ns (start, waited, q normed, new key, key loop, partial stored), then the SM; the
    # third and fourth start once the first two are done (a second wave on the same two SMs)
    rows = [[1000, 1000, 3000, 3000, 7000, 8000, 0, 0],
            [1000, 1000, 3000, 4000, 8000, 9000, 1, 0],
            [9000, 9000, 11000, 11000, 15000, 16000, 0, 0],
            [9500, 9500, 11500, 12500, 16500, 17500, 1, 0]]  # fmt: skip
    summary = attention_timeline.stage_table(torch.tensor(rows, dtype=torch.int64))
    assert summary["programs"] == 4 and summary["sms"] == 2 and summary["programs_per_sm_max"] == 2
    assert summary["span_us"] == pytest.approx(16.5) and summary["last_start_us"] == pytest.approx(8.5)
    assert summary["started_after_first_end"] == 2
    assert summary["program_us_median"] == pytest.approx(7.5)
    stages = summary["stages"]
    assert list(stages) == list(attention_timeline.TIMELINE_NAMES)
    assert stages["wait"]["median_us"] == 0 and stages["loads + q norm"]["median_us"] == pytest.approx(2.0)
    assert stages["new key"]["median_us"] == pytest.approx(0.5) and stages["key loop"]["median_us"] == pytest.approx(4.0)


def test_the_tool_says_it_needs_a_gpu_instead_of_failing_inside_a_kernel(monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("sys.argv", ["attention_timeline.py"])
    assert attention_timeline.main() == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_chained_table_takes_each_number_as_the_median_over_layers() -> None:
    layers = [{"span_us": 10.0, "stages": {"wait": {"median_us": 1.0}}},
              {"span_us": 30.0, "stages": {"wait": {"median_us": 2.0}}},
              {"span_us": 20.0, "stages": {"wait": {"median_us": 9.0}}}]  # fmt: skip
    assert attention_timeline.median_over(layers, "span_us") == pytest.approx(20.0)
    assert attention_timeline.median_over(layers, "wait", "median_us") == pytest.approx(2.0)
