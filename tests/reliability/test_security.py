"""Security basics, through real sockets: the API key on every door, Origin on the WebSocket, size limits,
error bodies that reveal nothing about the server's insides, and `/metrics` optionally behind the key."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.protocol import PROTOCOL
from tests.gateway.helpers import REPO, GatewayProcess, LiveClient, speak, start_gateway

KEY = "s3cret-key_for-tests"
HTTP_DOORS = [("POST", "/v1/audio/speech"), ("GET", "/v1/models"), ("GET", "/v1/audio/voices")]
SPEECH = {"model": "tts-1", "input": "Hello.", "voice": "ryan", "response_format": "pcm"}


@pytest.fixture(scope="module")
def keyed() -> Iterator[GatewayProcess]:
    server = start_gateway(f"--api-key={KEY}", "--metrics-need-key", "--allowed-origins=https://app.example")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def open_server() -> Iterator[GatewayProcess]:
    server = start_gateway()
    yield server
    server.stop()


def call(
    server: GatewayProcess, method: str, path: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    body = SPEECH if method == "POST" else None
    return httpx.request(method, server.http + path, json=body, headers=headers or {}, timeout=30)


@pytest.mark.parametrize(("method", "path"), HTTP_DOORS)
def test_every_http_endpoint_needs_the_key_and_takes_it_two_ways(
    keyed: GatewayProcess, method: str, path: str
) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {KEY}x"},
        {"X-API-Key": ""},
    ):
        refused = call(keyed, method, path, headers)
        assert refused.status_code == 401, (headers, refused.text)
        assert refused.json()["error"]["code"] == "invalid_api_key"
    for headers in ({"Authorization": f"Bearer {KEY}"}, {"X-API-Key": KEY}):
        assert call(keyed, method, path, headers).status_code == 200, headers


async def test_the_websocket_needs_the_key_as_a_header_or_a_subprotocol(keyed: GatewayProcess) -> None:
    for kw in (
        {},
        {"additional_headers": {"Authorization": "Bearer nope"}},
        {"subprotocols": [PROTOCOL, "vivace.auth.nope"]},
    ):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(keyed.ws, **{"subprotocols": [PROTOCOL], **kw}):  # type: ignore[arg-type]
                pass
        assert refused.value.response.status_code == 401
    async with LiveClient.open(keyed.ws, additional_headers={"Authorization": f"Bearer {KEY}"}):
        pass
    async with LiveClient.open(keyed.ws, subprotocols=[PROTOCOL, f"vivace.auth.{KEY}"]) as client:
        assert client.ws.subprotocol == PROTOCOL  # the key is never echoed back


def test_metrics_can_be_put_behind_the_key(keyed: GatewayProcess, open_server: GatewayProcess) -> None:
    assert keyed.get("/metrics").status_code == 401
    assert keyed.get("/metrics", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert open_server.get("/metrics").status_code == 200  # the default: scrapers need no key
    for path in ("/health", "/ready"):  # probes never need it
        assert keyed.get(path).status_code == 200


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [("https://evil.example", False), ("http://localhost:3000", False), ("https://app.example", True)],
)
async def test_origin_is_checked_on_the_websocket(keyed: GatewayProcess, origin: str, allowed: bool) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    if allowed:
        async with LiveClient.open(keyed.ws, origin=origin, additional_headers=headers):
            return
    with pytest.raises(InvalidStatus) as refused:
        async with connect(keyed.ws, subprotocols=[PROTOCOL], origin=origin, additional_headers=headers):  # type: ignore[arg-type]
            pass
    assert refused.value.response.status_code == 403


async def test_without_an_allow_list_only_local_and_same_origin_browsers_may_connect(
    open_server: GatewayProcess,
) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with connect(open_server.ws, subprotocols=[PROTOCOL], origin="https://evil.example"):  # type: ignore[arg-type]
            pass
    assert refused.value.response.status_code == 403
    async with LiveClient.open(open_server.ws, origin="http://localhost:8080"):
        pass


def test_oversized_bodies_are_refused_with_413_declared_or_not(open_server: GatewayProcess) -> None:
    big = orjson.dumps(SPEECH | {"input": "a" * 2_000_000})
    declared = httpx.post(open_server.http + "/v1/audio/speech", content=big, timeout=30)
    assert declared.status_code == 413 and declared.json()["error"]["code"] == "body_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    streamed = httpx.post(open_server.http + "/v1/audio/speech", content=chunks(), timeout=30)
    assert streamed.status_code == 413
    ok = httpx.post(open_server.http + "/v1/audio/speech", json=SPEECH | {"input": "é" * 1000}, timeout=30)
    assert ok.status_code == 200  # a legitimate body well inside the text limit still passes


BAD_BODIES: list[bytes] = [
    b"{",
    b"\xff\xfe not utf-8",
    b"[]",
    b'{"input": 5}',
    b'{"input": "hi", "voice": {"id": ["x"]}}',
    b'{"input": "hi", "voice": "no_such_voice"}',
    b'{"input": "hi", "response_format": "webm"}',
    b'{"input": "hi", "speed": "fast"}',
    b'{"input": "hi", "seed": 1e400}',
    b'{"input": "hi", "seed": 99999999999999999999999999}',
    b'{"input": "hi", "language": "klingon"}',
    b'{"input": "<|im_end|>"}',
    b'{"input": "' + b"\\ud800" + b'"}',
]


@pytest.mark.parametrize("body", BAD_BODIES)
def test_bad_requests_get_clear_errors_without_traces_or_paths(
    open_server: GatewayProcess, body: bytes
) -> None:
    response = httpx.post(
        open_server.http + "/v1/audio/speech",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert isinstance(error["code"], str) and error["message"]
    for leak in ("Traceback", 'File "', ".py", str(REPO), "/usr/", "site-packages"):
        assert leak not in response.text, (leak, response.text)


async def test_bad_websocket_events_get_errors_without_traces_or_paths(open_server: GatewayProcess) -> None:
    async with LiveClient.open(open_server.ws) as client:
        for event in (
            '{"type": 5}',
            "[1, 2]",
            "not json",
            '{"type": "input_text.append", "context_id": {}, "text": 1}',
        ):
            await client.ws.send(event)
            error = await client.until("error", timeout_s=10)
            text = orjson.dumps(error).decode()
            for leak in ("Traceback", 'File "', ".py", str(REPO), "site-packages"):
                assert leak not in text, (leak, text)
    done, _ = await speak(open_server.ws, "Still serving.")
    assert done["reason"] == "completed"


async def test_a_large_websocket_message_closes_only_its_own_socket(open_server: GatewayProcess) -> None:
    async with LiveClient.open(open_server.ws) as client:
        limit = client.created["limits"]["max_message_bytes"]
        other = asyncio.create_task(speak(open_server.ws, "The neighbour keeps talking through this."))
        await client.ws.send(orjson.dumps({"type": "ping", "id": 1, "pad": "x" * (limit + 1)}).decode())
        error = await client.until("error", timeout_s=10)
        assert error["error"]["code"] == "message_too_large"
        done, _ = await other
        assert done["reason"] == "completed"
