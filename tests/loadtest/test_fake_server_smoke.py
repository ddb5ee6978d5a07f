"""Both transports, both client implementations, end to end against the fake server in its own process."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadtest.bench import RunOptions, run_benchmark
from loadtest.fake_audio import FakeVoice
from loadtest.selfbench import start_fake_server, stop

REPO = Path(__file__).resolve().parents[2]
# The fake's audio: 20 ms to first chunk, 30 ms of silence -> onset window at 20 ms -> TTFA about 40 ms
FAKE = FakeVoice(ttfa_ms=20.0, leading_silence_ms=30.0, speed=8.0)


@pytest.fixture(scope="module")
def fake_url() -> Iterator[str]:
    child, url = start_fake_server(FAKE)
    try:
        yield url
    finally:
        stop(child)


def stats(url: str) -> dict[str, int]:
    return httpx.get(url + "/stats").json()


@pytest.mark.parametrize("client", ["fast", "library"])
@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_both_transports_measure_the_fake_servers_known_latency(
    fake_url: str, transport: str, client: str
) -> None:
    options = RunOptions(
        url=fake_url,
        rps=8.0,
        duration_s=2.0,
        warmup_s=0.5,
        transport=transport,
        client=client,
        ws_word_interval_ms=10.0,
        seed=1,
    )
    summary = await run_benchmark(options, echo=False)
    requests = summary["requests"]
    assert requests["scheduled"] > 5 and requests["ok"] == requests["scheduled"], summary["errors"]
    assert summary["errors"]["total"] == 0
    ttfa = summary["latency_ms"]["ttfa"]
    silence = summary["latency_ms"]["leading_silence"]
    assert silence["min"] == silence["max"] == pytest.approx(20.0)  # 30 ms lead -> first window at 20 ms
    # true TTFA is 20 + 20 = 40 ms; allow for a loaded CI machine but not for a missing component
    assert 39.0 <= ttfa["p50"] <= 150.0
    assert ttfa["p50"] == pytest.approx(summary["latency_ms"]["first_playable"]["p50"] + 20.0, abs=1.0)
    # The fake streams 8x faster than real time, so it never underruns; a starved generator can still see
    # one (chunks timestamped late), which its own event-loop lag then shows at least as large.
    u, lag = summary["underruns"], summary["client"]["loop_lag_ms"]
    assert u["requests_with_underruns"] == 0 or u["max_stall_ms"] <= (lag["max"] or 0.0) + 5.0, (u, lag)
    assert summary["rtf"]["p50"] < 0.5  # the fake produces 8x realtime
    if transport == "ws":
        assert summary["latency_ms"]["input_ingress"]["count"] == requests["ok"]


async def test_a_server_side_stall_is_reported_as_an_underrun_of_its_length() -> None:
    voice = FakeVoice(ttfa_ms=10.0, leading_silence_ms=0.0, speed=10.0, stall_at_ms=400.0, stall_ms=700.0)
    child, url = start_fake_server(voice)
    try:
        options = RunOptions(url=url, rps=4.0, duration_s=1.5, warmup_s=0.0, seed=2, arrival="constant")
        summary = await run_benchmark(options, echo=False)
    finally:
        stop(child)
    u = summary["underruns"]
    n = summary["requests"]["ok"]
    assert n == 6 and u["requests_with_underruns"] == n and u["count"] == n
    # 400 ms of audio arrive within ~40 ms, so the buffer runs dry ~360 ms before the 700 ms pause ends:
    # each stall is about 700 - 360 = 340 ms (+ scheduling noise)
    assert 300.0 <= u["max_stall_ms"] <= 450.0
    assert u["total_stall_ms"] == pytest.approx(n * 340.0, rel=0.25)


async def test_server_errors_are_counted_by_kind() -> None:
    child, url = start_fake_server(FakeVoice(fail_every=3, speed=20.0))
    try:
        http = await run_benchmark(
            RunOptions(url=url, rps=6.0, duration_s=1.0, warmup_s=0.0, arrival="constant"), echo=False
        )
        ws = await run_benchmark(
            RunOptions(url=url, rps=6.0, duration_s=1.0, warmup_s=0.0, arrival="constant", transport="ws"),
            echo=False,
        )
    finally:
        stop(child)
    assert http["errors"]["by_kind"] == {"http_500": 2}
    assert "injected failure" in http["errors"]["examples"]["http_500"]
    assert ws["errors"]["by_kind"] == {"ws_injected_failure": 2}
    assert http["requests"]["ok"] == ws["requests"]["ok"] == 4


async def test_playback_reports_are_sent_and_consistent(fake_url: str) -> None:
    before = stats(fake_url)
    options = RunOptions(
        url=fake_url,
        rps=4.0,
        duration_s=1.0,
        warmup_s=0.0,
        transport="ws",
        playback_reports=True,
        playback_report_ms=50.0,
        arrival="constant",
        prompts=str(REPO / "loadtest/data/seed-tts-eval-en.jsonl"),
    )
    summary = await run_benchmark(options, echo=False)
    after = stats(fake_url)
    sent = after.get("playback_reports", 0) - before.get("playback_reports", 0)
    assert summary["requests"]["ok"] == 4
    assert sent > 4  # several per request: audio lasts seconds, E2E far more than 50 ms
    assert after.get("playback_report_errors", 0) == before.get("playback_report_errors", 0)


@pytest.mark.parametrize("client", ["fast", "library"])
async def test_max_lead_asks_for_pacing_once_per_socket_before_its_context(fake_url: str, client: str) -> None:
    before = stats(fake_url)
    options = RunOptions(
        url=fake_url, rps=4.0, duration_s=1.0, warmup_s=0.0, transport="ws", client=client,
        arrival="constant", max_lead_ms=1500,
    )  # fmt: skip
    summary = await run_benchmark(options, echo=False)
    after = stats(fake_url)
    assert summary["requests"]["ok"] == 4, summary["errors"]
    updates = after.get("ws session.update", 0) - before.get("ws session.update", 0)
    creates = after.get("ws context.create", 0) - before.get("ws context.create", 0)
    assert updates == creates == 4
    with pytest.raises(ValueError, match="WS transport only"):
        await run_benchmark(RunOptions(url=fake_url, rps=1.0, duration_s=0.1, max_lead_ms=1500), echo=False)


async def test_arrivals_do_not_wait_for_completions() -> None:
    # Every response takes over 2 s to start; 12 arrivals in 1.5 s must still leave on schedule.
    child, url = start_fake_server(FakeVoice(ttfa_ms=2000.0, speed=20.0))
    try:
        options = RunOptions(url=url, rps=8.0, duration_s=1.5, warmup_s=0.0, arrival="constant")
        summary = await run_benchmark(options, echo=False)
    finally:
        stop(child)
    assert summary["requests"]["ok"] == 12
    assert summary["client"]["peak_in_flight"] == 12
    assert summary["latency_ms"]["scheduling_lag"]["max"] < 100.0
    assert summary["latency_ms"]["first_playable"]["min"] >= 2000.0


async def test_max_concurrency_drops_arrivals_instead_of_delaying_them() -> None:
    child, url = start_fake_server(FakeVoice(ttfa_ms=1000.0, speed=20.0))
    try:
        options = RunOptions(
            url=url, rps=8.0, duration_s=1.0, warmup_s=0.0, arrival="constant", max_concurrency=3
        )
        summary = await run_benchmark(options, echo=False)
    finally:
        stop(child)
    assert summary["errors"]["by_kind"] == {"max_concurrency": 5}
    assert summary["requests"]["ok"] == 3


async def test_unreachable_server_is_a_connect_error() -> None:
    for transport in ("http", "ws"):
        options = RunOptions(
            url="http://127.0.0.1:9", rps=4.0, duration_s=0.5, warmup_s=0.0, transport=transport
        )
        summary = await run_benchmark(options, echo=False)
        assert set(summary["errors"]["by_kind"]) == {"connect"}
        assert summary["requests"]["ok"] == 0


def test_cli_run_sweep_and_plot_write_their_outputs(fake_url: str, tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "loadtest", *args], cwd=REPO, capture_output=True, text=True, timeout=120
        )

    run = cli(
        "run",
        "--url",
        fake_url,
        "--rps",
        "5",
        "--duration",
        "1s",
        "--warmup",
        "0s",
        "--transport",
        "ws",
        "--gpu-hourly-usd",
        "3.5",
        "--out",
        str(tmp_path / "one"),
    )
    assert run.returncode == 0, run.stderr
    assert "ttfa ms" in run.stdout
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["config"]["transport"] == "ws" and summary["cost"]["usd_per_million_chars"] > 0
    lines = (tmp_path / "one" / "requests.jsonl").read_text().splitlines()
    assert len(lines) == summary["requests"]["scheduled"] and json.loads(lines[0])["ok"]

    sweep = cli(
        "sweep",
        "--url",
        fake_url,
        "--rps",
        "2,4",
        "--duration",
        "1s",
        "--warmup",
        "0s",
        "--cooldown",
        "0s",
        "--out",
        str(tmp_path / "sweep"),
    )
    assert sweep.returncode == 0, sweep.stderr
    index = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [p["rps"] for p in index["points"]] == [2.0, 4.0]
    assert (tmp_path / "sweep" / "rps-2" / "summary.json").is_file()
    assert (tmp_path / "sweep" / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    plot = cli("plot", str(tmp_path / "sweep"), str(tmp_path / "one"), "-o", str(tmp_path / "cmp.png"))
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "cmp.png").stat().st_size > 10_000

    bad = cli("run", "--url", fake_url, "--rps", "5", "--duration", "soon")
    assert bad.returncode == 2 and "not a duration" in bad.stderr
