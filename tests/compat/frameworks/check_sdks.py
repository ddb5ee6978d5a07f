"""The official SDKs pointed at Vivace: `elevenlabs` over HTTP (`base_url`), `cartesia` over WebSocket."""

from __future__ import annotations

import base64

from cartesia import Cartesia
from elevenlabs.client import ElevenLabs

TEXT = "Hello from an SDK."
SECONDS = (1.0, 3.0)


def test_elevenlabs_sdk_streams_pcm_and_timestamps(base_url: str) -> None:
    client = ElevenLabs(api_key="unused", base_url=base_url)
    pcm = b"".join(
        client.text_to_speech.stream(
            voice_id="ryan", text=TEXT, model_id="eleven_flash_v2_5", output_format="pcm_16000"
        )
    )
    assert SECONDS[0] < len(pcm) / 2 / 16000 < SECONDS[1]
    chunks = list(
        client.text_to_speech.stream_with_timestamps(
            voice_id="ryan", text=TEXT, output_format="pcm_24000", language_code="en"
        )
    )
    audio = b"".join(base64.b64decode(c.audio_base_64) for c in chunks if c.audio_base_64)
    characters = [ch for c in chunks if c.alignment for ch in c.alignment.characters]
    assert SECONDS[0] < len(audio) / 2 / 24000 < SECONDS[1]
    assert "".join(characters) == TEXT


def test_elevenlabs_sdk_converts_whole_files_with_and_without_timestamps(base_url: str) -> None:
    client = ElevenLabs(api_key="unused", base_url=base_url)
    ulaw = b"".join(client.text_to_speech.convert(voice_id="ryan", text=TEXT, output_format="ulaw_8000"))
    assert SECONDS[0] < len(ulaw) / 8000 < SECONDS[1]
    whole = client.text_to_speech.convert_with_timestamps(
        voice_id="ryan", text=TEXT, output_format="pcm_22050"
    )
    assert SECONDS[0] < len(base64.b64decode(whole.audio_base_64)) / 2 / 22050 < SECONDS[1]
    assert whole.alignment is not None and "".join(whole.alignment.characters) == TEXT
    ends = whole.alignment.character_end_times_seconds
    assert ends == sorted(ends) and ends[-1] <= len(base64.b64decode(whole.audio_base_64)) / 2 / 22050 + 0.001


def test_cartesia_sdk_speaks_over_the_websocket_with_timestamps(base_url: str, ws_base_url: str) -> None:
    client = Cartesia(api_key="unused", base_url=base_url, websocket_base_url=ws_base_url)
    with client.tts.websocket_connect() as connection:
        context = connection.context(
            model_id="sonic-3",
            voice={"mode": "id", "id": "serena"},
            output_format={"container": "raw", "encoding": "pcm_s16le", "sample_rate": 22050},
            add_timestamps=True,
            language="en",
        )
        context.push("Hello from ")
        context.push("an SDK.")
        context.no_more_inputs()
        events = list(context.receive())
    assert events[-1].type == "done"
    assert not [e for e in events if e.type == "error"]
    audio = b"".join(e.audio or b"" for e in events if e.type == "chunk")
    assert SECONDS[0] < len(audio) / 2 / 22050 < SECONDS[1]
    words = [
        w for e in events if e.type == "timestamps" and e.word_timestamps for w in e.word_timestamps.words
    ]
    assert words == TEXT.split()
