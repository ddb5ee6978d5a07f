"""The demo page in headless Chromium against a live server: what the page played is exactly what
the server sent, the page reports its playback clock, and Stop is barge-in (silent at once, then
`context.cancel`). Assertions read the page's own state (`window.vivace`, fed by the worklet's
sample counters) and, independently, every WebSocket frame Chromium sent and received.
"""

from __future__ import annotations

import base64
import json
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from tests.browser.conftest import ARTIFACTS, WebServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PAGE_TIMEOUT_MS = 120_000
HEADER = struct.Struct("<BBHII")
SENTENCE = "Streaming speech should start at once, then play smoothly until the very last word."
LONG_TEXT = " ".join(
    ["A voice agent keeps talking while its language model is still writing the rest of the answer,"] * 4
)
CURRENT = "vivace.contexts[vivace.lastContextId]"


def fnv1a(data: bytes) -> int:
    """FNV-1a 32-bit, the hash the page's worklet keeps over rendered int16 samples."""
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


@dataclass
class SocketLog:
    """Every frame of the page's WebSocket, in order: ('in'|'out', str | bytes)."""

    frames: list[tuple[str, str | bytes]] = field(default_factory=list)

    def attach(self, ws: Any) -> None:
        ws.on("framereceived", lambda payload: self.frames.append(("in", payload)))
        ws.on("framesent", lambda payload: self.frames.append(("out", payload)))

    def events(self, direction: str) -> list[dict[str, Any]]:
        return [json.loads(p) for d, p in self.frames if d == direction and isinstance(p, str)]

    def audio(self, stream: int) -> list[tuple[int, int, int, int, bytes]]:
        """(flags, stream, sequence, start_sample, payload) of every audio frame of `stream`."""
        out = []
        for d, p in self.frames:
            if d == "in" and isinstance(p, bytes):
                version, flags, s, seq, start = HEADER.unpack_from(p)
                assert version == 1
                if s == stream:
                    out.append((flags, s, seq, start, p[HEADER.size :]))
        return out


def open_demo(chromium: Any, web_server: WebServer) -> tuple[Any, Any, SocketLog]:
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    log = SocketLog()
    page.on("websocket", log.attach)
    page.goto(web_server.base_url + "/?record=1")
    page.wait_for_function("() => window.vivace && window.vivace.state === 'ready'", timeout=30_000)
    assert not errors, errors
    return context, page, log


def wait_finished(page: Any) -> dict[str, Any]:
    page.wait_for_function(
        f"() => {{ const c = {CURRENT}; return c && ['drained', 'failed', 'stopped'].includes(c.phase); }}",
        timeout=PAGE_TIMEOUT_MS,
    )
    return page.evaluate(f"() => {{ const c = {{...{CURRENT}}}; delete c.recorded; delete c.unhashed; "
                         "delete c.opus; return c; }")  # fmt: skip


def settle(page: Any, condition: Callable[[], bool], what: str) -> None:
    """Wait until `condition()` holds. Playwright's sync API delivers WebSocket frame events to Python
    only while a Playwright call runs, so the log can lag the page by a few frames: pump until it
    catches up."""
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        page.wait_for_timeout(20)


def reports_for(log: SocketLog, context_id: str) -> list[dict[str, Any]]:
    return [
        e for e in log.events("out") if e["type"] == "playback.position" and e["context_id"] == context_id
    ]


def assert_server_got_reports(web_server: WebServer, before: int, sent: list[dict[str, Any]]) -> None:
    """The server received every report the page sent (polls: the last one may still be in flight)."""
    deadline = time.monotonic() + 5
    while web_server.playback_reports_received() - before < len(sent) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert web_server.playback_reports_received() - before == len(sent)
    record = web_server.received_events()
    if record is not None:  # the stand-in keeps the events themselves: compare them exactly
        got = [
            e for e in record if e["type"] == "playback.position" and e["context_id"] == sent[0]["context_id"]
        ]
        assert [e["played_samples"] for e in got] == [e["played_samples"] for e in sent]


