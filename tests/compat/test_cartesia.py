"""Cartesia-compatible WebSocket and /tts/bytes, spoken to over real sockets as Cartesia clients do."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import soundfile
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.gateway.helpers import GatewayProcess, expected_samples, start_gateway

HEADERS = {"Cartesia-Version": "2025-04-16", "X-API-Key": "unused"}


def ws_url(gateway: GatewayProcess) -> str:
    return f"ws://127.0.0.1:{gateway.port}/tts/websocket?cartesia_version=2025-04-16"


def request(context_id: str, transcript: str, *, more: bool, **extra: Any) -> dict[str, Any]:
    return {
        "context_id": context_id,
        "model_id": "sonic-3",
        "transcript": transcript,
        "continue": more,
        "voice": {"mode": "id", "id": "serena"},
        "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000},
        "language": "en",
        "add_timestamps": True,
        **extra,
    }


async def send(ws: ClientConnection, message: dict[str, Any]) -> None:
    await ws.send(orjson.dumps(message).decode())


async def until_done(ws: ClientConnection, contexts: set[str], timeout_s: float = 60) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while not contexts <= {m["context_id"] for m in messages if m["type"] == "done"}:
        messages.append(orjson.loads(await asyncio.wait_for(ws.recv(), deadline - time.monotonic())))
    return messages


def audio_of(messages: list[dict[str, Any]], context_id: str) -> bytes:
    return b"".join(
        base64.b64decode(m["data"])
        for m in messages
        if m["type"] == "chunk" and m["context_id"] == context_id
    )


def words_of(messages: list[dict[str, Any]], context_id: str) -> tuple[list[str], list[float], list[float]]:
    words, starts, ends = [], [], []
    for m in messages:
        if m["type"] == "timestamps" and m["context_id"] == context_id:
            words += m["word_timestamps"]["words"]
            starts += m["word_timestamps"]["start"]
            ends += m["word_timestamps"]["end"]
    return words, starts, ends


async def test_two_contexts_stream_transcripts_in_pieces_with_word_timestamps_and_the_socket_stays_open(
    gateway: GatewayProcess,
) -> None:
    first, second = ["Hello ", "from the ", "first one. "], ["Second ", "context here. "]
    async with connect(ws_url(gateway), additional_headers=HEADERS) as ws:
        for a, b in zip(first, [*second, ""], strict=True):
            await send(ws, request("one", a, more=True))
            if b:
                await send(ws, request("two", b, more=True))
        await send(ws, request("one", " ", more=False))
        await send(ws, request("two", "", more=False))
        messages = await until_done(ws, {"one", "two"})
        assert all({"type", "context_id"} <= set(m) for m in messages)
        assert not [m for m in messages if m["type"] == "error"]
        for context_id, pieces in (("one", first), ("two", second)):
            text = "".join(pieces) + (" " if context_id == "one" else "")
            assert len(audio_of(messages, context_id)) == expected_samples(len(text)) * 2
            words, starts, ends = words_of(messages, context_id)
            assert words == text.split()  # seconds from the start of the context, across transcripts
            assert starts == sorted(starts) and all(s <= e for s, e in zip(starts, ends, strict=True))
            assert ends[-1] <= expected_samples(len(text)) / 24000 + 0.001
        done = [m for m in messages if m["type"] == "done"]
        assert all(m["done"] is True for m in done)
        assert all(m["done"] is False for m in messages if m["type"] != "done")
        # The socket stays open after done: a new context on it works (LiveKit reuses sockets).
        await send(ws, request("three", "Again. ", more=False, add_timestamps=False))
        again = await until_done(ws, {"three"})
        assert len(audio_of(again, "three")) == expected_samples(len("Again. ")) * 2
        assert not [m for m in again if m["type"] == "timestamps"]
    metrics = gateway.metrics()  # the compatible endpoints count like the native ones
    assert metrics['vivace_requests_total{endpoint="cartesia_ws",outcome="completed"}'] >= 2
    assert metrics['vivace_ttfa_seconds_count{endpoint="cartesia_ws"}'] >= 2


async def test_cancel_stops_a_context_whose_input_ended_and_others_carry_on(gateway: GatewayProcess) -> None:
    async with connect(ws_url(gateway), additional_headers=HEADERS) as ws:
        long_text = (
            "A long answer that the listener interrupts well before it could ever finish speaking. " * 3
        )
        await send(ws, request("barge", long_text, more=False))
        while orjson.loads(await asyncio.wait_for(ws.recv(), 60))["type"] != "chunk":
            pass
        await send(ws, {"context_id": "barge", "cancel": True})
        await send(ws, request("next", "Yes?", more=False))
        messages = await until_done(ws, {"next"})
        await asyncio.sleep(0.5)
        late = []
        with pytest.raises(TimeoutError):
            while True:
                late.append(orjson.loads(await asyncio.wait_for(ws.recv(), 0.5)))
    after_next_started = messages[next(i for i, m in enumerate(messages) if m["context_id"] == "next") :]
    barge_after = [m for m in after_next_started + late if m["context_id"] == "barge"]
    assert not [m for m in barge_after if m["type"] == "done"]
    total = len(audio_of(messages, "barge"))
    assert total < expected_samples(len(long_text)) * 2 // 2  # it really stopped early
    assert len(audio_of(messages, "next")) == expected_samples(len("Yes?")) * 2


async def test_a_context_cancelled_before_its_engine_dies_ends_quietly_in_cartesia_terms(engine_kind: str) -> None:
    server = start_gateway(engine=engine_kind, ms_per_frame=20.0)
    try:
        [engine_pid] = server.engine_pids()
        async with connect(ws_url(server), additional_headers=HEADERS) as ws:
            await send(ws, request("barge", "A context that is cancelled just before its engine dies. " * 3,
                                   more=False))  # fmt: skip
            while orjson.loads(await asyncio.wait_for(ws.recv(), 60))["type"] != "chunk":
                pass
            os.kill(engine_pid, signal.SIGSTOP)  # the engine cannot confirm the cancel...
            await send(ws, {"context_id": "barge", "cancel": True})
            await asyncio.sleep(0.3)
            os.kill(engine_pid, signal.SIGKILL)  # ...and dies with the request still running
            late = []
            with pytest.raises(TimeoutError):
                while True:
                    late.append(orjson.loads(await asyncio.wait_for(ws.recv(), 2.0)))
        # No error for a context the client stopped, and nothing of the native protocol (no context.done).
        assert not [m for m in late if m.get("type") in ("error", "context.done")], late
    finally:
        server.stop()


async def test_errors_name_their_context_and_never_say_done(gateway: GatewayProcess) -> None:
    async with connect(ws_url(gateway), additional_headers=HEADERS) as ws:
        await send(ws, request("bad-voice", "Hi.", more=False, voice={"mode": "id", "id": "nobody"}))
        await send(ws, request("bad-lang", "Hi.", more=False, language="xx"))
        bad_format = {"container": "raw", "encoding": "pcm_s24le", "sample_rate": 24000}
        await send(ws, request("bad-format", "Hi.", more=False, output_format=bad_format))
        errors = [orjson.loads(await asyncio.wait_for(ws.recv(), 10)) for _ in range(3)]
        assert [(e["type"], e["context_id"], e["error_code"]) for e in errors] == [
            ("error", "bad-voice", "unknown_voice"),
            ("error", "bad-lang", "unknown_language"),
            ("error", "bad-format", "unsupported_output_format"),
        ]
        assert all("done" not in e and e["status_code"] == 400 and e["message"] for e in errors)
        await send(ws, request("fine", "Still works.", more=False))
        assert (
            len(audio_of(await until_done(ws, {"fine"}), "fine")) == expected_samples(len("Still works.")) * 2
        )


async def test_a_socket_closed_on_an_error_first_ends_each_live_context_with_its_own_error(
    gateway: GatewayProcess,
) -> None:
    """Found by fuzzing: a binary frame closed the socket after a context's chunks, with no error naming it."""
    async with connect(ws_url(gateway), additional_headers=HEADERS) as ws:
        await send(ws, request("talking", "Audio has started. ", more=True))
        messages = [orjson.loads(await asyncio.wait_for(ws.recv(), 30))]
        while messages[-1]["type"] != "chunk":
            messages.append(orjson.loads(await asyncio.wait_for(ws.recv(), 30)))
        await ws.send(b"\x00\x01")
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                messages.append(orjson.loads(await asyncio.wait_for(ws.recv(), 10)))
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1003
    last_of_context = [m for m in messages if m["context_id"] == "talking"][-1]
    assert (last_of_context["type"], last_of_context["error_code"]) == ("error", "binary_not_allowed")
    assert messages[-1]["error_code"] == closed.value.rcvd.reason == "binary_not_allowed"


