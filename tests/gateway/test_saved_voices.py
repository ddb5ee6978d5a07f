"""Speaking with saved voices: a real gateway and the real engine on `--model tiny-base --device cpu
--voices-dir DIR` (one server for the module). A voice saved with `POST /v1/audio/voices` is what `voice`
names on every route (OpenAI HTTP, the native WebSocket, ElevenLabs and Cartesia), the listing shows it, an
OpenAI voice name works once a voice carries it, and names that are not saved are refused clearly, as are
instructions (a Base model takes none), by the gateway before any engine sees them. The saved voices:
`my-voice` and `alloy` (the test before the last deletes `alloy`)."""

from __future__ import annotations

import asyncio
import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
from websockets.asyncio.client import connect

from tests.gateway.helpers import GatewayProcess, LiveClient, expected_samples, speak, start_gateway

TEXT = "A saved voice speaks."


def _wav(hz: float, seconds: float = 1.5, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.4 * np.sin(2 * np.pi * hz * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t)) * 32767 / 1.5).astype("<i2")
    path = Path("/dev/shm" if Path("/dev/shm").is_dir() else "/tmp") / f"vivace-saved-{hz}.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    data = path.read_bytes()
    path.unlink()
    return data


def _save(server: GatewayProcess, name: str, hz: float) -> httpx.Response:
    return httpx.post(server.http + "/v1/audio/voices", data={"name": name},
                      files={"audio": ("ref.wav", _wav(hz), "audio/wav")}, timeout=180)  # fmt: skip


