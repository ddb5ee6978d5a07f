"""The demo page's saved voices in headless Chromium, against the real gateway storing voices for real:
an uploaded WAV (and a reference recorded from Chromium's fake microphone) becomes a saved voice the page
lists and offers to speak with, the server's refusal is shown in its own words, the API key applies to
every voice request, and Delete removes the voice from the server and the list.

The server is `python -m gateway --model tiny-base --fake-engine --voices-dir DIR --api-key KEY`: the
gateway's real voice endpoints and `engine.voice_tool` (tiny Base preset, on the CPU); the fake engine
only stands in for generation, which these tests do not judge (they check the page asks for the saved
voice by name).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.browser.conftest import WebServer, free_port, serve

pytestmark = [pytest.mark.browser, pytest.mark.slow]

API_KEY = "demo-voices-key"
SAVE_TIMEOUT_MS = 120_000  # the voice tool loads the tiny encoders and runs them on a shared CPU
READY_TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def voices_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    voices_dir = tmp_path_factory.mktemp("voices")
    port = free_port()
    command = [sys.executable, "-m", "gateway", "--model", "tiny-base", "--fake-engine", "--port", str(port),
               "--voices-dir", str(voices_dir), "--api-key", API_KEY]  # fmt: skip
    yield from serve("gateway-fake-engine", command, "browser-voices-server.log", READY_TIMEOUT_S)


def server_voice(server: WebServer, name: str) -> tuple[int, dict[str, Any]]:
    """GET /v1/audio/voices/{name} with the key, straight from the server (not through the page)."""
    request = urllib.request.Request(f"{server.base_url}/v1/audio/voices/{name}",
                                     headers={"Authorization": f"Bearer {API_KEY}"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def write_wav(path: Path, seconds: float = 1.5, rate: int = 16000) -> Path:
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 180 * t) * np.sin(2 * np.pi * 3 * t) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return path


def open_page(browser: Any, server: WebServer) -> tuple[Any, Any, list[str], list[dict[str, Any]]]:
    context = browser.new_context(viewport={"width": 1280, "height": 1400})
    page = context.new_page()
    errors: list[str] = []
    sent: list[dict[str, Any]] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on(
        "websocket",
        lambda ws: ws.on("framesent", lambda p: sent.append(json.loads(p)) if isinstance(p, str) else None),
    )
    page.goto(server.base_url + "/")
    page.wait_for_function("() => window.vivace && window.vivace.voicePanel")
    return context, page, errors, sent


def wait_status(page: Any, text: str, timeout: float = SAVE_TIMEOUT_MS) -> str:
    page.wait_for_function("(t) => document.getElementById('voice-status').textContent.includes(t)", arg=text,
                           timeout=timeout)  # fmt: skip
    return page.locator("#voice-status").inner_text()


def listed(page: Any) -> list[str]:
    return page.eval_on_selector_all("#voice-list li", "items => items.map(i => i.dataset.voice)")


def test_an_uploaded_wav_is_listed_spoken_with_by_name_and_deleted(
    chromium: Any, voices_server: WebServer, tmp_path: Path
) -> None:
    context, page, errors, sent = open_page(chromium, voices_server)
    try:
        # Without the key the list is refused, in the server's words.
        assert "missing or wrong API key" in wait_status(page, "Could not list the saved voices", 30_000)
        page.click("summary:has-text('Connection')")
        page.fill("#api-key", API_KEY)
        page.dispatch_event("#api-key", "change")
        page.wait_for_function(
            "() => window.vivace.voicePanel.listed >= 1 && !window.vivace.voicePanel.error"
        )
        assert listed(page) == [] and page.locator("#voice-empty").is_visible()

        # A refusal shows the server's message: a file that is not audio.
        junk = tmp_path / "noise.mp3"
        junk.write_bytes(b"definitely not audio" * 50)
        page.fill("#voice-name", "junk")
        page.set_input_files("#voice-file", str(junk))
        page.click("#voice-save")
        assert "cannot read the reference audio" in wait_status(page, "Could not save junk")
        assert page.locator("#voice-status").get_attribute("data-kind") == "error"
        assert server_voice(voices_server, "junk")[0] == 404

        # An upload with a transcript becomes a saved voice, listed with its duration.
        page.fill("#voice-name", "demo-voice")
        page.set_input_files("#voice-file", str(write_wav(tmp_path / "reference.wav")))
        page.fill("#voice-transcript", "A short reference.")
        page.click("#voice-save")
        wait_status(page, "Saved demo-voice.")
        page.wait_for_function("() => window.vivace.savedVoices.includes('demo-voice')")
        assert listed(page) == ["demo-voice"]
        item = page.locator('#voice-list li[data-voice="demo-voice"]').inner_text()
        assert "1.5 s" in item and "A short reference." in item
        status, info = server_voice(voices_server, "demo-voice")
        assert status == 200 and info["transcript"] == "A short reference." and info["in_context"] is True
        assert info["duration_s"] == pytest.approx(1.5) and info["model_id"] == "tiny-base"
        saved_group = page.eval_on_selector_all(
            "#voice optgroup[label='Saved voices'] option", "os => os.map(o => o.value)"
        )
        assert saved_group == ["demo-voice"]

        # Picking it makes the page speak with the saved voice's name as the voice.
        page.click('#voice-list li[data-voice="demo-voice"] button:has-text("Speak with it")')
        assert page.eval_on_selector("#voice", "s => s.value") == "demo-voice"
        page.click("#speak")
        page.wait_for_function("() => window.vivace.lastContextId !== null", timeout=30_000)
        deadline = time.monotonic() + 10
        while not any(e["type"] == "context.create" for e in sent):
            assert time.monotonic() < deadline, "no context.create sent"
            page.wait_for_timeout(50)
        assert next(e for e in sent if e["type"] == "context.create")["voice"] == "demo-voice"

        # Delete removes it from the server and from the page.
        page.click('#voice-list li[data-voice="demo-voice"] button:has-text("Delete")')
        wait_status(page, "Deleted demo-voice.")
        page.wait_for_function("() => !window.vivace.savedVoices.includes('demo-voice')")
        assert listed(page) == [] and server_voice(voices_server, "demo-voice")[0] == 404
        assert page.eval_on_selector_all("#voice optgroup", "gs => gs.length") == 0
        assert not errors, errors
    finally:
        context.close()


def test_a_reference_recorded_from_the_microphone_becomes_a_saved_voice(
    chromium_with_microphone: Any, voices_server: WebServer
) -> None:
    context, page, errors, _ = open_page(chromium_with_microphone, voices_server)
    try:
        page.click("summary:has-text('Connection')")
        page.fill("#api-key", API_KEY)
        page.click("#voice-record")
        wait_status(page, "Recording", 10_000)
        page.wait_for_timeout(1800)  # the fake microphone's beeps; at least 1 s is needed
        page.click("#voice-record")
        wait_status(page, "Recorded.", 10_000)
        assert page.locator("#voice-preview").is_visible()
        assert "your recording" in page.locator("#voice-reference").inner_text()
        page.fill("#voice-name", "mic-voice")
        page.click("#voice-save")
        wait_status(page, "Saved mic-voice.")
        page.wait_for_function("() => window.vivace.savedVoices.includes('mic-voice')")
        status, info = server_voice(voices_server, "mic-voice")
        assert status == 200 and info["transcript"] is None and 1.0 <= info["duration_s"] <= 5.0
        page.click('#voice-list li[data-voice="mic-voice"] button:has-text("Delete")')
        wait_status(page, "Deleted mic-voice.")
        assert server_voice(voices_server, "mic-voice")[0] == 404
        assert not errors, errors
    finally:
        context.close()
