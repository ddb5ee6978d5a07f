"""engine.profiling (when a loop profile starts and stops) and engine.profile_summary (the tables).

On the CPU the real torch profiler runs over a tiny workload (CUDA tables empty); the GPU tables are
checked on a small hand-written trace in Kineto's Chrome format, whose numbers are known.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.profile_summary import collect, main, summarize
from engine.profiling import HostProfiler, StepProfiler
from engine.settings import EngineSettings, parse_args

KINDS = ("talker_decode", "code_predict", "codec_chunk")


def work(kind: str) -> None:
    x = torch.ones(32, 32)
    with torch.profiler.record_function(f"plan:{kind}"):
        (x @ x).relu().sum().item()


def test_starts_after_first_work_and_stops_after_its_steps(tmp_path: Path) -> None:
    profiler = StepProfiler(tmp_path, start_after_s=10.0, steps=3, summarize="inline")
    profiler.turn(0.0, None)
    profiler.turn(50.0, None)  # idle turns do not start the clock
    assert profiler.state == "waiting"
    profiler.turn(100.0, "talker_decode")  # first work: the clock starts here
    profiler.turn(105.0, "talker_decode")
    assert profiler.state == "waiting"
    profiler.turn(110.0, None)
    assert profiler.state == "recording"
    for number, kind in enumerate((*KINDS[:2], None, KINDS[2])):
        if kind:
            work(kind)
        profiler.turn(110.5 + number, kind)
    assert profiler.state == "done"
    profiler.turn(200.0, "codec_chunk")  # ignored once done

    summary = json.loads((tmp_path / "profile_summary.json").read_text())
    meta = summary["meta"]
    assert meta["reason"] == "steps" and meta["work_steps"] == 3 and meta["turns"] == 4
    assert meta["steps_by_kind"] == {kind: 1 for kind in KINDS} and meta["device"] == "cpu"
    labels = {row["label"]: row for row in summary["labels"]}
    assert {f"plan:{k}" for k in KINDS} <= set(labels) and all(
        labels[f"plan:{k}"]["calls"] == 1 for k in KINDS
    )
    assert summary["kernels"] == [] and summary["gaps"] == []  # no CUDA here
    ops = {row["name"] for row in summary["cpu_ops"]}
    assert "aten::mm" in ops
    assert any(row["call"] == "aten::item" and "plan:" in row["where"] for row in summary["syncs"])
    text = (tmp_path / "profile_summary.txt").read_text()
    assert "top CUDA kernels by GPU time" in text and "aten::mm" in text
    assert not list(tmp_path.glob(".trace-*"))  # the raw trace is gone


def test_max_record_s_and_close(tmp_path: Path) -> None:
    profiler = StepProfiler(
        tmp_path / "a", start_after_s=0.0, steps=1000, max_record_s=5.0, summarize="inline"
    )
    profiler.turn(0.0, "codec_chunk")
    assert profiler.state == "recording"
    work("codec_chunk")
    profiler.turn(1.0, "codec_chunk")
    profiler.turn(100.0, None)
    assert profiler.state == "done"
    assert (
        json.loads((tmp_path / "a" / "profile_summary.json").read_text())["meta"]["reason"] == "max_record_s"
    )

    closing = StepProfiler(
        tmp_path / "b", start_after_s=0.0, steps=1000, from_first_work=False, summarize="inline"
    )
    closing.turn(0.0, None)  # from engine start: an idle turn starts the clock
    assert closing.state == "recording"
    work("talker_decode")
    closing.close()
    assert closing.state == "done"
    assert json.loads((tmp_path / "b" / "profile_summary.json").read_text())["meta"]["reason"] == "closed"


def test_summary_in_a_child_process(tmp_path: Path) -> None:
    profiler = StepProfiler(tmp_path, start_after_s=0.0, steps=2)
    for kind in ("talker_decode", "talker_decode", None, "code_predict"):  # the first starts it
        if kind:
            work(kind)
        profiler.turn(1.0, kind)
    assert profiler.state == "done" and profiler.summarizer is not None
    assert profiler.summarizer.wait(120) == 0, (tmp_path / "profile_summary.log").read_text()
    assert json.loads((tmp_path / "profile_summary.json").read_text())["meta"]["work_steps"] == 2


def choose_batch(rows: int) -> int:
    return sum(range(rows))


def test_host_profile_names_the_functions_the_loop_spent_its_time_in(tmp_path: Path) -> None:
    profiler = HostProfiler(tmp_path, start_after_s=10.0, steps=3, top=500)
    profiler.turn(0.0, "talker_decode")  # first work starts the clock
    choose_batch(10)  # before the window: not recorded
    profiler.turn(5.0, "talker_decode")
    assert profiler.state == "waiting"
    profiler.turn(10.0, None)
    assert profiler.state == "recording"
    for number, kind in enumerate(KINDS):
        choose_batch(1000)
        profiler.turn(10.5 + number, kind)
    assert profiler.state == "done"

    report = json.loads((tmp_path / "host_profile.json").read_text())
    assert report["meta"]["work_steps"] == 3 and report["meta"]["reason"] == "steps"
    rows = {row["function"]: row for row in report["by_self"]}
    ours = [name for name in rows if name.endswith("(choose_batch)")]
    assert ours == [f"tests/engine/test_profiling.py:{choose_batch.__code__.co_firstlineno}(choose_batch)"]
    assert rows[ours[0]]["calls"] == 3 and rows[ours[0]]["cumulative_ms"] >= rows[ours[0]]["self_ms"] > 0
    assert "top functions by self time" in (tmp_path / "host_profile.txt").read_text()


def test_the_engine_takes_a_profile_kind() -> None:
    assert EngineSettings(model="tiny", socket="@x").profile_kind == "torch"
    args = ["--model", "tiny", "--socket", "@x", "--profile-dir", "/tmp/p", "--profile-kind", "host"]
    assert parse_args(args).profile_kind == "host"
    with pytest.raises(ValueError):
        EngineSettings(model="tiny", socket="@x", profile_kind="perf")


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        StepProfiler(tmp_path, steps=0)
    with pytest.raises(ValueError):
        StepProfiler(tmp_path, summarize="thread")


def x(
    cat: str, name: str, ts: float, dur: float, tid: int = 1, pid: int = 1, **args: object
) -> dict[str, object]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


# Host thread 1: a codec plan replays a graph (two kernels), a talker plan launches one kernel and
# copies to pageable memory; a stream sync outside any plan; one kernel nobody launched (stream 7).
GPU_TRACE = [
    {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
    x("user_annotation", "plan:codec_chunk", 100, 100),
    x("cpu_op", "aten::copy_", 105, 3),
    x("cuda_runtime", "cudaGraphLaunch", 110, 20, correlation=1),
    x("user_annotation", "plan:talker_decode", 250, 200),
    x("cuda_runtime", "cudaLaunchKernel", 260, 5, correlation=2),
    x("cpu_op", "aten::item", 270, 160),
    x("cuda_runtime", "cudaMemcpyAsync", 280, 150, correlation=3),
    x("cuda_runtime", "cudaStreamSynchronize", 500, 100),
    x("kernel", "codec_conv", 300, 50, tid=7, pid=0, correlation=1, stream=7),
    x("kernel", "codec_snake", 360, 40, tid=7, pid=0, correlation=1, stream=7),
    x("kernel", "talker_gemm", 420, 30, tid=7, pid=0, correlation=2, stream=7),
    x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 450, 5, tid=7, pid=0, correlation=3, stream=7),
    x("kernel", "codec_conv", 1000, 10, tid=7, pid=0, stream=7),
]


def test_gpu_tables_from_a_known_trace(tmp_path: Path) -> None:
    summary = summarize(collect(GPU_TRACE), {"note": "synthetic"})
    overview = summary["overview"]
    assert overview["kernels"] == 4 and overview["kernel_ms"] == 0.13 and overview["streams"] == 1
    assert overview["gpu_busy_ms"] == 0.135 and overview["gpu_span_ms"] == 0.71  # 300..1010 µs

    kernels = {row["name"]: row for row in summary["kernels"]}
    assert kernels["codec_conv"]["count"] == 2 and kernels["codec_conv"]["total_ms"] == 0.06
    assert kernels["codec_conv"]["mean_us"] == 30.0 and kernels["codec_conv"]["pct"] == pytest.approx(46.15)

    labels = {row["label"]: row for row in summary["labels"]}
    assert labels["plan:codec_chunk"]["gpu_ms"] == 0.09 and labels["plan:codec_chunk"]["gpu_items"] == 2
    assert labels["plan:talker_decode"]["gpu_ms"] == 0.035  # its kernel and its copy, run after it returned
    assert labels["(no label)"]["gpu_ms"] == 0.01
    assert labels["plan:codec_chunk"]["calls"] == 1 and labels["plan:codec_chunk"]["host_ms"] == 0.1

    syncs = {row["call"]: row for row in summary["syncs"]}
    copy = syncs["cudaMemcpyAsync [Memcpy DtoH (Device -> Pageable)]"]
    assert copy["count"] == 1 and copy["total_ms"] == 0.15 and copy["where"] == "plan:talker_decode x1"
    assert syncs["cudaStreamSynchronize"]["where"] == "(no label) x1"
    assert syncs["aten::item"]["total_ms"] == 0.16

    gaps = {row["gap"]: row["count"] for row in summary["gaps"]}
    assert gaps == {"10 us - 20 us": 1, "20 us - 50 us": 1, "500 us - 1 ms": 1}

    ops = {row["name"]: row for row in summary["cpu_ops"]}
    assert ops["aten::item"]["self_ms"] == 0.01  # 160 µs minus the 150 µs copy inside it
    assert ops["cudaStreamSynchronize"]["self_ms"] == 0.1 and ops["aten::item"]["total_incl_ms"] == 0.16
    folded = summarize(collect(GPU_TRACE), top=1)["kernels"]
    assert [(row["name"], row["count"], row["total_ms"]) for row in folded] == [
        ("codec_conv", 2, 0.06),
        ("(2 others)", 2, 0.07),
    ]

    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": GPU_TRACE}))
    assert main([str(trace), "--out", str(tmp_path / "out"), "--meta", '{"run": 1}', "--delete-trace"]) == 0
    assert not trace.exists()
    written = json.loads((tmp_path / "out" / "profile_summary.json").read_text())
    assert written["meta"] == {"run": 1} and written["kernels"] == summary["kernels"]
    text = (tmp_path / "out" / "profile_summary.txt").read_text()
    assert "codec_conv" in text and "plan:talker_decode" in text and "500 us - 1 ms" in text
