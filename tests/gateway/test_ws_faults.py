"""Bad input, limits and faults on the WebSocket: each gets its documented error or close code, and a
healthy session running at the same time on the same gateway still completes."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.protocol import PROTOCOL
from tests.gateway.helpers import GatewayProcess, LiveClient, expected_samples, speak, start_gateway

HEALTHY_TEXT = "A healthy neighbour keeps talking while another client misbehaves. " * 3
LIMITS = {
    "max_contexts": 2,
    "max_text_chars": 300,
    "appends_per_second": 20,
    "append_burst": 5,
    "idle_timeout_s": 1.5,
    "max_message_bytes": 2048,
    "slow_reader_grace_s": 1,
}


@pytest.fixture(scope="module")
def strict(engine_kind: str) -> Iterator[GatewayProcess]:
    args = [f"--limit={name}={value}" for name, value in LIMITS.items()]
    server = start_gateway(*args, engine=engine_kind, ms_per_frame=1.0)
    yield server
    server.stop()


async def alongside_healthy(gateway: GatewayProcess, fault: Callable[[], Awaitable[Any]]) -> Any:
    """Run `fault` while a healthy session speaks on another socket; the healthy one must complete."""
    healthy, result = await asyncio.gather(speak(gateway.ws, HEALTHY_TEXT), fault())
    done, _ = healthy
    assert done["reason"] == "completed" and done["samples"] == expected_samples(len(HEALTHY_TEXT))
    return result


async def expect_error(client: LiveClient, code: str) -> dict[str, Any]:
    event = await client.until("error", timeout_s=10)
    assert event["error"]["code"] == code, event
    assert event["error"]["message"]
    return event


async def expect_close(client: LiveClient, code: int) -> None:
    with pytest.raises(ConnectionClosed) as info:
        while True:
            await client.receive(timeout_s=10)
    assert info.value.rcvd is not None and info.value.rcvd.code == code, info.value


async def test_session_created_announces_the_limits(strict: GatewayProcess) -> None:
    async with LiveClient.open(strict.ws) as client:
        limits = client.created["limits"]
    for name, value in LIMITS.items():
        assert limits[name] == value


async def test_malformed_json_and_unknown_events_get_errors_and_the_socket_lives_on(
    strict: GatewayProcess,
) -> None:
    async def fault() -> None:
        async with LiveClient.open(strict.ws) as client:
            await client.ws.send("{not json")
            await expect_error(client, "invalid_json")
            await client.send(type="speak.louder", event_id="ev-1")
            assert (await expect_error(client, "unknown_event_type"))["event_id"] == "ev-1"
            await client.send(type="input_text.append", context_id="c", text=42, event_id="ev-2")
            event = await expect_error(client, "invalid_event")
            assert event["event_id"] == "ev-2" and "text" in event["error"]["message"]
            await client.ws.send("[1, 2]")
            await expect_error(client, "invalid_event")
            done, _ = await _speak_on(client, "still works")
            assert done["reason"] == "completed"

    await alongside_healthy(strict, fault)


async def _speak_on(
    client: LiveClient, text: str, context_id: str = "ok"
) -> tuple[dict[str, Any], LiveClient]:
    await client.send(type="input_text.append", context_id=context_id, text=text)
    await client.send(type="input_text.end", context_id=context_id)
    return await client.until("context.done", context_id), client


async def test_binary_frame_from_client_closes_1003(strict: GatewayProcess) -> None:
    async def fault() -> None:
        async with LiveClient.open(strict.ws) as client:
            await client.ws.send(b"\x00\x01audio?")
            await expect_error(client, "binary_not_allowed")
            await expect_close(client, 1003)

    await alongside_healthy(strict, fault)


async def test_oversized_message_closes_1009(strict: GatewayProcess) -> None:
    async def fault() -> None:
        async with LiveClient.open(strict.ws) as client:
            await client.send(type="input_text.append", context_id="big", text="x" * 3000)
            await expect_error(client, "message_too_large")
            await expect_close(client, 1009)
        async with LiveClient.open(strict.ws) as client:  # far over: the server's frame limit closes it
            await client.send(type="input_text.append", context_id="big", text="x" * 20000)
            await expect_close(client, 1009)

    await alongside_healthy(strict, fault)


async def test_unknown_voice_language_and_format_are_refused(strict: GatewayProcess) -> None:
    async def fault() -> None:
        async with LiveClient.open(strict.ws) as client:
            await client.send(type="context.create", context_id="v", voice="darth")
            assert "aiden" in (await expect_error(client, "unknown_voice"))["error"]["message"]
            await client.send(type="context.create", context_id="v", language="klingon")
            await expect_error(client, "unknown_language")
            await client.send(type="session.update", audio={"format": "mp3"})
            await expect_error(client, "unsupported_format")
            await client.send(type="context.create", context_id="v", voice="NOVA")  # OpenAI name, any case
            assert (await client.until("context.created", "v"))["stream"] >= 1

    await alongside_healthy(strict, fault)


async def test_events_for_unknown_or_finished_contexts_are_errors(strict: GatewayProcess) -> None:
    async def fault() -> None:
        async with LiveClient.open(strict.ws) as client:
            for kind in ("input_text.flush", "input_text.end", "context.cancel", "playback.position"):
                extra = {"played_samples": 0} if kind == "playback.position" else {}
                await client.send(type=kind, context_id="ghost", **extra)
                assert (await expect_error(client, "unknown_context"))["context_id"] == "ghost"
            await _speak_on(client, "Short.", "once")
            await client.send(type="input_text.append", context_id="once", text="more")
            await expect_error(client, "context_closed")
            await client.send(type="context.create", context_id="twice")
            await client.send(type="context.create", context_id="twice")
            await expect_error(client, "context_exists")

    await alongside_healthy(strict, fault)


async def test_too_many_contexts_per_socket(strict: GatewayProcess) -> None:
    async def fault() -> None:
        async with LiveClient.open(strict.ws) as client:
            for context_id in ("c1", "c2", "c3"):
                await client.send(type="context.create", context_id=context_id)
            assert (await expect_error(client, "too_many_contexts"))["context_id"] == "c3"
            await client.send(type="context.cancel", context_id="c1")  # frees a slot
            await client.until("context.done", "c1")
            await client.send(type="context.create", context_id="c3")
            await client.until("context.created", "c3")

    await alongside_healthy(strict, fault)


async def test_text_per_context_is_limited(strict: GatewayProcess) -> None:
    async def fault() -> None:
        async with LiveClient.open(strict.ws) as client:
            await client.send(type="input_text.append", context_id="t", text="y " * 140)
            await client.send(type="input_text.append", context_id="t", text="z " * 20)
            await expect_error(client, "text_too_long")
            await client.send(type="input_text.end", context_id="t")
            done = await client.until("context.done", "t")
            assert done["samples"] == expected_samples(280)  # the refused append added nothing

    await alongside_healthy(strict, fault)


async def test_append_rate_is_limited(strict: GatewayProcess) -> None:
    async def fault() -> None:
        async with LiveClient.open(strict.ws) as client:
            for _ in range(12):  # burst 5, 20 per second: most of these arrive too fast
                await client.send(type="input_text.append", context_id="r", text="go ")
            event = await expect_error(client, "rate_limited")
            assert event["error"]["type"] == "rate_limit_error"

    await alongside_healthy(strict, fault)


async def test_idle_socket_is_closed_1008(strict: GatewayProcess) -> None:
    async def fault() -> None:
        async with LiveClient.open(strict.ws) as client:
            await client.send(type="context.create", context_id="idle")
            await expect_error(client, "idle_timeout")
            await expect_close(client, 1008)

    await alongside_healthy(strict, fault)


async def test_missing_subprotocol_closes_1002(strict: GatewayProcess) -> None:
    async def fault() -> None:
        async with connect(strict.ws) as ws:
            error = orjson.loads(await ws.recv())
            assert error["error"]["code"] == "subprotocol_required"
            with pytest.raises(ConnectionClosed) as info:
                await ws.recv()
            assert info.value.rcvd is not None and info.value.rcvd.code == 1002

    await alongside_healthy(strict, fault)


async def test_slow_reader_is_cut_off_and_its_engine_work_cancelled(engine_kind: str) -> None:
    # Its own gateway: kernel socket buffers absorb megabytes before the outbound budget is touched,
    # so this client asks for far more audio than the strict text limit allows.
    # The budget stays above the healthy neighbour's whole audio (~0.7 MB), so only the stalled reader trips it.
    server = start_gateway("--limit=max_outbound_bytes=1048576", "--limit=slow_reader_grace_s=1",
                           engine=engine_kind, ms_per_frame=0.2)  # fmt: skip

    def slow_reader_errors() -> float:
        return server.metrics().get('vivace_errors_total{code="slow_reader"}', 0)

    async def fault() -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        async with connect(server.ws, sock=sock, subprotocols=[PROTOCOL], max_queue=1, max_size=None) as ws:
            text = "la " * 3000  # ~8,000 frames, ~60 MB of PCM at 48 kHz
            # 48 kHz output: twice the bytes per generated frame, so the buffers fill in half the engine time.
            await ws.send(orjson.dumps({"type": "context.create", "context_id": "s",
                                        "audio": {"format": "pcm16", "sample_rate": 48000}}).decode())  # fmt: skip
            await ws.send(
                orjson.dumps({"type": "input_text.append", "context_id": "s", "text": text}).decode()
            )
            await ws.send(orjson.dumps({"type": "input_text.end", "context_id": "s"}).decode())
            # The real tiny engine makes audio ~5x faster than realtime on one CPU core; filling the kernel's
            # socket buffers (the server's send buffer grows to a few MB) and then the 1 MiB budget takes it 15-35 s
            # here, and once took over 180 s at 24 kHz on the 2-core CI machine; the fake engine far less.
            await _wait_for(lambda: slow_reader_errors() == 1, 30 if engine_kind == "fake" else 360)
            # The engine dropped the request although its audio was far from finished.
            await _wait_for(
                lambda: server.metrics().get('vivace_engine_active_requests{engine="0"}', 1) == 0, 5
            )
            # Reading again: buffered audio, then the slow_reader error and a policy close (or a cut connection).
            with pytest.raises(ConnectionClosed) as info:
                while True:
                    await asyncio.wait_for(ws.recv(), 10)
            assert info.value.rcvd is None or info.value.rcvd.code == 1008

    try:
        await alongside_healthy(server, fault)
        assert server.metrics()["vivace_outbound_queued_bytes"] <= 1048576
    finally:
        server.stop()


async def test_disconnect_mid_stream_cancels_engine_work(strict: GatewayProcess) -> None:
    async def fault() -> None:
        async with LiveClient.open(strict.ws) as client:
            # No input_text.end: the engine request would wait for more text forever.
            await client.send(type="input_text.append", context_id="d", text="word " * 55)
            while not client.frames:
                await client.receive()
        # The socket is gone: only a cancel from the gateway ends the engine request.
        await _wait_for(lambda: strict.metrics().get('vivace_engine_active_requests{engine="0"}', 1) == 0, 10)

    await alongside_healthy(strict, fault)


async def test_api_key_and_origin_are_checked_before_accepting(engine_kind: str) -> None:
    server = start_gateway(
        "--api-key=s3cret-key", "--allowed-origins=https://app.example", engine=engine_kind
    )
    try:
        with pytest.raises(InvalidStatus) as info:
            async with connect(server.ws, subprotocols=[PROTOCOL]):
                pass
        assert info.value.response.status_code == 401
        with pytest.raises(InvalidStatus) as info:
            async with connect(
                server.ws, subprotocols=[PROTOCOL, "vivace.auth.s3cret-key"], origin="https://evil.example"
            ):
                pass
        assert info.value.response.status_code == 403
        # Browsers: key in a second subprotocol entry, allowed origin; the server echoes only the protocol.
        async with LiveClient.open(server.ws, subprotocols=[PROTOCOL, "vivace.auth.s3cret-key"],
                                   origin="https://app.example") as client:  # fmt: skip
            assert client.ws.subprotocol == PROTOCOL
        # Backends: Authorization header, no Origin.
        async with LiveClient.open(
            server.ws, additional_headers={"Authorization": "Bearer s3cret-key"}
        ) as client:
            done, _ = await _speak_on(client, "Authorized.")
            assert done["reason"] == "completed"
    finally:
        server.stop()


async def _wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await asyncio.to_thread(predicate):
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)
