"""The native protocol end to end: real socket, real gateway process, engine in its own process."""

from __future__ import annotations

import asyncio

import numpy as np
import opuslib
import pytest

from gateway.protocol import FLAG_FIRST, FLAG_LAST, PROTOCOL
from tests.gateway.helpers import GatewayProcess, LiveClient, expected_samples, start_gateway

WORDS = ["Streaming", "text", "arrives", "word", "by", "word", "from", "a", "language", "model", "while", "the", "listener", "already", "hears", "the", "first", "part", "of", "the", "answer", "without", "waiting", "for", "the", "rest", "of", "it", "to", "be", "written"]  # fmt: skip


def assert_contiguous(
    frames: list[tuple[int, int, int, int, bytes]], samples_per_frame: int | None = None
) -> None:
    """Sequence numbers count up from 0 and start_sample follows the payloads without gaps."""
    position = 0
    for index, (flags, _stream, sequence, start, payload) in enumerate(frames):
        assert sequence == index
        assert start == position
        assert bool(flags & FLAG_FIRST) == (index == 0)
        position += samples_per_frame if samples_per_frame is not None else len(payload) // 2


async def test_two_streamed_contexts_interleave_and_cancelling_one_leaves_the_other_complete(
    gateway: GatewayProcess,
) -> None:
    async with LiveClient.open(gateway.ws) as client:
        assert client.created["protocol"] == PROTOCOL
        await client.send(type="context.create", context_id="a", voice="aiden")
        await client.send(type="context.create", context_id="b", voice="vivian", language="English")
        created = {e["context_id"]: e for e in [await client.until("context.created") for _ in range(2)]}
        stream_a, stream_b = created["a"]["stream"], created["b"]["stream"]
        assert stream_a != stream_b

        reader = asyncio.create_task(_read_until_done(client, "b"))
        b_text = ""
        cancelled_at_frame_count: int | None = None
        for i, word in enumerate(WORDS * 3):
            if i >= len(WORDS) and cancelled_at_frame_count is not None:
                break  # the text ran on only until the two interleaved (a slow, loaded machine needs more)
            piece = word + " "
            if cancelled_at_frame_count is None:
                await client.send(type="input_text.append", context_id="a", text=piece)
            await asyncio.sleep(0.01)
            await client.send(type="input_text.append", context_id="b", text=piece)
            b_text += piece
            await asyncio.sleep(0.01)
            a_audio = [f for f in client.frames if f[1] == stream_a]
            audio_order = [s for kind, s in client.order if kind == "audio"]
            # Cancel a once its audio has interleaved with b's: a frame of a after b's first frame.
            interleaved = stream_b in audio_order and stream_a in audio_order[audio_order.index(stream_b) :]
            if cancelled_at_frame_count is None and interleaved and i >= 8:
                await client.send(type="context.cancel", context_id="a", heard_samples=960)
                cancelled_at_frame_count = len(a_audio)
        assert cancelled_at_frame_count is not None, "the two contexts never interleaved audio while text streamed"
        await client.send(type="input_text.end", context_id="b")
        await asyncio.wait_for(reader, 120)

    order = client.order
    cancelled_index = order.index(("event", ("context.cancelled", "a")))
    assert ("audio", stream_a) not in order[cancelled_index:], (
        "audio of a cancelled context followed context.cancelled"
    )
    cancelled = next(e for e in client.events if e["type"] == "context.cancelled")
    a_frames = client.stream_frames(stream_a)
    assert cancelled["samples_sent"] == sum(len(f[4]) // 2 for f in a_frames) > 0
    assert cancelled["heard_samples"] == 960
    done_a = next(e for e in client.events if e["type"] == "context.done" and e["context_id"] == "a")
    assert done_a["reason"] == "cancelled"

    done_b = next(e for e in client.events if e["type"] == "context.done" and e["context_id"] == "b")
    errors = [e for e in client.events if e["type"] == "error"]
    assert done_b["reason"] == "completed", f"context b did not complete: {errors}"
    b_frames = client.stream_frames(stream_b)
    assert done_b["samples"] == expected_samples(len(b_text)) == len(client.audio(stream_b)) // 2
    assert_contiguous(b_frames)
    assert b_frames[-1][0] & FLAG_LAST and not any(f[0] & FLAG_LAST for f in b_frames[:-1])
    # Interleaved: some audio of b arrived before a was cancelled, between frames of a.
    audio_streams = [s for kind, s in order[:cancelled_index] if kind == "audio"]
    first_b, last_a = (
        audio_streams.index(stream_b),
        len(audio_streams) - 1 - audio_streams[::-1].index(stream_a),
    )
    assert first_b < last_a, "audio of the two contexts did not interleave"


async def _read_until_done(client: LiveClient, context_id: str) -> None:
    await client.until("context.done", context_id, timeout_s=120)


async def test_first_append_creates_context_with_session_defaults_and_opus_decodes(
    gateway: GatewayProcess,
) -> None:
    text = "An implicit context speaks with the session's defaults."
    async with LiveClient.open(gateway.ws) as client:
        await client.send(type="session.update", voice="Ryan", audio={"format": "opus"}, max_lead_ms=1500)
        updated = await client.until("session.updated")
        assert (
            updated["voice"] == "ryan"
            and updated["audio"]["format"] == "opus"
            and updated["max_lead_ms"] == 1500
        )
        await client.send(type="input_text.append", context_id="x", text=text)
        created = await client.until("context.created", "x")
        assert created["audio"]["format"] == "opus" and created["audio"]["samples_per_packet"] == 480
        pre_skip = created["audio"]["pre_skip"]
        await client.send(type="input_text.end", context_id="x")
        done = await client.until("context.done", "x")
    assert done["reason"] == "completed" and done["samples"] == expected_samples(len(text))
    frames = client.stream_frames(created["stream"])
    assert_contiguous(frames, samples_per_frame=480)
    decoder = opuslib.Decoder(24000, 1)
    pcm = b"".join(decoder.decode(f[4], 480) for f in frames)
    decoded = np.frombuffer(pcm, "<i2")[pre_skip : pre_skip + done["samples"]]
    assert len(decoded) == done["samples"]
    assert np.sqrt(np.mean(decoded.astype(np.float64) ** 2)) > 100, "decoded Opus is silent"


async def test_flush_releases_a_partial_word_and_is_acknowledged(gateway: GatewayProcess) -> None:
    async with LiveClient.open(gateway.ws) as client:
        await client.send(type="input_text.append", context_id="f", text="Unfinished wor")
        await client.send(type="input_text.flush", context_id="f", event_id="e1")
        assert (await client.until("context.flushed", "f"))["context_id"] == "f"
        await client.send(type="input_text.append", context_id="f", text="d, then more.")
        await client.send(type="input_text.end", context_id="f")
        done = await client.until("context.done", "f")
    assert done["samples"] == expected_samples(len("Unfinished word, then more."))


async def test_ping_pong_and_playback_reports_become_deadlines(gateway: GatewayProcess) -> None:
    before = gateway.metrics()
    async with LiveClient.open(gateway.ws) as client:
        await client.send(type="ping", id=7, client_time_ms=1000.0)
        pong = await client.until("pong")
        assert pong["id"] == 7 and pong["client_time_ms"] == 1000.0 and pong["server_time_ms"] > 0
        await client.send(type="input_text.append", context_id="p", text="Reports steer the engine. " * 4)
        while not client.frames:
            await client.receive()
        await client.send(type="playback.position", context_id="p", played_samples=480, client_time_ms=1010.0,
                          buffered_samples=1440, underruns=2)  # fmt: skip
        await client.send(type="input_text.end", context_id="p")
        await client.until("context.done", "p")
        # A late report for a finished context is normal (the client is still playing): no error.
        await client.send(type="playback.position", context_id="p", played_samples=4800, underruns=3)
        await client.send(type="ping", id="last")
        await client.until("pong")
    assert not [e for e in client.events if e["type"] == "error"]
    after = gateway.metrics()
    assert after["vivace_playback_reports_total"] - before.get("vivace_playback_reports_total", 0) == 2
    assert after["vivace_client_underruns_total"] - before.get("vivace_client_underruns_total", 0) == 3
    assert after['vivace_deadlines_sent_total{source="report"}'] >= 1
    assert after['vivace_deadlines_sent_total{source="server_model"}'] >= 1


PACED_TEXT = "Pacing keeps the engine close to the listener, so stopping costs less."


async def _speak_paced(client: LiveClient, lead_ms: int) -> None:
    """One context on a session paced at `lead_ms`: the last audio arrives about (audio length - lead) after
    the first; unpaced, the tiny CPU engine sends all of it several times faster than real time."""
    await client.send(type="input_text.append", context_id="p", text=PACED_TEXT)
    await client.send(type="input_text.end", context_id="p")
    created = await client.until("context.created", "p")
    done = await client.until("context.done", "p", timeout_s=120)
    assert done["reason"] == "completed" and done["samples"] == expected_samples(len(PACED_TEXT))
    times = [t for f, t in zip(client.frames, client.arrivals, strict=True) if f[1] == created["stream"]]
    audio_s = done["samples"] / 24000
    assert times[-1] - times[0] >= audio_s - lead_ms / 1000 - 0.25, (times[-1] - times[0], audio_s)


async def test_a_paced_session_receives_audio_no_faster_than_its_lead_allows(
    gateway: GatewayProcess, engine_kind: str
) -> None:
    if engine_kind == "fake":
        pytest.skip("the fake engine does not pace")
    async with LiveClient.open(gateway.ws) as client:
        assert client.created["defaults"]["max_lead_ms"] is None  # unpaced unless asked
        await client.send(type="session.update", max_lead_ms=300)
        assert (await client.until("session.updated"))["max_lead_ms"] == 300
        await _speak_paced(client, 300)


async def test_the_servers_max_lead_paces_every_session_by_default(engine_kind: str) -> None:
    if engine_kind == "fake":
        pytest.skip("the fake engine does not pace")
    server = start_gateway("--max-lead-ms=300", engine=engine_kind)
    try:
        async with LiveClient.open(server.ws) as client:
            assert client.created["defaults"]["max_lead_ms"] == 300
            await _speak_paced(client, 300)
    finally:
        server.stop()


async def test_a_lead_too_small_to_pace_by_is_refused(gateway: GatewayProcess) -> None:
    async with LiveClient.open(gateway.ws) as client:
        await client.send(type="session.update", max_lead_ms=50, event_id="u1")
        error = await client.until("error")
        assert error["error"]["code"] == "invalid_event" and "max_lead_ms" in error["error"]["message"]
        await client.send(type="session.update", max_lead_ms=0)  # 0 turns pacing off
        assert (await client.until("session.updated"))["max_lead_ms"] == 0
