"""The demo page with a VoiceDesign model, in headless Chromium against the real gateway: there is no voice
to pick, the instructions field becomes the required voice description, Speak without one says so (and
sends nothing), and with one the page asks for it as the context's instructions and plays the answer.

The server is `python -m gateway --model tiny-voice-design --fake-engine`: the gateway's real session and
voice resolution for a VoiceDesign model; the fake engine stands in for generation (a tone).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.conftest import WebServer, free_port, serve

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def design_server() -> Iterator[WebServer]:
    port = free_port()
    command = [sys.executable, "-m", "gateway", "--model", "tiny-voice-design", "--fake-engine", "--port", str(port)]
    yield from serve("gateway-fake-engine", command, "browser-voice-design-server.log", 90.0)


def test_a_voicedesign_model_speaks_with_the_described_voice_and_asks_for_one(
    chromium: Any, design_server: WebServer
) -> None:
    context = chromium.new_context(viewport={"width": 1280, "height": 1400})
    page = context.new_page()
    errors: list[str] = []
    sent: list[dict[str, Any]] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("websocket", lambda ws: ws.on(
        "framesent", lambda p: sent.append(json.loads(p)) if isinstance(p, str) else None))  # fmt: skip
    try:
        page.goto(design_server.base_url + "/")
        page.wait_for_function("() => window.vivace && window.vivace.voiceKind === 'described'", timeout=30_000)
        assert not page.locator("#voice").is_visible()
        assert page.locator("#instructions-label").inner_text() == "Voice description (required)"
        assert page.eval_on_selector("#instructions", "i => i.required") is True

        page.click("#speak")
        page.wait_for_function(
            "() => document.getElementById('status').textContent.includes('Describe the voice first')")
        assert not [e for e in sent if e["type"] == "context.create"]

        page.fill("#instructions", "A calm, low voice, speaking slowly.")
        page.click("#speak")
        page.wait_for_function(
            "() => window.vivace.events.some(e => e.type === 'context.done' && e.reason === 'completed')",
            timeout=30_000)  # fmt: skip
        created = [e for e in sent if e["type"] == "context.create"]
        assert len(created) == 1 and created[0]["instructions"] == "A calm, low voice, speaking slowly."
        assert "voice" not in created[0]
        assert not [e for e in page.evaluate("() => window.vivace.errors")], "the server refused the request"
        assert not errors, errors
    finally:
        context.close()
