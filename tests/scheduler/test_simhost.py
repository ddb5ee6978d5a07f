"""The simulator with the engine's host in the loop (`engine.scheduling.simhost`): plans cost host time, lanes
queue launched plans, the codec stream waits for the generation work queued before it."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from statistics import fmean

from engine.request import WorkKind, length_model_frames
from engine.scheduling import CostModel, Lane, Plan, SchedulerConfig
from engine.scheduling.simdevice import MS
from engine.scheduling.simhost import H200_HOST, HostCosts, QueuedDevice
from engine.scheduling.simulate import Workload, _arrivals, load_prompts, simulate

ROOT = Path(__file__).resolve().parents[2]
FREE = HostCosts(launch_ms={kind: 0.0 for kind in WorkKind}, plan_us=0.0, finish_ms=0.0)


def _plan(kind: WorkKind, first_chunks: bool = False) -> Plan:
    return Plan(kind, (), 1, first_chunks=first_chunks)


def test_a_codec_plan_starts_only_after_the_generation_work_queued_before_it():
    device = QueuedDevice(overlap_rate=0.5)
    device.launch(_plan(WorkKind.CODE_PREDICT), 3.0)  # made the frames the codec plan decodes
    device.launch(_plan(WorkKind.CODEC_CHUNK), 2.0)
    assert device.next_end_ns(0) == 3 * MS  # the code predictor alone, at full speed
    ended = device.advance(0, 3 * MS)
    assert [q.plan.kind for q in ended] == [WorkKind.CODE_PREDICT]
    assert [q.plan.kind for q in device.advance(3 * MS, 10 * MS)] == [WorkKind.CODEC_CHUNK]
    assert device.overlap_ms == 0.0 and device.busy_ms == 5.0


def test_launched_plans_queue_per_lane_up_to_the_in_flight_bounds():
    device = QueuedDevice(overlap_rate=0.65)
    host = replace(H200_HOST, max_in_flight=2, codec_in_flight=1)
    assert device.open_lanes(host) == frozenset(Lane)
    device.launch(_plan(WorkKind.TALKER_DECODE), 1.0)
    device.launch(_plan(WorkKind.CODEC_CHUNK, first_chunks=True), 1.0)  # first chunks: the generation lane
    device.launch(_plan(WorkKind.CODEC_CHUNK), 1.0)
    assert device.open_lanes(host) == frozenset()
    assert [q.plan.kind for q in device.advance(0, 100 * MS)] == [WorkKind.TALKER_DECODE, WorkKind.CODEC_CHUNK,
                                                                   WorkKind.CODEC_CHUNK]  # fmt: skip
    one = QueuedDevice(overlap_rate=0.65, split_lanes=False)
    one.launch(_plan(WorkKind.CODEC_CHUNK), 1.0)
    assert one.open_lanes(host) == frozenset(Lane) and len(one.queues[Lane.GENERATION]) == 1


def test_with_the_host_in_the_loop_every_request_completes_with_all_its_audio():
    config, costs, prompts = SchedulerConfig(), CostModel.load(), load_prompts()
    load = Workload(20.0, duration_s=3.0, seed=5)
    result = simulate(load, config, costs, prompts, host=H200_HOST)
    assert result.offered > 30 and result.refused == 0 and result.completed == result.offered
    assert result.underruns == 0 and result.host_ms > 0
    # every request's frames were decoded: as many as the random-weight length model gives its text
    submits = [payload for _, _, event, payload in _arrivals(load, prompts) if event == "submit"]
    assert result.frames_decoded == sum(length_model_frames(chars) for _, chars, _ in submits)


def test_host_time_lengthens_the_time_to_first_audio_and_a_faster_host_wins_it_back():
    config, costs, prompts = SchedulerConfig(), CostModel.load(ROOT / "engine/scheduling/costs/h200_fast.json"), load_prompts()
    load = Workload(60.0, duration_s=4.0, seed=6)
    free, h200, faster = (simulate(load, config, costs, prompts, host=host)
                          for host in (FREE, H200_HOST, replace(H200_HOST, plan_us=H200_HOST.plan_us / 4)))
    assert free.host_ms == 0 and h200.host_ms > faster.host_ms > 0
    mean_ttfa = [fmean(r.ttfa_ms) for r in (free, faster, h200)]
    assert mean_ttfa == sorted(mean_ttfa) and len(set(mean_ttfa)) == 3
    assert free.percentile(95) < h200.percentile(95)


def test_the_host_model_runs_from_the_command_line_and_prints_its_share():
    out = subprocess.run([sys.executable, "-m", "engine.scheduling.simulate", "--rps", "4", "--duration", "2",
                          "--host-plan-us", "5"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True).stdout  # fmt: skip
    lines = out.strip().splitlines()
    assert lines[1].startswith("host: plan 5 us per active request") and lines[2].split()[-1] == "host"
    assert lines[3].split()[0] == "4" and lines[3].split()[-1].endswith("%")


def test_a_codec_lane_that_gathers_rows_never_stalls_the_simulated_host():
    # A slow scheduler call outlasts the codec lane's gathering window: the host must still come back for the
    # rows it held, with the device idle and no arrival left to wake it.
    config, costs, prompts = SchedulerConfig(codec_gather_ms=30), CostModel.load(), load_prompts()
    for seed in (0, 1):
        load = Workload(1.0, duration_s=3.0, seed=seed)
        result = simulate(load, config, costs, prompts, host=replace(H200_HOST, plan_us=5000.0))
        assert result.offered > 0 and result.completed == result.offered
