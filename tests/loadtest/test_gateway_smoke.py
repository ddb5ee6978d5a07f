"""The issue's CI smoke: 10 s at 2 RPS against the real gateway (tiny model, CPU), both transports.

The gateway runs as users run it, `python -m gateway --model tiny --device cpu`, in its own process;
the load generator runs as users run it too, `python -m loadtest run`, and the test reads its
summary.json. Skipped only while `gateway/__main__.py` does not exist.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadtest.prompts import load_prompts
from loadtest.schedule import build_schedule
from loadtest.summary import LATENCIES_MS, PERCENTILES

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 300.0  # model build + warm-up synthesis on a slow CI core
RPS, DURATION_S, WARMUP_S, SEED = 2.0, 10.0, 2.0, 0

# find_spec, not importorskip: importing a __main__ module would start the server in this process.
if importlib.util.find_spec("gateway.__main__") is None:
    pytest.skip("gateway/__main__.py does not exist yet", allow_module_level=True)

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def gateway_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gateway") / "gateway.log"


def log_tail(log_path: Path, chars: int = 6000) -> str:
    """What the gateway and its engine logged last: the reason behind a failed request (tracebacks)."""
    return "\n--- gateway log (tail) ---\n" + log_path.read_text(errors="replace")[-chars:]


@pytest.fixture(scope="module")
def gateway_url(gateway_log: Path) -> Iterator[str]:
    port = free_port()
    log_path = gateway_log
    with log_path.open("w") as log:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway",
                "--model",
                "tiny",
                "--device",
                "cpu",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if child.poll() is not None:
                pytest.fail(f"gateway exited with {child.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/ready", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"gateway not ready after {READY_TIMEOUT_S:.0f} s:\n{log_path.read_text()[-3000:]}"
                )
            time.sleep(0.5)
        yield url
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)  # the gateway and the engine it started
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_ten_second_two_rps_smoke_is_complete_and_error_free(
    gateway_url: str, gateway_log: Path, transport: str, tmp_path: Path
) -> None:
    out = tmp_path / transport
    args = [
        sys.executable,
        "-m",
        "loadtest",
        "run",
        "--url",
        gateway_url,
        "--rps",
        str(RPS),
        "--duration",
        f"{DURATION_S}s",
        "--warmup",
        f"{WARMUP_S}s",
        "--seed",
        str(SEED),
        "--transport",
        transport,
        "--timeout",
        "120s",
        "--gpu-hourly-usd",
        "3.5",
        "--out",
        str(out),
    ]
    if transport == "ws":
        args += ["--ws-word-interval-ms", "20", "--playback-reports"]
    run = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads((out / "summary.json").read_text())

    expected = build_schedule(load_prompts(), RPS, WARMUP_S, DURATION_S, SEED)
    measured = sum(1 for arrival in expected if arrival.phase == "measure")
    assert summary["requests"] == {
        "scheduled": measured,
        "ok": measured,
        "failed": 0,
        "warmup": len(expected) - measured,
    }, f"{summary['errors']}{log_tail(gateway_log)}"
    assert summary["errors"] == {"total": 0, "by_kind": {}, "examples": {}}
    for name in ("ttfa_ms", "first_playable_ms", "ttfb_ms", "e2e_ms", "leading_silence_ms", "connect_ms"):
        dist = summary["latency_ms"][name.removesuffix("_ms")]
        assert dist["count"] == measured and dist["missing"] == 0, name
        assert all(dist[f"p{p}"] is not None and dist[f"p{p}"] >= 0 for p in PERCENTILES), name
    assert set(summary["latency_ms"]) == {name.removesuffix("_ms") for name in LATENCIES_MS}
    assert summary["rtf"]["count"] == measured and summary["audio_s"]["min"] > 0
    assert summary["underruns"]["requests_with_audio"] == measured
    assert summary["throughput"]["chars_per_s"] > 0 and summary["cost"]["usd_per_million_chars"] > 0
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == len(expected) and all(row["ok"] for row in rows)
    if transport == "ws":
        assert all(row["playback_reports"] >= 0 for row in rows)
        assert summary["latency_ms"]["input_ingress"]["count"] == measured
