"""Speaking with a described voice: a real gateway and the real engine on `--model tiny-voice-design --device
cpu --voices-dir DIR` (one server for the module). The voice description is the request's `instructions`
(OpenAI HTTP; the native WebSocket's `session.update` / `context.create`), required; `voice` is ignored;
streamed text works (the streaming prompt layout); the listing and `session.created` say the voice is
described, and no voice can be saved for it; a request without a description is refused with
`missing_instructions` on every route, the ElevenLabs and Cartesia routes included, which have no field to
carry one. Also: the fake engine announces a VoiceDesign preset as the real engine does."""

from __future__ import annotations

import asyncio
import io
import wave
from collections.abc import Iterator

import httpx
import numpy as np
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.gateway.helpers import GatewayProcess, LiveClient, expected_samples, start_gateway

TEXT = "A described voice speaks."
CALM = "A calm, low male voice."
BRIGHT = "A bright, fast young woman's voice; excited."


def _openai(server: GatewayProcess, **body: object) -> httpx.Response:
    return httpx.post(server.http + "/v1/audio/speech", timeout=120,
                      json={"model": "tts-1", "input": TEXT, "response_format": "pcm", **body})  # fmt: skip


def _pcm(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.frombuffer(response.content, "<i2").astype(np.int32)


def _wav(seconds: float = 1.5, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((0.3 * np.sin(2 * np.pi * 150 * t) * 32767).astype("<i2").tobytes())
    return out.getvalue()


@pytest.fixture(scope="module")
def design(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    voices = tmp_path_factory.mktemp("voices")
    server = start_gateway("--model", "tiny-voice-design", "--voices-dir", str(voices), engine="real")
    try:
        yield server
    finally:
        server.stop()


def test_a_described_voice_speaks_over_openai_http_in_both_layouts_and_ignores_the_voice(
    design: GatewayProcess,
) -> None:
    samples = expected_samples(len(TEXT))
    spoken = _pcm(_openai(design, instructions=CALM, seed=7))
    assert len(spoken) == samples and np.abs(spoken).max() > 0
    ignored = _pcm(_openai(design, instructions=CALM, seed=7, voice="no-such-voice"))  # the voice means nothing
    other = _pcm(_openai(design, instructions=BRIGHT, seed=7))  # another description, the same seed
    same_gap, other_gap = np.abs(spoken - ignored).mean(), np.abs(spoken - other).mean()
    assert np.abs(spoken - ignored).max() <= 4 and other_gap > 20 * max(same_gap, 1.0)  # codec float noise only
    whole = _pcm(_openai(design, instructions=CALM, seed=7, non_streaming_mode=True))
    assert len(whole) == samples


def test_a_described_voice_speaks_streamed_text_over_the_native_websocket(design: GatewayProcess) -> None:
    async def session() -> tuple[dict, dict, dict, LiveClient]:
        async with LiveClient.open(design.ws) as client:
            await client.send(type="session.update", instructions=CALM, voice="ryan")
            updated = await client.until("session.updated")
            for part in ("A described ", "voice ", "speaks."):  # text arrives in pieces
                await client.send(type="input_text.append", context_id="a", text=part)
            await client.send(type="input_text.end", context_id="a")
            first = await client.until("context.done", "a")
            await client.send(type="context.create", context_id="b", instructions=BRIGHT)
            await client.send(type="input_text.append", context_id="b", text=TEXT)
            await client.send(type="input_text.end", context_id="b")
            second = await client.until("context.done", "b")
            return updated, first, second, client

    updated, first, second, client = asyncio.run(session())
    assert updated["instructions"] == CALM and updated["voice"] is None
    samples = expected_samples(len(TEXT))
    assert first["reason"] == "completed" and len(client.audio(1)) == samples * 2
    assert second["reason"] == "completed" and len(client.audio(2)) == samples * 2


def test_the_listing_and_the_session_say_the_voice_is_described_by_instructions(design: GatewayProcess) -> None:
    listing = design.get("/v1/audio/voices").json()
    assert listing["voice_kind"] == "described" and listing["voices"] == [] and listing["saved_voices"] == []
    assert listing["openai_aliases"] == {} and "auto" in listing["languages"]
    saved = httpx.post(design.http + "/v1/audio/voices", data={"name": "my-voice"},
                       files={"audio": ("ref.wav", _wav(), "audio/wav")}, timeout=180)  # fmt: skip
    assert saved.status_code == 400 and saved.json()["error"]["code"] == "voice_wrong_model", saved.text

    async def session() -> dict:
        async with LiveClient.open(design.ws) as client:
            return client.created

    created = asyncio.run(session())
    assert created["voice_kind"] == "described" and created["voices"] == []
    assert created["defaults"]["voice"] is None and created["defaults"]["instructions"] == ""


def test_a_request_without_a_description_is_refused_with_missing_instructions_on_every_route(
    design: GatewayProcess,
) -> None:
    for body in ({}, {"instructions": "  "}, {"voice": "ryan"}):
        error = _openai(design, **body)
        assert error.status_code == 400 and error.json()["error"]["code"] == "missing_instructions", error.text
        assert error.json()["error"]["param"] == "instructions" and "instructions" in error.json()["error"]["message"]

    async def native() -> list[dict]:
        async with LiveClient.open(design.ws) as client:
            await client.send(type="input_text.append", context_id="a", text=TEXT)
            implicit = await client.until("error")
            await client.send(type="context.create", context_id="b", voice="ryan")
            explicit = await client.until("error")
            await client.send(type="session.update", instructions=CALM)
            await client.until("session.updated")
            await client.send(type="session.update", instructions="")  # clearing the default is allowed
            cleared = await client.until("session.updated")
            await client.send(type="context.create", context_id="c")
            again = await client.until("error")
            return [implicit, explicit, cleared, again]

    implicit, explicit, cleared, again = asyncio.run(native())
    assert implicit["error"]["code"] == explicit["error"]["code"] == again["error"]["code"] == "missing_instructions"
    assert implicit["context_id"] == "a" and cleared["instructions"] == ""

    eleven = httpx.post(design.http + "/v1/text-to-speech/ryan", json={"text": TEXT}, timeout=30)
    assert eleven.status_code == 400 and eleven.json()["error"]["code"] == "missing_instructions", eleven.text
    assert "ElevenLabs requests cannot carry a description" in eleven.json()["error"]["message"]

    async def eleven_ws() -> InvalidStatus:
        with pytest.raises(InvalidStatus) as info:
            async with connect(f"ws://127.0.0.1:{design.port}/v1/text-to-speech/ryan/stream-input"):
                pass
        return info.value

    refused = asyncio.run(eleven_ws())
    assert refused.response.status_code == 400
    assert orjson.loads(refused.response.body)["error"]["code"] == "missing_instructions"

    cartesia = httpx.post(design.http + "/tts/bytes", timeout=30, json={
        "transcript": TEXT, "voice": {"mode": "id", "id": "ryan"},
        "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}})  # fmt: skip
    assert cartesia.status_code == 400 and cartesia.json()["error"]["code"] == "missing_instructions"
    assert "Cartesia requests cannot carry a description" in cartesia.json()["error"]["message"]

    async def cartesia_ws() -> dict:
        async with connect(f"ws://127.0.0.1:{design.port}/tts/websocket") as ws:
            await ws.send(orjson.dumps({"context_id": "c", "transcript": TEXT, "continue": False,
                                        "voice": {"id": "ryan"}}).decode())  # fmt: skip
            return orjson.loads(await asyncio.wait_for(ws.recv(), 30))

    assert asyncio.run(cartesia_ws())["error_code"] == "missing_instructions"


def test_the_fake_engine_announces_a_voice_design_preset_as_the_real_engine_does() -> None:
    server = start_gateway("--model", "tiny-voice-design", engine="fake")
    try:
        listing = server.get("/v1/audio/voices").json()
        assert listing["voice_kind"] == "described" and listing["voices"] == []
        assert _openai(server).json()["error"]["code"] == "missing_instructions"
        assert len(_pcm(_openai(server, instructions=CALM))) == expected_samples(len(TEXT))
    finally:
        server.stop()
