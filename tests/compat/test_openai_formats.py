"""Every OpenAI `response_format`, streamed through the official SDK, decodes at the expected rate."""

from __future__ import annotations

import io

import av
import httpx
import openai
import pytest

from tests.gateway.helpers import GatewayProcess, expected_samples

TEXT = "Every format streams."
SECONDS = expected_samples(len(TEXT)) / 24000


@pytest.fixture(scope="module")
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.http + "/v1", api_key="unused", max_retries=0)


def speak(client: openai.OpenAI, **fields: object) -> tuple[bytes, str, int]:
    """Body, content type, and how many non-empty pieces the body arrived in."""
    with client.audio.speech.with_streaming_response.create(
        model="tts-1",
        voice="alloy",
        input=TEXT,
        **fields,  # type: ignore[arg-type]
    ) as response:
        pieces = [p for p in response.iter_bytes(64) if p]
        return b"".join(pieces), response.headers["content-type"], len(pieces)


@pytest.mark.parametrize(
    ("fields", "media_type", "rate"),
    [
        ({}, "audio/mpeg", 24000),  # mp3 is the default, as at OpenAI
        ({"response_format": "aac"}, "audio/aac", 24000),
        ({"response_format": "flac"}, "audio/flac", 24000),
        ({"response_format": "opus"}, "audio/ogg", 48000),
        ({"response_format": "mp3", "extra_body": {"sample_rate": 44100}}, "audio/mpeg", 44100),
        ({"response_format": "wav", "extra_body": {"sample_rate": 8000}}, "audio/wav", 8000),
    ],
)
def test_each_response_format_decodes_to_the_whole_utterance(
    client: openai.OpenAI, fields: dict, media_type: str, rate: int
) -> None:
    body, content_type, _ = speak(client, **fields)
    assert content_type == media_type
    with av.open(io.BytesIO(body)) as container:
        frames = list(container.decode(audio=0))
    assert frames[0].sample_rate == rate
    decoded = sum(f.samples for f in frames) / rate
    assert SECONDS - 0.002 <= decoded <= SECONDS + 0.15  # codec priming and padding only


def test_pcm_at_another_rate_and_bad_rates_are_refused(
    client: openai.OpenAI, gateway: GatewayProcess
) -> None:
    pcm, content_type, _ = speak(client, response_format="pcm", extra_body={"sample_rate": 16000})
    assert content_type == "audio/pcm" and abs(len(pcm) // 2 - round(SECONDS * 16000)) <= 2
    for fields in ({"sample_rate": 11025}, {"sample_rate": 16000, "response_format": "opus"}):
        response = httpx.post(
            gateway.http + "/v1/audio/speech", json={"model": "tts-1", "input": TEXT, **fields}, timeout=10
        )
        assert response.status_code == 400 and response.json()["error"]["code"] == "unsupported_sample_rate"
