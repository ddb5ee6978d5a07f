"""Pipecat's own ElevenLabs, Cartesia and OpenAI TTS services, pointed at Vivace by URL."""

from __future__ import annotations

import aiohttp
from pipecat.frames.frames import (
    ErrorFrame,
    InterruptionFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.services.cartesia.tts import CartesiaHttpTTSService, CartesiaTTSService
from pipecat.services.elevenlabs.tts import ElevenLabsHttpTTSService, ElevenLabsTTSService
from pipecat.services.openai.tts import OpenAITTSService
from pipecat.services.tts_service import TextAggregationMode
from pipecat.tests.utils import SleepFrame, run_test

TEXT = "Hello from a framework."
# Pipecat gives up on a context whose first audio takes over 3 s. The tiny model on a loaded CI CPU can
# take that long to start a new turn while the interrupted one (close_context finishes it) still runs;
# that a new context is not queued behind the closed one is checked on the raw socket
# (tests/compat/test_elevenlabs.py), so here Pipecat waits longer.
SLOW_CPU = {"stop_frame_timeout_s": 20.0}
SECOND = "And a second turn."


def audio_frames(frames: list) -> list[TTSAudioRawFrame]:
    return [f for f in frames if isinstance(f, TTSAudioRawFrame)]


def spoken_words(frames: list) -> str:
    return " ".join(f.text.strip() for f in frames if isinstance(f, TTSTextFrame) and f.text.strip())


async def speak(service, frames_to_send: list) -> list:  # type: ignore[no-untyped-def]
    down, _ = await run_test(service, frames_to_send=frames_to_send, start_timeout=10.0)
    errors = [f for f in down if isinstance(f, ErrorFrame)]
    assert not errors, errors
    return list(down)


async def test_elevenlabs_service_speaks_pcm_at_the_pipeline_rate_with_word_timestamps(
    ws_base_url: str,
) -> None:
    service = ElevenLabsTTSService(
        api_key="unused",
        url=ws_base_url,
        sample_rate=16000,
        settings=ElevenLabsTTSService.Settings(voice="ryan", model="eleven_flash_v2_5"),
        text_aggregation_mode=TextAggregationMode.TOKEN,
    )
    down = await speak(
        service, [TTSSpeakFrame(TEXT), SleepFrame(8.0), TTSSpeakFrame(SECOND), SleepFrame(8.0)]
    )
    audio = audio_frames(down)
    assert audio and all(f.sample_rate == 16000 and f.num_channels == 1 for f in audio)
    assert len({f.context_id for f in audio}) == 2  # two turns, two contexts, both ended
    assert sum(1 for f in down if isinstance(f, TTSStoppedFrame)) >= 2
    seconds = sum(len(f.audio) for f in audio) / 2 / 16000
    assert 2.0 < seconds < 6.0
    assert spoken_words(down).split() == (TEXT + " " + SECOND).split()


async def test_elevenlabs_service_survives_an_interruption(ws_base_url: str) -> None:
    service = ElevenLabsTTSService(
        api_key="unused",
        url=ws_base_url,
        sample_rate=24000,
        settings=ElevenLabsTTSService.Settings(voice="ryan", model="eleven_flash_v2_5"),
        text_aggregation_mode=TextAggregationMode.TOKEN,
        **SLOW_CPU,
    )
    long_turn = "This answer goes on and on, and the user talks over it long before it ends. "
    down = await speak(
        service,
        [
            TTSSpeakFrame(long_turn),
            SleepFrame(1.5),
            InterruptionFrame(),
            TTSSpeakFrame(SECOND),
            SleepFrame(12.0),
        ],
    )
    contexts = [f.context_id for f in audio_frames(down)]
    assert len(set(contexts)) == 2 and contexts[-1] != contexts[0]  # the new turn was heard after barge-in
    last = [f for f in audio_frames(down) if f.context_id == contexts[-1]]
    assert 0.8 < sum(len(f.audio) for f in last) / 2 / 24000 < 3.0


async def test_cartesia_service_speaks_with_word_timestamps(ws_base_url: str) -> None:
    service = CartesiaTTSService(
        api_key="unused",
        url=ws_base_url + "/tts/websocket",
        sample_rate=24000,
        settings=CartesiaTTSService.Settings(voice="serena", model="sonic-3"),
        text_aggregation_mode=TextAggregationMode.TOKEN,
    )
    down = await speak(service, [TTSSpeakFrame(TEXT), SleepFrame(8.0)])
    audio = audio_frames(down)
    assert audio and all(f.sample_rate == 24000 for f in audio)
    assert 1.0 < sum(len(f.audio) for f in audio) / 2 / 24000 < 3.0
    assert any(isinstance(f, TTSStoppedFrame) for f in down)
    assert spoken_words(down).split() == TEXT.split()


async def test_cartesia_service_survives_an_interruption(ws_base_url: str) -> None:
    service = CartesiaTTSService(
        api_key="unused",
        url=ws_base_url + "/tts/websocket",
        sample_rate=16000,
        settings=CartesiaTTSService.Settings(voice="serena", model="sonic-3"),
        text_aggregation_mode=TextAggregationMode.TOKEN,
        **SLOW_CPU,
    )
    long_turn = "This answer goes on and on, and the user talks over it long before it ends. "
    down = await speak(
        service,
        [
            TTSSpeakFrame(long_turn),
            SleepFrame(1.5),
            InterruptionFrame(),
            TTSSpeakFrame(SECOND),
            SleepFrame(12.0),
        ],
    )
    contexts = [f.context_id for f in audio_frames(down)]
    assert len(set(contexts)) == 2 and contexts[-1] != contexts[0]
    assert all(f.sample_rate == 16000 for f in audio_frames(down))


async def test_openai_service_speaks_pcm(base_url: str) -> None:
    async with aiohttp.ClientSession():
        service = OpenAITTSService(
            api_key="unused",
            base_url=base_url + "/v1",
            sample_rate=24000,
            settings=OpenAITTSService.Settings(voice="alloy", model="tts-1"),
        )
        down = await speak(service, [TTSSpeakFrame(TEXT), SleepFrame(6.0)])
    audio = audio_frames(down)
    assert audio and all(f.sample_rate == 24000 for f in audio)
    assert 1.0 < sum(len(f.audio) for f in audio) / 2 / 24000 < 3.0


async def test_http_services_elevenlabs_with_timestamps_and_cartesia_bytes(base_url: str) -> None:
    async with aiohttp.ClientSession() as session:
        eleven = ElevenLabsHttpTTSService(
            api_key="unused",
            base_url=base_url,
            aiohttp_session=session,
            sample_rate=16000,
            settings=ElevenLabsHttpTTSService.Settings(voice="ryan", model="eleven_flash_v2_5"),
        )
        down = await speak(eleven, [TTSSpeakFrame(TEXT), SleepFrame(5.0)])
        audio = audio_frames(down)
        assert audio and all(f.sample_rate == 16000 for f in audio)
        assert 1.0 < sum(len(f.audio) for f in audio) / 2 / 16000 < 3.0
        assert spoken_words(down).split() == TEXT.split()
        cartesia = CartesiaHttpTTSService(
            api_key="unused",
            base_url=base_url,
            aiohttp_session=session,
            sample_rate=24000,
            settings=CartesiaHttpTTSService.Settings(voice="serena", model="sonic-3"),
        )
        down = await speak(cartesia, [TTSSpeakFrame(TEXT), SleepFrame(5.0)])
        audio = audio_frames(down)
        assert audio and 1.0 < sum(len(f.audio) for f in audio) / 2 / 24000 < 3.0