@pytest.mark.parametrize(
    ("encoding", "rate", "width"), [("pcm_f32le", 44100, 4), ("pcm_mulaw", 8000, 1), ("pcm_alaw", 8000, 1)]
)
async def test_raw_encodings_at_the_requested_sample_rate(
    gateway: GatewayProcess, encoding: str, rate: int, width: int
) -> None:
    fmt = {"container": "raw", "encoding": encoding, "sample_rate": rate}
    async with connect(ws_url(gateway), additional_headers=HEADERS) as ws:
        await send(ws, request("c", "Rates.", more=False, output_format=fmt))
        data = audio_of(await until_done(ws, {"c"}), "c")
    assert abs(len(data) // width - expected_samples(len("Rates.")) * rate // 24000) <= 2


def test_tts_bytes_streams_a_wav_file_at_the_asked_rate(gateway: GatewayProcess) -> None:
    body = request("ignored", "Bytes over HTTP.", more=False)
    body.pop("context_id"), body.pop("continue"), body.pop("add_timestamps")
    body["output_format"] = {"container": "wav", "encoding": "pcm_s16le", "sample_rate": 16000}
    response = httpx.post(gateway.http + "/tts/bytes", json=body, headers=HEADERS, timeout=60)
    assert response.status_code == 200 and response.headers["content-type"] == "audio/wav"
    samples, rate = soundfile.read(io.BytesIO(response.content), dtype="int16")
    assert rate == 16000
    assert abs(len(samples) - expected_samples(len("Bytes over HTTP.")) * 16000 // 24000) <= 2
    assert np.abs(samples).max() > 100
    assert gateway.metrics()['vivace_requests_total{endpoint="cartesia_http",outcome="completed"}'] >= 1


def test_x_api_key_is_the_key_when_one_is_configured(engine_kind: str) -> None:
    server = start_gateway("--api-key=s3cret", engine=engine_kind)
    try:
        body = {"transcript": "Key.", "voice": {"id": "ryan"}, "output_format": {"container": "raw"}}
        assert httpx.post(server.http + "/tts/bytes", json=body, timeout=30).status_code == 401
        ok = httpx.post(server.http + "/tts/bytes", json=body, headers={"X-API-Key": "s3cret"}, timeout=60)
        assert ok.status_code == 200 and len(ok.content) == expected_samples(len("Key.")) * 2

        async def handshake(headers: dict[str, str]) -> None:
            async with connect(ws_url(server), additional_headers=headers):
                pass

        with pytest.raises(InvalidStatus) as info:
            asyncio.run(handshake({"X-API-Key": "wrong"}))
        assert info.value.response.status_code == 401
        asyncio.run(handshake({"X-API-Key": "s3cret"}))
    finally:
        server.stop()


async def test_sigterm_lets_a_live_context_finish_refuses_new_sockets_then_closes_1001(
    engine_kind: str,
) -> None:
    server = start_gateway("--drain-timeout=30", engine=engine_kind)
    text = "A context that is still speaking when the server is told to stop. "
    try:
        async with connect(ws_url(server), additional_headers=HEADERS) as ws:
            await send(ws, request("live", text, more=False))
            while orjson.loads(await asyncio.wait_for(ws.recv(), 60))["type"] != "chunk":
                pass
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(server.wait_ready, 5, 503)
            with pytest.raises(InvalidStatus) as info:
                async with connect(ws_url(server), additional_headers=HEADERS):
                    pass
            assert info.value.response.status_code == 503
            messages = await until_done(ws, {"live"})
            assert not [m for m in messages if m["type"] == "error"]
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await asyncio.wait_for(ws.recv(), 10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert await asyncio.to_thread(server.proc.wait, 30) == 0
    finally:
        server.stop()


@pytest.fixture(scope="module", autouse=True)
def _no_context_or_session_leaks(gateway: GatewayProcess) -> Iterator[None]:
    yield
    metrics = gateway.metrics()
    assert metrics["vivace_contexts_active"] == 0 and metrics["vivace_sessions_active"] == 0