@pytest.mark.parametrize("audio_format", ["pcm16", "opus"])
def test_streamed_sentence_plays_every_sample_the_server_sent(
    chromium: Any, web_server: WebServer, audio_format: str
) -> None:
    context, page, log = open_demo(chromium, web_server)
    try:
        if audio_format == "opus":
            assert page.evaluate("() => vivace.opusSupported"), (
                "this Chromium cannot decode Opus with WebCodecs"
            )
        page.check(f"#format-{audio_format}")
        page.fill("#text", SENTENCE)
        page.fill("#rate", "25")
        reports_before = web_server.playback_reports_received()
        started = time.monotonic()
        page.click("#stream")
        c = wait_finished(page)
        elapsed_ms = (time.monotonic() - started) * 1000
        page.screenshot(path=str(ARTIFACTS / f"web-demo-{audio_format}.png"), full_page=True)

        assert c["phase"] == "drained", c.get("error")
        assert c["done"]["reason"] == "completed"
        total = c["done"]["samples"]
        assert total > 0
        # The worklet rendered exactly the context's samples, and the page received exactly those.
        assert c["renderedSamples"] == total
        assert c["samplesReceived"] == total
        assert c["gaps"] == 0
        # The words went out one by one, then the end of the text.
        sent = [e for e in log.events("out") if e.get("context_id") == c["id"]]
        appends = [e for e in sent if e["type"] == "input_text.append"]
        assert "".join(e["text"] for e in appends) == SENTENCE
        assert len(appends) == len(SENTENCE.split())
        assert sent[-1]["type"] == "playback.position" or sent[-1]["type"] == "input_text.end"

        settle(page, lambda: len(log.audio(c["stream"])) == c["frames"], "every audio frame in the log")
        settle(page, lambda: len(reports_for(log, c["id"])) == c["reportsSent"], "every report in the log")
        frames = log.audio(c["stream"])
        assert [f[2] for f in frames] == list(range(len(frames)))  # sequence numbers in order
        assert frames[0][0] & 1 and frames[-1][0] & 2  # first and last flags
        recorded = np.frombuffer(
            base64.b64decode(page.evaluate(f"() => vivace.recorded({CURRENT}.id)")), "<i2"
        )
        assert len(recorded) == total
        if audio_format == "pcm16":
            server_pcm = b"".join(f[4] for f in frames)
            assert len(server_pcm) // 2 == total
            assert c["renderedHash"] == fnv1a(server_pcm)  # bit-exact, through the worklet
            assert c["receivedHash"] == c["renderedHash"]
            assert recorded.tobytes() == server_pcm
        else:
            import opuslib

            decoder = opuslib.Decoder(24000, 1)
            pcm = b"".join(decoder.decode(f[4], 480) for f in frames)
            reference = np.frombuffer(pcm, "<i2")[c["audio"]["pre_skip"] :][:total].astype(np.float64)
            assert len(reference) == total
            played = recorded.astype(np.float64)
            corr = float(
                np.dot(reference, played) / (np.linalg.norm(reference) * np.linalg.norm(played) + 1e-9)
            )
            assert corr > 0.99, (
                f"page's Opus playback does not match libopus' decode (correlation {corr:.3f})"
            )
            assert c["receivedHash"] == c["renderedHash"]

        # TTFA as heard: positive, and within the time the whole test took.
        assert 0 < c["ttfaMs"] < min(elapsed_ms, PAGE_TIMEOUT_MS)
        assert c["firstAudioMs"] <= c["ttfaMs"]

        # Playback reports: sent while playing and at the end, monotone, ending at what was played.
        reports = reports_for(log, c["id"])
        assert len(reports) == c["reportsSent"] >= 2
        played = [r["played_samples"] for r in reports]
        assert played == sorted(played) and played[-1] == total
        assert all(r["underruns"] >= 0 and r["buffered_samples"] >= 0 for r in reports)
        assert_server_got_reports(web_server, reports_before, reports)
        server_errors = [e for e in log.events("in") if e["type"] == "error"]
        assert not server_errors, server_errors
    finally:
        context.close()


