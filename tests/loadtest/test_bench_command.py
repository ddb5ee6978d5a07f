"""tools/bench_h200.py: its parts (Prometheus diff, point specs, table, the reference recording) and
whole CPU runs.

The whole runs start the real gateway with the tiny model on the CPU, as the GPU run starts the
full-size one: one short HTTP point and one WebSocket point with the CustomVoice model, then, with the
Base model and `--clone-voices`, one HTTP point per cloned voice; they check bench.json and the table
printed last. No timing is asserted: on a CPU the numbers mean nothing.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from tools.benchkit import prom
from tools.benchkit.gpu import GpuSampler
from tools.benchkit.points import LoadRun, Point, loadtest_args, parse_points
from tools.benchkit.report import table
from tools.benchkit.voices import REFERENCE_RATE, write_reference

REPO = Path(__file__).resolve().parents[2]
SHORT_PROMPTS = ("Hello there.", "It is a fine day.", "See you soon.")

BEFORE = """# HELP vivace_requests_total Requests.
# TYPE vivace_requests_total counter
vivace_requests_total{endpoint="http",outcome="completed"} 10
# TYPE vivace_ttfa_seconds histogram
vivace_ttfa_seconds_bucket{endpoint="http",le="0.01"} 3
vivace_ttfa_seconds_bucket{endpoint="http",le="+Inf"} 10
vivace_ttfa_seconds_sum{endpoint="http"} 0.5
vivace_ttfa_seconds_count{endpoint="http"} 10
# TYPE vivace_engine_step_seconds gauge
vivace_engine_step_seconds{engine="0",kind="codec_chunk"} 0.014
"""
AFTER = """# TYPE vivace_requests_total counter
vivace_requests_total{outcome="completed",endpoint="http"} 25
vivace_requests_total{endpoint="http",outcome="refused"} 2
# TYPE vivace_ttfa_seconds histogram
vivace_ttfa_seconds_bucket{endpoint="http",le="0.01"} 9
vivace_ttfa_seconds_sum{endpoint="http"} 1.25
vivace_ttfa_seconds_count{endpoint="http"} 25
# TYPE vivace_engine_step_seconds gauge
vivace_engine_step_seconds{engine="0",kind="codec_chunk"} 0.02
# TYPE vivace_engine_gpu_seconds_total counter
vivace_engine_gpu_seconds_total{engine="0",kind="codec_chunk"} 3.0
vivace_engine_gpu_seconds_total{engine="0",kind="talker_decode"} 1.5
# TYPE vivace_engine_host_seconds_total counter
vivace_engine_host_seconds_total{activity="gc",engine="0"} 0.1625
vivace_engine_host_seconds_total{activity="plan",engine="0"} 2.5
vivace_engine_host_seconds_total{activity="launch",engine="0"} 4.0
vivace_engine_host_seconds_total{activity="wait_gpu",engine="0"} 1.25
# TYPE vivace_gateway_gc_pause_seconds_total counter
vivace_gateway_gc_pause_seconds_total 0.004
"""


def test_a_gpu_window_summarises_only_its_own_samples_memory_used_included() -> None:
    sampler = GpuSampler()
    sampler.source = "nvidia-smi"
    sampler.samples = [(1.0, 50.0, 10.0, 300.0, 1980.0, 60_000.0), (2.0, 90.0, 30.0, 500.0, 1980.0, 61_500.4),
                       (3.0, 10.0, None, None, None, None), (9.0, 100.0, 99.0, 700.0, 1000.0, 90_000.0)]  # fmt: skip
    window = sampler.window(0.5, 3.5)
    assert window is not None and window["samples"] == 3
    assert window["util_mean"] == 50.0 and window["util_max"] == 90.0 and window["mem_util_mean"] == 20.0
    assert window["mem_used_mib_max"] == 61_500  # the 90 GB sample lies outside the window
    assert GpuSampler().window(0.0, 1.0) is None  # no GPU source: no summary


def test_diff_counters_and_gauges_generically() -> None:
    delta = prom.diff(prom.parse(BEFORE), prom.parse(AFTER), interval_s=10.0)
    counters = delta["counters"]
    assert counters['vivace_requests_total{endpoint="http",outcome="completed"}'] == 15  # labels sorted
    assert counters['vivace_requests_total{endpoint="http",outcome="refused"}'] == 2  # new series
    assert counters['vivace_ttfa_seconds_count{endpoint="http"}'] == 15
    assert counters['vivace_ttfa_seconds_sum{endpoint="http"}'] == 0.75
    assert counters['vivace_engine_gpu_seconds_total{engine="0",kind="codec_chunk"}'] == 3.0
    assert not any("_bucket" in key for key in counters)
    assert delta["gauges"] == {'vivace_engine_step_seconds{engine="0",kind="codec_chunk"}': 0.02}
    by_kind = prom.label_values(counters, "vivace_engine_gpu_seconds_total", "kind")
    assert by_kind == {"codec_chunk": 3.0, "talker_decode": 1.5}


def test_point_specs() -> None:
    points = parse_points("http:1@60, http:10,ws:40", default_window_s=20.0)
    assert points == [Point("http", 1.0, 60.0), Point("http", 10.0, 20.0), Point("ws", 40.0, 20.0)]
    assert [p.name for p in points] == ["http-1", "http-10", "ws-40"]
    for bad in ("tcp:10", "http10", "http:x", "http:0", "ws:5@-1", ""):
        with pytest.raises(ValueError):
            parse_points(bad, 20.0)
    args = loadtest_args(points[2], "http://h", Path("/o"), warmup_s=4, timeout_s=20, seed=0, extra=[])
    assert args[:2] == ["run", "--url"] and "--playback-reports" in args
    assert "--playback-reports" not in loadtest_args(points[0], "http://h", Path("/o"), warmup_s=4,
                                                     timeout_s=20, seed=0, extra=[])  # fmt: skip


def test_a_point_spec_may_end_with_the_voice_its_requests_name() -> None:
    points = parse_points("http:10@20/bench-xvector, ws:5/ryan,http:1", default_window_s=30.0)
    assert points == [Point("http", 10.0, 20.0, "bench-xvector"), Point("ws", 5.0, 30.0, "ryan"),
                      Point("http", 1.0, 30.0)]  # fmt: skip
    assert [p.name for p in points] == ["http-10-bench-xvector", "ws-5-ryan", "http-1"]
    assert [p.spec for p in points] == ["http:10@20/bench-xvector", "ws:5@30/ryan", "http:1@30"]
    assert parse_points(",".join(p.spec for p in points), 99.0) == points

    def args(point: Point, extra: list[str]) -> list[str]:
        return loadtest_args(point, "http://h", Path("/o"), warmup_s=4, timeout_s=20, seed=0, extra=extra)

    assert args(points[0], [])[-2:] == ["--voice", "bench-xvector"]
    assert args(points[0], ["--voice", "alloy"])[-2:] == ["--voice", "bench-xvector"]  # the point's wins
    assert "--voice" not in args(points[2], [])


def test_a_voice_name_the_server_would_refuse_is_refused_in_the_point_spec() -> None:
    for bad in ("http:10/", "http:10@20/", "http:10/Bench", "http:10/-voice", "http:10/a b", "http:10/a.b",
                "http:10/a/b", "http:10/" + "v" * 65, "ws:5/voice@20"):  # fmt: skip
        with pytest.raises(ValueError, match="point"):
            parse_points(bad, 20.0)
    assert parse_points("http:10/" + "v" * 64, 20.0)[0].voice == "v" * 64


def test_the_reference_recording_is_five_seconds_of_24_khz_16_bit_mono_and_the_same_for_a_seed(
    tmp_path: Path,
) -> None:
    described = write_reference(tmp_path / "a.wav", seed=0)
    write_reference(tmp_path / "b.wav", seed=0)
    write_reference(tmp_path / "c.wav", seed=1)
    with wave.open(str(tmp_path / "a.wav")) as reference:
        assert (reference.getnchannels(), reference.getsampwidth(), reference.getframerate()) == (1, 2, 24000)
        pcm = np.frombuffer(reference.readframes(reference.getnframes()), "<i2")
    assert described == {"file": "a.wav", "duration_s": 5.0, "sample_rate": REFERENCE_RATE,
                         "bytes": (tmp_path / "a.wav").stat().st_size, "seed": 0}  # fmt: skip
    assert pcm.size == 5 * 24000 and 8000 < np.abs(pcm).max() < 32767  # loud, not clipped
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64)))
    peak_hz = np.argmax(spectrum) * 24000 / pcm.size
    assert 100 < peak_hz < 600  # voiced: the energy lies in the low harmonics of a 120-220 Hz pitch
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()
    assert (tmp_path / "a.wav").read_bytes() != (tmp_path / "c.wav").read_bytes()


def test_points_of_voices_that_could_not_be_saved_are_skipped(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on: every save gets no answer
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    out = tmp_path / "out"
    command = [sys.executable, "tools/bench_h200.py", "--url", url, "--out", str(out), "--clone-voices",
               "--points", "http:1@1/bench-xvector,http:1@1/bench-in-context", "--budget", "60"]  # fmt: skip
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-4000:]

    record = json.loads((out / "bench.json").read_text())
    assert record["config"]["clone_voices"] is True
    assert [(v["name"], v["status"], v["ok"]) for v in record["voices"]] == [
        ("bench-xvector", 0, False), ("bench-in-context", 0, False)]  # fmt: skip
    assert all("ConnectError" in v["error"] for v in record["voices"])
    assert [(p["name"], p["voice"], p["status"], p["reason"]) for p in record["points"]] == [
        ("http-1-bench-xvector", "bench-xvector", "skipped", "voice not saved"),
        ("http-1-bench-in-context", "bench-in-context", "skipped", "voice not saved"),
    ]
    assert "| http-1-bench-xvector | 1.0 | skipped: voice not saved |" in run.stdout


def test_table_shows_gpu_seconds_by_kind_when_exported() -> None:
    point = {
        "name": "http-40", "rps": 40.0, "status": "ok", "offered_rps": 39.5, "achieved_rps": 39.0,
        "ttfa_ms": {"p50": 30.0, "p95": 40.0, "p99": 50.0}, "refused_pct": 1.25,
        "errors_by_kind": {"http_503": 10}, "underruns": {"requests_with_underruns": 0},
        "audio_s_per_s": 180.0, "gpu": {"util_mean": 88.5, "gpm": {"sm_util": 61.0}},
        "metrics": {"interval_s": 10.0, "counters": prom.diff(prom.parse(BEFORE), prom.parse(AFTER), 10.0)["counters"]},
    }  # fmt: skip
    skipped = {"name": "ws-40", "rps": 40.0, "status": "skipped", "reason": "budget"}
    text = table([point, skipped]).splitlines()
    assert "SM active %" in text[0] and "engine GPU s/s by kind" in text[0]
    assert "30.0 / 40.0 / 50.0" in text[2] and "codec_chunk 0.30 talker_decode 0.15" in text[2]
    assert text[0].endswith("codec frames per event-s | GC pause ms engine / gateway | engine host s/s: plan / launch / wait |")
    assert text[2].endswith("| 7.5k | 162 / 4 | 0.25 / 0.40 / 0.12 |")  # 180 audio s/s x 12.5 frames / 0.30 codec GPU s/s
    assert "skipped: budget" in text[3]


@pytest.mark.slow
def test_whole_run_on_cpu_with_the_tiny_model(tmp_path: Path) -> None:
    out = tmp_path / "out"
    prompts = tmp_path / "short.jsonl"  # short sentences: the tiny model on a shared CPU core is slow
    prompts.write_text(
        "".join(f'{{"id": "{n}", "text": "{text}"}}\n' for n, text in enumerate(SHORT_PROMPTS))
    )
    command = [
        sys.executable, "tools/bench_h200.py", "--out", str(out), "--raw-dir", str(tmp_path / "raw"),
        "--points", "http:1@3,ws:1@3", "--warmup", "1", "--cooldown", "0", "--request-timeout", "30",
        "--budget", "150", "--ready-timeout", "120", "--model", "tiny", "--device", "cpu",
        "--load-format", "auto", "--loadtest-args", f"--prompts {prompts}", "--", "--log-level", "warning",
    ]  # fmt: skip
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    record = json.loads((out / "bench.json").read_text())
    assert record["schema"] == "vivace.bench.server.v1"
    assert record["command"].startswith("python tools/bench_h200.py --out")
    assert record["server"]["command"].endswith("--log-level warning")
    assert record["server"]["exit_code"] == 0 and record["server"]["ready_s"] > 0
    assert [p["name"] for p in record["points"]] == ["http-1", "ws-1"]
    for point in record["points"]:
        assert point["status"] == "ok", point
        assert point["requests"]["ok"] >= 1 and point["ttfa_ms"]["p50"] > 0
        assert point["refused_pct"] == 0.0 and point["errors_by_kind"] == {}
        assert point["gpu"] is None and point["gpu_util_mean"] is None  # no GPU here
        assert point["metrics"]["interval_s"] == pytest.approx(3.0, abs=1.0)
        assert any(k.startswith("vivace_engine_step_seconds") for k in point["metrics"]["gauges"])
        # Device time per work kind (the wall time of CPU work here) grows over the window.
        gpu = {
            k: v for k, v in point["metrics"]["counters"].items() if k.startswith("vivace_engine_gpu_seconds")
        }
        assert any('kind="code_predict"' in k and v > 0 for k, v in gpu.items()), gpu
        assert (tmp_path / "raw" / point["name"] / "summary.json").exists()
        client = point["client"]
        assert client["loop_lag_max_ms"] >= client["loop_lag_p99_ms"] >= 0
    assert "--playback-reports" in record["points"][1]["loadtest_command"]
    assert record["config"]["loadtest_args"] == f"--prompts {prompts}"
    assert (out / "gateway.log").exists() and (out / "bench.md").exists()

    last = run.stdout.rstrip().splitlines()[-4:]
    assert (
        last[0].startswith("| point |")
        and last[2].startswith("| http-1 |")
        and last[3].startswith("| ws-1 |")
    )


@pytest.mark.slow
def test_whole_run_on_cpu_clones_an_x_vector_and_an_in_context_voice_on_the_tiny_base_model(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    prompts = tmp_path / "short.jsonl"
    prompts.write_text(
        "".join(f'{{"id": "{n}", "text": "{text}"}}\n' for n, text in enumerate(SHORT_PROMPTS))
    )
    command = [
        sys.executable, "tools/bench_h200.py", "--out", str(out), "--clone-voices",
        "--points", "http:1@3/bench-xvector,http:1@3/bench-in-context", "--warmup", "1", "--cooldown", "0",
        "--request-timeout", "30", "--budget", "400", "--ready-timeout", "120", "--model", "tiny-base",
        "--device", "cpu", "--load-format", "auto", "--loadtest-args", f"--prompts {prompts}",
        "--", "--log-level", "warning",
    ]  # fmt: skip
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=450)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    record = json.loads((out / "bench.json").read_text())
    assert record["config"]["clone_voices"] is True
    assert record["config"]["points"] == ["http:1@3/bench-xvector", "http:1@3/bench-in-context"]
    assert f"--voices-dir {out / 'voices'}" in record["server"]["command"]
    xvector, in_context = record["voices"]
    for voice in (xvector, in_context):
        assert voice["status"] in (200, 201) and voice["ok"] and voice["seconds"] > 0, voice
        assert voice["response"]["model_id"] == "tiny-base" and voice["response"]["duration_s"] == 5.0
        assert voice["reference"]["file"] == "voice-reference.wav"
    assert xvector["name"] == "bench-xvector" and xvector["response"]["in_context"] is False
    assert in_context["name"] == "bench-in-context" and in_context["response"]["in_context"] is True
    assert in_context["response"]["transcript"] == in_context["transcript"]
    assert (out / "voice-reference.wav").exists() and (out / "voices" / "bench-xvector").is_dir()

    assert [(p["name"], p["voice"]) for p in record["points"]] == [
        ("http-1-bench-xvector", "bench-xvector"), ("http-1-bench-in-context", "bench-in-context")]  # fmt: skip
    for point in record["points"]:
        assert point["status"] == "ok", point
        assert point["requests"]["ok"] >= 1 and point["requests"]["failed"] == 0
        assert point["errors_by_kind"] == {} and point["ttfa_ms"]["p50"] > 0
        assert point["loadtest_command"].endswith(f"--voice {point['voice']}")

    last = run.stdout.rstrip().splitlines()[-2:]
    assert last[0].startswith("| http-1-bench-xvector |")
    assert last[1].startswith("| http-1-bench-in-context |")


def test_a_load_child_that_ends_at_its_windows_end_still_counts_as_having_reached_it(tmp_path: Path) -> None:
    """A light point's load test can exit the moment its window ends, while the parent oversleeps that moment: the
    window was measured (bench_h200 scrapes /metrics then); a child that exits before the moment was not."""
    import time

    run = LoadRun(["--help"], tmp_path / "load.log", Path(__file__).resolve().parents[2])
    assert run.sleep_until(time.monotonic() + 60) is False  # exits long before
    assert run.finish(30) == 0
    assert run.sleep_until(time.monotonic() - 0.01) is True  # the moment had come; the child's exit since is fine
