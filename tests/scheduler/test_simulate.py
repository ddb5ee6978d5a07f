"""The simulator: the real scheduler under Poisson load; the policy keeps its promises below capacity."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from statistics import fmean

import pytest

from engine.request import WorkKind, length_model_frames
from engine.scheduling import CostModel, Lane, Plan, SchedulerConfig
from engine.scheduling.simdevice import MS, SimDevice
from engine.scheduling.simulate import Workload, capacity_rps, load_prompts, simulate

ROOT = Path(__file__).resolve().parents[2]


def test_at_half_the_cost_models_capacity_no_deadline_is_missed():
    config, costs, prompts = SchedulerConfig(), CostModel.load(), load_prompts()
    mean_frames = sum(length_model_frames(len(p)) for p in prompts) / len(prompts)
    rps = 0.5 * capacity_rps(config, costs, mean_frames)
    assert rps > 20  # the plain H200 table: ~100 rps of capacity
    result = simulate(Workload(rps, duration_s=6.0, seed=3), config, costs, prompts)
    assert result.offered > 100 and result.refused == 0 and result.completed == result.offered
    assert result.underruns == 0
    assert result.percentile(99) < 250.0


def test_words_streamed_like_an_llm_complete_without_underruns_at_light_load():
    config, costs, prompts = SchedulerConfig(), CostModel.load(), load_prompts()
    result = simulate(Workload(5.0, duration_s=4.0, seed=1, text_mode="words", words_per_s=20.0),
                      config, costs, prompts)
    assert result.offered > 5 and result.completed == result.offered and result.underruns == 0


def test_simulation_is_reproducible_from_its_seed():
    config, costs, prompts = SchedulerConfig(), CostModel.load(), load_prompts()
    a, b = (simulate(Workload(10.0, duration_s=2.0, seed=7), config, costs, prompts) for _ in range(2))
    assert a.ttfa_ms == b.ttfa_ms and a.busy_ms == b.busy_ms


def test_overload_is_refused_rather_than_breaking_playing_streams():
    config, costs, prompts = SchedulerConfig(max_requests=1024, max_codec_streams=1024), CostModel.load(), load_prompts()
    result = simulate(Workload(200.0, duration_s=3.0, seed=2), config, costs, prompts)
    assert result.refused > 0 and result.underruns == 0


def test_overload_refusals_are_counted_per_admission_rule_with_the_pressure_arrivals_met():
    config, costs, prompts = SchedulerConfig(max_requests=1024, max_codec_streams=1024), CostModel.load(), load_prompts()
    result = simulate(Workload(200.0, duration_s=3.0, seed=2), config, costs, prompts)
    assert sum(result.refused_by.values()) == result.refused > 0
    assert set(result.refused_by) <= {"utilization", "pressure", "ttfa"}  # never malformed, never out of slots
    assert len(result.pressure_at_admission) == result.offered
    assert all(0.0 <= p <= 1.0 for p in result.pressure_at_admission)
    # The pressure's parts by the rescue plans' kind add up to the pressure met, arrival by arrival.
    assert sum(result.pressure_by_kind_sum.values()) == pytest.approx(sum(result.pressure_at_admission))
    assert max(result.pressure_by_kind_sum.values()) > 0.0


def test_deadlines_come_a_network_margin_before_clients_run_dry_so_streams_turn_urgent_sooner():
    # The gateway's playback clocks give the engine deadlines 10 ms before the listener runs dry (the time audio
    # takes to reach it); the simulator plays that part, so a wider margin leaves every stream less slack.
    config, costs, prompts = SchedulerConfig(), CostModel.load(), load_prompts()
    results = [simulate(Workload(40.0, duration_s=3.0, seed=3, network_margin_ms=margin), config, costs, prompts)
               for margin in (0.0, 10.0, 60.0)]  # fmt: skip
    pressure = [fmean(r.pressure_at_admission) for r in results]
    assert pressure == sorted(pressure) and pressure[0] < pressure[2]
    assert all(r.underruns == 0 and r.completed == r.offered for r in results)


def test_simulator_prints_admission_detail_under_each_row_when_asked():
    out = subprocess.run([sys.executable, "-m", "engine.scheduling.simulate", "--rps", "2", "--duration", "2",
                          "--admission-detail"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True).stdout  # fmt: skip
    detail = out.strip().splitlines()[3]
    assert detail.split()[:4] == ["admission:", "pressure", "met", "p50"] and detail.endswith("refused: none")


def test_simulator_runs_from_one_command_and_prints_a_row_per_rps():
    out = subprocess.run([sys.executable, "-m", "engine.scheduling.simulate", "--rps", "2", "8", "--duration", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout
    lines = out.strip().splitlines()
    assert "capacity" in lines[0] and "p95 ms" in lines[1] and "underruns" in lines[1]
    rows = [line.split() for line in lines[2:]]
    assert [row[0] for row in rows] == ["2", "8"]
    assert all(len(row) == len(lines[1].split()) - 4 for row in rows)  # "p50 ms" etc. are two words


def test_paced_streams_complete_without_underruns_on_less_gpu_time():
    config, costs, prompts = SchedulerConfig(), CostModel.load(), load_prompts()
    unpaced, paced = (simulate(Workload(10.0, duration_s=4.0, seed=2, max_lead_ms=lead), config, costs, prompts)
                      for lead in (0, 1000))
    for result in (unpaced, paced):
        assert result.offered > 20 and result.completed == result.offered and result.underruns == 0
    # Paced, generation follows playback: the run lasts until the last stream has nearly played out, and
    # streams that fell behind their lead meet in shared batches, so the same audio costs less GPU time.
    assert paced.sim_ms > unpaced.sim_ms + 1000
    assert paced.busy_ms < unpaced.busy_ms


def _plan(kind: WorkKind) -> Plan:
    return Plan(kind, (), 1)


def test_plans_on_the_two_lanes_share_the_device_while_both_run():
    device = SimDevice(overlap_rate=0.5)
    device.start(_plan(WorkKind.CODE_PREDICT), 10.0, 0)
    device.start(_plan(WorkKind.CODEC_CHUNK), 4.0, 0)
    assert device.free_lanes() == frozenset()
    end = device.next_end_ns(0)
    assert end == 8 * MS  # 4 ms of codec work at half speed
    ended = device.advance(0, end)
    assert [r.plan.kind for r in ended] == [WorkKind.CODEC_CHUNK]
    assert device.free_lanes() == frozenset({Lane.CODEC})
    # the code predictor did 4 ms of its 10 meanwhile; alone again, it runs at full speed
    assert device.next_end_ns(end) == 14 * MS
    assert [r.plan.kind for r in device.advance(end, 14 * MS)] == [WorkKind.CODE_PREDICT]
    assert device.busy_ms == 14.0 and device.overlap_ms == 8.0


def test_with_one_lane_plans_run_one_after_another():
    device = SimDevice(split_lanes=False)
    device.start(_plan(WorkKind.CODE_PREDICT), 3.0, 0)
    assert device.free_lanes() == frozenset()  # a codec plan waits for the code predictor
    assert device.next_end_ns(0) == 3 * MS


def test_the_simulated_codec_lane_overlaps_generation_and_its_lane_time_stretches():
    config, costs, prompts = SchedulerConfig(), CostModel.load(), load_prompts()
    load = Workload(20.0, duration_s=3.0, seed=4)
    lanes, one = (simulate(replace(load, lanes=flag), config, costs, prompts) for flag in (True, False))
    for result in (lanes, one):
        assert result.completed == result.offered and result.frames_decoded > 0
    work = sum(lanes.busy_by_kind.values())
    assert lanes.busy_ms < work  # the lanes ran at once part of the time
    # one queue: a codec plan's lane time is its work; beside generation it takes longer
    assert one.codec_event_ms == pytest.approx(one.busy_by_kind[WorkKind.CODEC_CHUNK], rel=1e-6)
    assert lanes.codec_event_ms > lanes.busy_by_kind[WorkKind.CODEC_CHUNK]
