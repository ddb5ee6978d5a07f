"""LiveKit Agents' ElevenLabs, Cartesia and OpenAI TTS plugins, pointed at Vivace by `base_url`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from livekit.agents import APIConnectOptions
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
from livekit.plugins import cartesia, elevenlabs, openai

TEXT = "Hello from a framework."
OPTIONS = APIConnectOptions(max_retry=0, timeout=60.0)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as http:
        yield http


async def collect(stream) -> tuple[list, list[str], list]:  # type: ignore[no-untyped-def]
    """Frames, timed words and the events of one synthesis."""
    frames, words, events = [], [], []
    async with stream:
        async for event in stream:
            events.append(event)
            frames.append(event.frame)
            words += [str(w).strip() for w in event.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]
    return frames, [w for w in words if w], events


def seconds(frames: list) -> float:
    return sum(f.samples_per_channel for f in frames) / frames[0].sample_rate


async def stream_text(tts, *pieces: str) -> tuple[list, list[str], list]:  # type: ignore[no-untyped-def]
    stream = tts.stream(conn_options=OPTIONS)
    for piece in pieces:
        stream.push_text(piece)
    stream.flush()
    stream.end_input()
    return await collect(stream)


def elevenlabs_tts(base_url: str, session: aiohttp.ClientSession, encoding: str) -> elevenlabs.TTS:
    return elevenlabs.TTS(
        api_key="unused", base_url=base_url + "/v1", voice_id="ryan", model="eleven_flash_v2_5",
        encoding=encoding, http_session=session,  # type: ignore[arg-type]
    )  # fmt: skip


async def test_elevenlabs_streams_over_multi_stream_input_with_timed_words(
    base_url: str, session: aiohttp.ClientSession
) -> None:
    tts = elevenlabs_tts(base_url, session, "pcm_24000")
    frames, words, events = await stream_text(tts, "Hello from ", "a framework.")
    assert frames and all(f.sample_rate == 24000 and f.num_channels == 1 for f in frames)
    assert 1.0 < seconds(frames) < 3.0 and events[-1].is_final
    assert words == TEXT.split()
    # The same socket takes the next utterance (a new context on the pooled connection).
    frames, words, _ = await stream_text(tts, "And another one.")
    assert 0.8 < seconds(frames) < 3.0 and words == ["And", "another", "one."]
    await tts.aclose()


async def test_elevenlabs_streams_its_default_mp3_over_the_websocket(
    base_url: str, session: aiohttp.ClientSession
) -> None:
    tts = elevenlabs.TTS(api_key="unused", base_url=base_url + "/v1", voice_id="ryan", http_session=session)
    frames, words, events = await stream_text(tts, "Hello from ", "a framework.")  # mp3_22050_32
    assert frames and frames[0].sample_rate == 22050 and events[-1].is_final
    assert 1.0 < seconds(frames) < 3.2 and words == TEXT.split()
    await tts.aclose()


async def test_elevenlabs_synthesize_uses_http_stream_in_its_default_mp3(
    base_url: str, session: aiohttp.ClientSession
) -> None:
    tts = elevenlabs.TTS(
        api_key="unused", base_url=base_url + "/v1", voice_id="ryan", http_session=session
    )  # encoding left at LiveKit's default, mp3_22050_32
    frames, _, _ = await collect(tts.synthesize(TEXT, conn_options=OPTIONS))
    assert frames and frames[0].sample_rate == 22050
    assert 1.0 < seconds(frames) < 3.2
    await tts.aclose()


async def test_cartesia_streams_and_synthesizes(base_url: str, session: aiohttp.ClientSession) -> None:
    tts = cartesia.TTS(
        api_key="unused", base_url=base_url, voice="serena", model="sonic-3", language="en",
        sample_rate=16000, http_session=session,
    )  # fmt: skip
    frames, words, events = await stream_text(tts, "Hello from ", "a framework.")
    assert frames and all(f.sample_rate == 16000 for f in frames) and events[-1].is_final
    assert 1.0 < seconds(frames) < 3.0
    assert words == TEXT.split()
    frames, _, _ = await collect(tts.synthesize(TEXT, conn_options=OPTIONS))  # POST /tts/bytes
    assert frames[0].sample_rate == 16000 and 1.0 < seconds(frames) < 3.0
    await tts.aclose()


async def test_a_new_stream_while_one_speaks_is_an_interruption_both_end(
    base_url: str, session: aiohttp.ClientSession
) -> None:
    tts = cartesia.TTS(
        api_key="unused", base_url=base_url, voice="serena", sample_rate=24000, http_session=session
    )
    first = tts.stream(conn_options=OPTIONS)
    first.push_text("This one is cut off by the listener before it can finish what it says. ")
    first.end_input()
    first_iter = first.__aiter__()
    await asyncio.wait_for(first_iter.__anext__(), 30)  # it speaks
    await first.aclose()  # barge-in: LiveKit closes the stream
    frames, words, events = await stream_text(tts, "Yes?")
    assert events[-1].is_final and 0.2 < seconds(frames) < 1.5
    await tts.aclose()


@pytest.mark.parametrize("model", ["tts-1", "gpt-4o-mini-tts"])  # raw bytes, and SSE (LiveKit's default)
async def test_openai_plugin_gets_mp3_by_default(base_url: str, model: str) -> None:
    tts = openai.TTS(api_key="unused", base_url=base_url + "/v1", model=model, voice="alloy")
    frames, _, _ = await collect(tts.synthesize(TEXT, conn_options=OPTIONS))
    assert frames and frames[0].sample_rate == 24000 and 1.0 < seconds(frames) < 3.2
    await tts.aclose()
