"""tools/bench_ab.py: configurations on fresh servers, repeated, in one table; logs kept for runs that lost requests."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench_ab import keeps_log, lost_requests, parse_config, run_finished, table

REPO = Path(__file__).resolve().parents[2]


def _point(name: str, p95: float, refused: float = 0.0, errors: dict | None = None, examples: dict | None = None):  # type: ignore[no-untyped-def]
    return {"name": name, "status": "ok", "ttfa_ms": {"p95": p95}, "refused_pct": refused,
            "errors_by_kind": errors or {}, "error_examples": examples or {},
            "underruns": {"requests_with_underruns": 0}, "audio_s_per_s": 380.0}  # fmt: skip


def test_a_configuration_is_a_label_and_shell_quoted_gateway_arguments():
    assert parse_config("on:--engine-arg=--codec-fill-frames=4 --heartbeat-timeout-s 60") == (
        "on", ["--engine-arg=--codec-fill-frames=4", "--heartbeat-timeout-s", "60"])
    assert parse_config("base:") == ("base", [])
    for bad in ("no-colon", ":--x", "a b:--x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_config(bad)


def test_refusals_are_not_lost_requests_but_timeouts_and_a_dead_engine_are():
    assert lost_requests(_point("http-80", 50, 2.0, {"http_503": 30, "ws_overloaded": 2})) == 0
    assert lost_requests(_point("http-80", 50, 0.0, {"timeout": 7, "transport": 1})) == 8
    died = _point("http-100", 0, 60.0, {"http_503": 40, "timeout": 5},
                  {"http_503": '{"error": {"code": "engine_died"}}'})
    assert lost_requests(died) == 45
    finished = {"exit_code": 0, "points": [_point("http-80", 50)]}
    assert run_finished(finished) and not keeps_log(finished)
    assert run_finished({"exit_code": 0, "points": [died]}) and keeps_log({"exit_code": 0, "points": [died]})
    assert not run_finished({"exit_code": 1, "points": []}) and keeps_log({"exit_code": 1, "points": []})


def test_the_table_has_a_row_per_point_and_configuration_with_every_run_and_the_median():
    runs = {"off": [{"points": [_point("http-80", 130.0, 1.5)]}, {"points": [_point("http-80", 150.0, 1.0)]}],
            "on": [{"points": [_point("http-80", 50.0)]}, {"points": [_point("http-80", 60.0, 0.5)]}]}
    lines = table(runs).splitlines()
    assert lines[0].startswith("| point | config | run 1: p95") and "run 2" in lines[0]
    assert lines[2].startswith("| http-80 | off | 130.0 ms, 1.5 %, 0 lost") and lines[2].endswith("| 140.0 / 1.2 |")
    assert lines[3].startswith("| http-80 | on | 50.0 ms") and lines[3].endswith("| 55.0 / 0.2 |")


def test_two_configurations_on_cpu_with_the_tiny_model(tmp_path: Path) -> None:
    prompts = tmp_path / "short.jsonl"
    prompts.write_text('{"id": "0", "text": "Hello there."}\n{"id": "1", "text": "See you soon."}\n')
    out = tmp_path / "ab"
    bench = (f"--warmup 1 --cooldown 0 --request-timeout 30 --model tiny --device cpu --load-format auto "
             f"--loadtest-args '--prompts {prompts}'")
    command = [sys.executable, "tools/bench_ab.py", "--out", str(out), "--repeat", "1", "--points", "http:1@3",
               "--budget-per-run", "120", "--ready-timeout", "100", "--bench-args", bench,
               "--config", "plain:", "--config", "filled:--engine-arg=--codec-fill-frames=4",
               "--", "--log-level", "warning"]  # fmt: skip
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    record = json.loads((out / "ab.json").read_text())
    assert record["schema"] == "vivace.bench.ab.v1" and list(record["runs"]) == ["plain", "filled"]
    for label, records in record["runs"].items():
        (only,) = records
        assert only["exit_code"] == 0 and [p["name"] for p in only["points"]] == ["http-1"], label
        assert only["points"][0]["requests"]["ok"] >= 1
    assert record["runs"]["filled"][0]["server"]["command"].endswith("--engine-arg=--codec-fill-frames=4")
    assert not list(out.glob("*.log"))  # nothing lost: no log kept
    last = run.stdout.rstrip().splitlines()[-2:]
    assert last[0].startswith("| http-1 | plain |") and last[1].startswith("| http-1 | filled |")
