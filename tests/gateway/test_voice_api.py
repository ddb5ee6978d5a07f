"""Saved voices over HTTP: `POST /v1/audio/voices` (multipart) stores a voice that `engine.voice_tool`
computed, `GET /v1/audio/voices/{name}` reads it, `DELETE` removes it, all behind --api-key; refusals are
OpenAI-shaped errors with a `voice_*` code. The gateway runs the fake engine on `--model tiny-base` (a Base
model: no built-in speakers), so the voice tool computes with the tiny Base model. (A name
may not take a built-in speaker's, which a Base model has none of: engine/voice_store.check_name's tests.)"""

from __future__ import annotations

import wave
from pathlib import Path

import httpx
import numpy as np

from engine.voice_store import VoiceStore
from tests.gateway.helpers import start_gateway

KEY = {"Authorization": "Bearer s3cret"}


def _wav(seconds: float = 1.2, rate: int = 16000) -> bytes:
    path = Path("/dev/shm" if Path("/dev/shm").is_dir() else "/tmp") / f"vivace-voice-{seconds}.wav"
    t = np.arange(int(seconds * rate)) / rate
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((0.4 * np.sin(2 * np.pi * 150 * t) * 32767).astype("<i2").tobytes())
    data = path.read_bytes()
    path.unlink()
    return data


def test_a_voice_is_uploaded_read_listed_and_deleted_behind_the_api_key(tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    server = start_gateway("--model", "tiny-base", "--voices-dir", str(voices), "--api-key", "s3cret", engine="fake")
    try:
        url = server.http + "/v1/audio/voices"

        def post(name: str, audio: bytes, headers: dict = KEY, **fields: str) -> httpx.Response:
            return httpx.post(url, data={"name": name, **fields}, files={"audio": ("ref.wav", audio, "audio/wav")},
                              headers=headers, timeout=120)  # fmt: skip

        wav = _wav()
        assert post("alloy", wav, headers={}).status_code == 401
        created = post("alloy", wav, transcript="A low hum.")
        assert created.status_code == 201, created.text
        body = created.json()
        assert body["name"] == "alloy" and body["model_id"] == "tiny-base" and body["in_context"] is True
        assert body["sample_rate"] == 16000 and abs(body["duration_s"] - 1.2) < 1e-6
        info, embedding, codes = VoiceStore(voices).tensors("alloy")  # what the engines will read
        assert embedding.shape == (64,) and codes is not None and info.transcript == "A low hum."

        got = httpx.get(url + "/alloy", headers=KEY)
        assert got.status_code == 200 and got.json() == body
        # The fake engine serves `tiny-base` as a Base model (no built-in speakers): its voices are the saved ones.
        assert httpx.get(url, headers=KEY).json()["saved_voices"] == ["alloy"]

        refusals = {
            "voice_exists": (409, post("alloy", wav)),
            "voice_bad_name": (400, post("Not OK", wav)),
            "voice_bad_audio": (400, post("junk", b"not audio at all" * 50)),
            "voice_too_short": (400, post("short", _wav(0.3))),
        }
        for code, (status, response) in refusals.items():
            assert response.status_code == status and response.json()["error"]["code"] == code, (code, response.text)
        no_audio = httpx.post(url, data={"name": "x"}, headers=KEY).json()["error"]
        assert no_audio["code"] == "missing_field" and no_audio["param"] == "audio"

        assert httpx.delete(url + "/alloy").status_code == 401
        deleted = httpx.delete(url + "/alloy", headers=KEY)
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
        assert httpx.get(url + "/alloy", headers=KEY).json()["error"]["code"] == "voice_not_found"
        assert httpx.delete(url + "/alloy", headers=KEY).status_code == 404
        assert VoiceStore(voices).names() == []
    finally:
        server.stop()


def test_without_a_voices_dir_saved_voices_are_off() -> None:
    server = start_gateway(engine="fake")
    try:
        response = httpx.post(server.http + "/v1/audio/voices", data={"name": "a"},
                              files={"audio": ("a.wav", b"x", "audio/wav")})  # fmt: skip
        assert response.status_code == 404 and response.json()["error"]["code"] == "voices_disabled"
        assert server.get("/v1/audio/voices").json()["saved_voices"] == []
    finally:
        server.stop()


def test_a_model_that_does_not_clone_refuses_an_upload_before_reading_its_audio(tmp_path: Path) -> None:
    """CustomVoice (the fake engine's tiny model): `voice_wrong_model` from the gateway itself. The bytes are not
    audio, so a voice tool started on them would have answered `voice_bad_audio` instead."""
    server = start_gateway("--voices-dir", str(tmp_path / "voices"), engine="fake")
    try:
        response = httpx.post(server.http + "/v1/audio/voices", data={"name": "mine"},
                              files={"audio": ("a.wav", b"not audio", "audio/wav")}, timeout=60)  # fmt: skip
        error = response.json()["error"]
        assert response.status_code == 400 and error["code"] == "voice_wrong_model", response.text
        assert "only Base checkpoints clone voices" in error["message"]
        assert not any((tmp_path / "voices").glob("mine*"))
    finally:
        server.stop()