def test_stop_silences_the_page_at_once_and_cancels_the_context(chromium: Any, web_server: WebServer) -> None:
    context, page, log = open_demo(chromium, web_server)
    try:
        page.fill("#text", LONG_TEXT)
        page.fill("#rate", "4")  # slow enough that the text is still streaming when we stop
        reports_before = web_server.playback_reports_received()
        page.click("#stream")
        page.wait_for_function(f"() => ({CURRENT}?.renderedSamples || 0) > 4800", timeout=PAGE_TIMEOUT_MS)
        page.click("#stop")
        page.wait_for_function("() => vivace.lastStop !== null", timeout=5_000)
        stop = page.evaluate("() => vivace.lastStop")
        page.wait_for_function(f"() => {CURRENT}.cancelled !== null", timeout=30_000)
        page.wait_for_timeout(500)  # keep listening: nothing more of the context may be rendered
        c = wait_finished(page)
        page.screenshot(path=str(ARTIFACTS / "web-demo-stopped.png"), full_page=True)

        assert c["phase"] == "stopped"
        assert stop["ackMs"] < 500, "the worklet took too long to go silent"
        assert c["renderedSamples"] == stop["renderedAtStop"] > 0
        assert page.evaluate("() => vivace.peakSinceStop") == 0.0  # every sample output since Stop was zero
        assert page.evaluate("() => vivace.state") == "ready"

        settle(
            page, lambda: any(e["type"] == "context.cancelled" for e in log.events("in")), "context.cancelled"
        )
        settle(page, lambda: len(reports_for(log, c["id"])) == c["reportsSent"], "every report in the log")
        out = [e for e in log.events("out") if e.get("context_id") == c["id"]]
        cancel = [e for e in out if e["type"] == "context.cancel"]
        assert len(cancel) == 1
        assert 0 <= cancel[0]["heard_samples"] <= c["renderedSamples"]
        assert out[-1] is cancel[0] or out[-1]["type"] == "context.cancel"
        last_report = [e for e in out if e["type"] == "playback.position"][-1]
        assert last_report["played_samples"] == c["renderedSamples"]
        assert out.index(last_report) < out.index(cancel[0])  # final position first, then the cancel
        # The text was not finished: Stop cancelled a context the server was still working on.
        assert not any(e["type"] == "input_text.end" for e in out)

        cancelled = c["cancelled"]
        assert cancelled["context_id"] == c["id"]
        # The server sent no audio for the context after saying it was cancelled.
        order = [(d, p) for d, p in log.frames if d == "in"]
        at = next(i for i, (_, p) in enumerate(order) if isinstance(p, str) and '"context.cancelled"' in p)
        later_audio = [
            p for _, p in order[at + 1 :] if isinstance(p, bytes) and HEADER.unpack_from(p)[2] == c["stream"]
        ]
        assert not later_audio
        assert_server_got_reports(web_server, reports_before, reports_for(log, c["id"]))
        record = web_server.received_events()
        if record is not None:
            assert [
                e for e in record if e["type"] == "context.cancel" and e["context_id"] == c["id"]
            ] == cancel
    finally:
        context.close()


def test_page_says_plainly_when_the_model_has_random_weights(chromium: Any, web_server: WebServer) -> None:
    context, page, _ = open_demo(chromium, web_server)
    try:
        random_weights = page.evaluate("() => vivace.randomWeights")
        notice = page.locator("#weights-notice")
        assert random_weights is True  # both the tiny model and the stand-in serve random weights
        assert notice.is_visible()
        assert "random weights" in notice.inner_text()
        assert "noise, not speech" in notice.inner_text()
    finally:
        context.close()


def test_every_control_is_labelled_and_the_keyboard_alone_can_speak_and_stop(
    chromium: Any, web_server: WebServer
) -> None:
    context, page, log = open_demo(chromium, web_server)
    try:
        unlabelled = page.evaluate(
            """() => [...document.querySelectorAll('input, select, textarea, button, canvas')]
                 .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                               && !(el.textContent || '').trim())
                 .map(el => el.id || el.outerHTML.slice(0, 60))"""
        )
        assert unlabelled == []
        page.fill("#text", LONG_TEXT)
        page.focus("#text")
        page.keyboard.press("Control+Enter")
        page.wait_for_function(f"() => ({CURRENT}?.renderedSamples || 0) > 2400", timeout=PAGE_TIMEOUT_MS)
        page.keyboard.press("Escape")
        page.wait_for_function("() => vivace.lastStop !== null", timeout=5_000)
        c = wait_finished(page)
        assert c["mode"] == "speak" and c["phase"] == "stopped"
        appends = [e for e in log.events("out") if e["type"] == "input_text.append"]
        assert [e["text"] for e in appends] == [LONG_TEXT]  # Speak sends the whole text at once
    finally:
        context.close()
