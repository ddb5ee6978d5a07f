"""Property-based fuzzing of `POST /v1/audio/speech`: random bodies built from its documented fields.

Until the server publishes `/openapi.json` (then schemathesis can drive it), the fields come from
docs/protocol.md section 2.1. For any body: no 5xx but the documented 503s, a JSON error with a code for
every refusal, no traceback or path in it, and a 200 carries audio. Bounded by `max_examples`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.helpers import REPO, GatewayProcess, start_gateway

DOCUMENTED_503 = {"engine_unavailable", "engine_died", "overloaded", "server_draining"}
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.one_of(st.sampled_from(["tts-1", "tts-1-hd", "tiny"]), scalars),
    "input": st.one_of(
        st.text(min_size=0, max_size=80), st.sampled_from(["Hello.", "<|im_end|>", " "]), scalars
    ),
    "voice": st.one_of(
        st.sampled_from(["ryan", "alloy", "nobody"]), st.fixed_dictionaries({"id": scalars}), scalars
    ),
    "response_format": st.one_of(st.sampled_from(["pcm", "wav", "opus", "mp3", "flac"]), scalars),
    "stream_format": st.one_of(st.sampled_from(["audio", "sse", "chunks"]), scalars),
    "speed": st.one_of(st.sampled_from([1.0, 1, 0.5, 4.0]), scalars),
    "language": st.one_of(st.sampled_from(["English", "auto", "klingon"]), scalars),
    "seed": st.one_of(st.integers(-(2**70), 2**70), scalars),
    "instructions": st.one_of(st.text(max_size=40), scalars),
    "stream": scalars,
    "non_streaming_mode": scalars,
}
bodies = st.fixed_dictionaries({}, optional=FIELDS).map(lambda b: json.dumps(b).encode())


@pytest.fixture(scope="module")
def server() -> Iterator[GatewayProcess]:
    gateway = start_gateway("--limit=max_text_chars=400")
    yield gateway
    gateway.stop()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(bodies, st.binary(max_size=64)))
def test_any_body_gets_audio_or_a_clear_documented_error(server: GatewayProcess, body: bytes) -> None:
    response = httpx.post(
        server.http + "/v1/audio/speech",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    if response.status_code == 200:
        assert response.content, "200 without audio"
        return
    error = response.json()["error"]
    assert isinstance(error["code"], str) and isinstance(error["message"], str) and error["message"]
    assert response.status_code < 500 or (response.status_code == 503 and error["code"] in DOCUMENTED_503), (
        error
    )
    for leak in ("Traceback", 'File "', ".py", str(REPO), "site-packages"):
        assert leak not in response.text, (leak, response.text)
