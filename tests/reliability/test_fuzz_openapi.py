"""Schemathesis drives every HTTP endpoint of `/openapi.json` against the tiny-model server.

For any request it generates from the published document (valid bodies, parameters and headers, and
invalid ones: wrong types, missing fields, bad query values, other methods): no 5xx but the documented
503s; every refusal is the documented JSON error (`components.schemas.Error`) with no traceback or path
in it; every response's content type is one the document lists for it; a 2xx of a synthesis endpoint
carries audio. Bounded by `max_examples` per operation and a test timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import content_type_conformance, response_schema_conformance

from gateway.openapi import document
from tests.gateway.helpers import REPO, GatewayProcess, start_gateway

DOCUMENTED_503 = {"engine_unavailable", "engine_died", "overloaded", "server_draining"}  # protocol.md 2.1
SYNTHESIS = ("/v1/audio/speech", "/tts/bytes", "/v1/text-to-speech/{voice_id}")
LEAKS = ("Traceback", 'File "', ".py", "site-packages")


@pytest.fixture(scope="module")
def server() -> Iterator[GatewayProcess]:
    gateway = start_gateway("--limit=max_text_chars=40", engine="real")  # short texts: fast syntheses
    yield gateway
    gateway.stop()


# Loaded from the code that serves `/openapi.json` (schemathesis' lazy `from_fixture` loader does not run under
# pytest 9); the test below checks that the server publishes exactly this document.
schema = schemathesis.openapi.from_dict(document())


def test_the_fuzzed_document_is_the_one_the_server_publishes(server: GatewayProcess) -> None:
    assert server.get("/openapi.json").json() == document()


@pytest.mark.timeout(300)
@schema.parametrize()
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
def test_no_request_the_document_allows_or_forbids_gets_an_undocumented_answer(
    case: schemathesis.Case, server: GatewayProcess
) -> None:
    response = case.call(base_url=server.http, timeout=60)
    status = response.status_code
    if status >= 400:
        request = case.as_curl_command()
        assert status < 500 or status == 503, (status, response.text[:300], request)
        error = response.json()["error"]
        assert isinstance(error["code"], str) and isinstance(error["message"], str) and error["message"]
        assert status < 500 or error["code"] in DOCUMENTED_503, (status, error, request)
        for leak in (*LEAKS, str(REPO)):
            assert leak not in response.text, (leak, response.text)
    elif case.operation.path.startswith(SYNTHESIS):
        assert response.content, f"{status} without audio"
    case.validate_response(response, checks=[response_schema_conformance, content_type_conformance])


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/audio/speech", {"input": "Hi.", "response_format": "pcm"}),
        ("/v1/text-to-speech/alloy", {"text": "Hi."}),
        ("/tts/bytes", {"transcript": "Hi."}),
    ],
)
def test_a_seed_outside_the_engines_64_bit_range_is_refused_and_its_largest_value_accepted(
    server: GatewayProcess, path: str, body: dict[str, Any]
) -> None:
    """Found by fuzzing: a negative seed failed to encode for the engine and answered 500."""
    refused = httpx.post(server.http + path, json={**body, "seed": -1}, timeout=60)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"] | {"message": ""} == {
        "code": "invalid_value",
        "param": "seed",
        "type": "invalid_request_error",
        "message": "",
    }
    largest = httpx.post(server.http + path, json={**body, "seed": 2**64 - 1}, timeout=60)
    assert largest.status_code == 200 and largest.content, largest.text


def test_the_routers_own_refusals_are_openai_errors_and_allow_names_the_routes_methods(
    server: GatewayProcess,
) -> None:
    """Found by fuzzing: 404/405 were plain text, and a 405 said `Allow: GET, HEAD` (the static mount's)."""
    wrong_method = httpx.request("OPTIONS", server.http + "/tts/bytes", timeout=10)
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"
    missing = httpx.get(server.http + "/v1/no-such-endpoint", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert httpx.get(server.http + "/", timeout=10).status_code == 200  # the demo page is still served