def _pcm(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.frombuffer(response.content, "<i2").astype(np.int32)


def _openai(server: GatewayProcess, **body: object) -> httpx.Response:
    return httpx.post(server.http + "/v1/audio/speech", timeout=120,
                      json={"model": "tts-1", "input": TEXT, "response_format": "pcm", **body})  # fmt: skip


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    voices = tmp_path_factory.mktemp("voices")
    server = start_gateway("--model", "tiny-base", "--voices-dir", str(voices), engine="real")
    try:
        for name, hz in (("my-voice", 180.0), ("alloy", 90.0)):
            saved = _save(server, name, hz)
            assert saved.status_code == 201, saved.text
        yield server
    finally:
        server.stop()


def test_a_saved_voice_speaks_over_openai_http_the_native_websocket_elevenlabs_and_cartesia(
    base: GatewayProcess,
) -> None:
    samples = expected_samples(len(TEXT))
    openai = _openai(base, voice="my-voice", seed=7)
    assert openai.status_code == 200, openai.text
    assert len(openai.content) == samples * 2 and np.abs(np.frombuffer(openai.content, "<i2")).max() > 0
    spoken = _pcm(openai)
    again = _pcm(_openai(base, voice={"id": "My-Voice"}, seed=7))  # the same voice and seed: the same tokens
    other = _pcm(_openai(base, voice="alloy", seed=7))  # another voice, the same seed: other speech
    same_gap, other_gap = np.abs(spoken - again).mean(), np.abs(spoken - other).mean()
    assert np.abs(spoken - again).max() <= 4 and other_gap > 20 * max(same_gap, 1.0)  # codec float noise only

    done, client = asyncio.run(speak(base.ws, TEXT, voice="my-voice"))
    assert done["reason"] == "completed" and len(client.audio(1)) == samples * 2

    eleven = httpx.post(base.http + "/v1/text-to-speech/my-voice?output_format=pcm_24000", json={"text": TEXT},
                        timeout=120)  # fmt: skip
    assert eleven.status_code == 200 and len(eleven.content) == samples * 2, eleven.text

    cartesia = httpx.post(base.http + "/tts/bytes", timeout=120, json={
        "transcript": TEXT, "voice": {"mode": "id", "id": "my-voice"},
        "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}})  # fmt: skip
    assert cartesia.status_code == 200 and len(cartesia.content) == samples * 2, cartesia.text


def test_the_listing_and_the_session_offer_the_saved_voices_of_the_served_model(base: GatewayProcess) -> None:
    listing = base.get("/v1/audio/voices").json()
    assert listing["voice_kind"] == "saved" and listing["voices"] == listing["saved_voices"]
    assert listing["voices"] == ["alloy", "my-voice"] and listing["openai_aliases"] == {"alloy": "alloy"}
    assert "ryan" not in listing["voices"] and "auto" in listing["languages"]

    async def session() -> dict:
        async with LiveClient.open(base.ws) as client:
            return client.created

    created = asyncio.run(session())
    assert created["voices"] == ["alloy", "my-voice"] and created["defaults"]["voice"] is None


def test_names_that_are_not_saved_voices_are_refused_with_unknown_voice_or_missing_voice(
    base: GatewayProcess,
) -> None:
    for body, code in (({"voice": "nobody"}, "unknown_voice"), ({"voice": "ryan"}, "unknown_voice"),
                       ({}, "missing_voice")):  # fmt: skip
        error = _openai(base, **body)
        assert error.status_code == 400 and error.json()["error"]["code"] == code, (body, error.text)
        assert error.json()["error"]["param"] == "voice" and "my-voice" in error.json()["error"]["message"]

    async def native() -> list[dict]:
        async with LiveClient.open(base.ws) as client:
            await client.send(type="context.create", context_id="a", voice="nobody")
            unknown = await client.until("error")
            await client.send(type="input_text.append", context_id="b", text="No voice named.")
            missing = await client.until("error")
            await client.send(type="session.update", voice="my-voice")
            updated = await client.until("session.updated")
            return [unknown, missing, updated]

    unknown, missing, updated = asyncio.run(native())
    assert unknown["error"]["code"] == "unknown_voice" and missing["error"]["code"] == "missing_voice"
    assert updated["voice"] == "my-voice"

    eleven = httpx.post(base.http + "/v1/text-to-speech/nobody", json={"text": TEXT}, timeout=30)
    assert eleven.status_code == 400 and eleven.json()["error"]["code"] == "unknown_voice", eleven.text

    async def cartesia() -> dict:
        async with connect(f"ws://127.0.0.1:{base.port}/tts/websocket") as ws:
            await ws.send(orjson.dumps({"context_id": "c", "transcript": TEXT, "continue": False,
                                        "voice": {"id": "nobody"}}).decode())  # fmt: skip
            return orjson.loads(await asyncio.wait_for(ws.recv(), 30))

    assert asyncio.run(cartesia())["error_code"] == "unknown_voice"


def test_a_saved_voice_named_alloy_serves_openai_clients_and_a_deleted_voice_is_refused_at_once(
    base: GatewayProcess,
) -> None:
    nova = _openai(base, voice="nova")
    assert nova.status_code == 400 and nova.json()["error"]["code"] == "unknown_voice"  # no built-in to map onto
    spoken = _openai(base, voice="alloy")
    assert spoken.status_code == 200 and len(spoken.content) == expected_samples(len(TEXT)) * 2
    assert httpx.delete(base.http + "/v1/audio/voices/alloy").status_code == 200
    gone = _openai(base, voice="alloy")
    assert gone.status_code == 400 and gone.json()["error"]["code"] == "unknown_voice"
    assert base.get("/v1/audio/voices").json()["voices"] == ["my-voice"]


def test_instructions_are_refused_up_front_because_a_base_model_takes_none(base: GatewayProcess) -> None:
    error = _openai(base, voice="my-voice", instructions="Speak slowly.")
    assert error.status_code == 400 and error.json()["error"]["code"] == "instructions_not_supported", error.text
    assert error.json()["error"]["param"] == "instructions" and "Base model" in error.json()["error"]["message"]
    assert _openai(base, voice="my-voice", instructions="").status_code == 200  # empty: none given

    async def native() -> list[dict]:
        async with LiveClient.open(base.ws) as client:
            await client.send(type="session.update", voice="my-voice", instructions="Speak slowly.")
            update = await client.until("error")
            await client.send(type="context.create", context_id="a", voice="my-voice", instructions="Whisper.")
            create = await client.until("error")
            await client.send(type="session.update", voice="my-voice", instructions="")
            updated = await client.until("session.updated")
            return [update, create, updated]

    update, create, updated = asyncio.run(native())
    assert update["error"]["code"] == create["error"]["code"] == "instructions_not_supported"
    assert create["context_id"] == "a" and updated["instructions"] == "" and updated["voice"] == "my-voice"


def test_a_voice_saved_with_a_transcript_speaks_in_context_over_http(base: GatewayProcess) -> None:
    # The same recording saved with and without a transcript: the same x-vector, so only the in-context prompt
    # (transcript + reference codes) can make the same seed speak differently.
    told = httpx.post(base.http + "/v1/audio/voices", data={"name": "told", "transcript": "A test tone."},
                      files={"audio": ("ref.wav", _wav(140.0), "audio/wav")}, timeout=180)  # fmt: skip
    plain = httpx.post(base.http + "/v1/audio/voices", data={"name": "plain"},
                       files={"audio": ("ref.wav", _wav(140.0), "audio/wav")}, timeout=180)  # fmt: skip
    try:
        assert told.status_code == 201 and plain.status_code == 201, (told.text, plain.text)
        assert told.json()["in_context"] is True
        spoken = _openai(base, voice="told", seed=3)
        assert len(spoken.content) == expected_samples(len(TEXT)) * 2
        in_context, again = _pcm(spoken), _pcm(_openai(base, voice="told", seed=3))
        x_vector = _pcm(_openai(base, voice="plain", seed=3))
        assert np.abs(in_context).max() > 0 and np.abs(in_context - again).max() <= 4
        assert np.abs(in_context - x_vector).mean() > 20 * max(np.abs(in_context - again).mean(), 1.0)
    finally:
        for name in ("told", "plain"):
            httpx.delete(base.http + f"/v1/audio/voices/{name}", timeout=30)
