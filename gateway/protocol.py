"""Wire protocol `vivace.speech.v1`: the only place client-facing shapes are defined.

Client events are parsed once here into typed records (untrusted input is validated at this
boundary and nowhere else); server events are built by the small functions at the bottom.
Every sample count (`start_sample`, `samples`, `samples_sent`, `played_samples`, `heard_samples`,
`buffered_samples`) is in samples of the context's output rate: 24 kHz, the model's rate, unless
the client chose another `audio.sample_rate` (pcm16 only; Opus stays 24 kHz), whatever the encoding.

Binary audio frame (server -> client), little-endian, 12-byte header then payload:

    offset  size  field
    0       1     version       (1)
    1       1     flags         bit 0: first frame of the context, bit 1: last frame
    2       2     stream        u16 from `context.created`
    4       4     sequence      u32, 0, 1, 2, ... per stream
    8       4     start_sample  u32, index of the payload's first sample on the context's timeline
    12      ...   payload       PCM s16le samples, or exactly one Opus packet
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import orjson

PROTOCOL = "vivace.speech.v1"
AUTH_SUBPROTOCOL_PREFIX = "vivace.auth."  # browsers: a second subprotocol entry carrying the API key
SAMPLE_RATE = 24000
FRAME_VERSION = 1
FLAG_FIRST = 0b01
FLAG_LAST = 0b10
AUDIO_HEADER = struct.Struct("<BBHII")
AUDIO_FORMATS = ("pcm16", "opus")
SAMPLE_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)  # pcm16 output rates (soxr resampling)
MAX_CONTEXT_ID_CHARS = 128

# WebSocket close codes used (RFC 6455 section 7.4.1).
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001  # server draining on SIGTERM
CLOSE_PROTOCOL_ERROR = 1002  # subprotocol missing
CLOSE_UNSUPPORTED_DATA = 1003  # binary frame from the client
CLOSE_POLICY = 1008  # idle timeout, slow reader
CLOSE_TOO_BIG = 1009  # message over max_message_bytes
CLOSE_TRY_AGAIN = 1013  # refused while draining


class ProtocolError(Exception):
    """A client mistake: becomes an `error` event, and a close when `close_code` is set."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        event_id: str | None = None,
        context_id: str | None = None,
        close_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.error_type = error_type
        self.event_id = event_id
        self.context_id = context_id
        self.close_code = close_code


# ---------------------------------------------------------------- client events


# Pacing below this would leave no room to generate the next chunk before the listener runs dry.
MIN_MAX_LEAD_MS = 200


def valid_max_lead_ms(value: int) -> bool:
    """0 (unpaced) or at least MIN_MAX_LEAD_MS: the rule for session.update and --max-lead-ms alike."""
    return value == 0 or value >= MIN_MAX_LEAD_MS


@dataclass(frozen=True, slots=True)
class SessionUpdate:
    event_id: str | None
    voice: str | None
    language: str | None
    instructions: str | None
    audio_format: str | None
    max_lead_ms: int | None
    sample_rate: int | None = None
    word_timings: bool | None = None


@dataclass(frozen=True, slots=True)
class ContextCreate:
    event_id: str | None
    context_id: str
    voice: str | None
    language: str | None
    instructions: str | None
    audio_format: str | None
    sample_rate: int | None = None
    word_timings: bool | None = None


@dataclass(frozen=True, slots=True)
class InputTextAppend:
    event_id: str | None
    context_id: str
    text: str


@dataclass(frozen=True, slots=True)
class InputTextFlush:
    event_id: str | None
    context_id: str


@dataclass(frozen=True, slots=True)
class InputTextEnd:
    event_id: str | None
    context_id: str


@dataclass(frozen=True, slots=True)
class ContextCancel:
    event_id: str | None
    context_id: str
    heard_samples: int | None


@dataclass(frozen=True, slots=True)
class PlaybackPosition:
    event_id: str | None
    context_id: str
    played_samples: int
    client_time_ms: float | None
    buffered_samples: int | None
    underruns: int | None


@dataclass(frozen=True, slots=True)
class Ping:
    event_id: str | None
    id: str | int | None
    client_time_ms: float | None


ClientEvent = (
    SessionUpdate
    | ContextCreate
    | InputTextAppend
    | InputTextFlush
    | InputTextEnd
    | ContextCancel
    | PlaybackPosition
    | Ping
)


class _Fields:
    """Typed getters over one decoded JSON object; every failure names the field."""

    def __init__(self, obj: dict[str, Any], event_id: str | None) -> None:
        self.obj = obj
        self.event_id = event_id

    def _bad(self, name: str, wanted: str) -> ProtocolError:
        return ProtocolError(
            "invalid_event",
            f"field {name!r} must be {wanted}",
            event_id=self.event_id,
            context_id=self.obj.get("context_id") if isinstance(self.obj.get("context_id"), str) else None,
        )

    def string(self, name: str, *, required: bool = False) -> str | None:
        value = self.obj.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str):
            raise self._bad(name, "a string")
        return value

    def context_id(self) -> str:
        value = self.obj.get("context_id")
        if (
            not isinstance(value, str)
            or not 0 < len(value) <= MAX_CONTEXT_ID_CHARS
            or not value.isprintable()
        ):
            raise self._bad("context_id", f"a printable string of 1 to {MAX_CONTEXT_ID_CHARS} characters")
        return value

    def count(self, name: str, *, required: bool = False) -> int | None:
        value = self.obj.get(name)
        if value is None and not required:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**53:
            raise self._bad(name, "a non-negative integer")
        return value

    def number(self, name: str) -> float | None:
        value = self.obj.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            raise self._bad(name, "a number")
        return float(value)

    def audio_format(self) -> str | None:
        audio = self.obj.get("audio")
        if audio is None:
            return None
        if not isinstance(audio, dict):
            raise self._bad("audio", 'an object like {"format": "pcm16"}')
        fmt = audio.get("format")
        if fmt is None:
            return None
        if fmt not in AUDIO_FORMATS:
            raise ProtocolError(
                "unsupported_format",
                f"audio.format must be one of {', '.join(AUDIO_FORMATS)}, got {fmt!r}",
                event_id=self.event_id,
            )
        return str(fmt)

    def flag(self, name: str) -> bool | None:
        value = self.obj.get(name)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self._bad(name, "true or false")
        return value

    def sample_rate(self) -> int | None:
        audio = self.obj.get("audio")
        rate = audio.get("sample_rate") if isinstance(audio, dict) else None
        if rate is None:
            return None
        if isinstance(rate, bool) or rate not in SAMPLE_RATES:
            raise ProtocolError(
                "unsupported_sample_rate",
                f"audio.sample_rate must be one of {', '.join(map(str, SAMPLE_RATES))}, got {rate!r}",
                event_id=self.event_id,
            )
        return int(rate)


def parse_client_event(text: str) -> ClientEvent:
    """Decode and validate one client text frame; raises ProtocolError with a precise code."""
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError("invalid_json", f"text frame is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("invalid_event", "an event must be a JSON object with a 'type'")
    raw_event_id = obj.get("event_id")
    event_id = raw_event_id if isinstance(raw_event_id, str) and len(raw_event_id) <= 128 else None
    kind = obj.get("type")
    f = _Fields(obj, event_id)
    if kind == "input_text.append":
        return InputTextAppend(event_id, f.context_id(), f.string("text", required=True) or "")
    if kind == "playback.position":
        return PlaybackPosition(
            event_id,
            f.context_id(),
            f.count("played_samples", required=True) or 0,
            f.number("client_time_ms"),
            f.count("buffered_samples"),
            f.count("underruns"),
        )
    if kind == "input_text.flush":
        return InputTextFlush(event_id, f.context_id())
    if kind == "input_text.end":
        return InputTextEnd(event_id, f.context_id())
    if kind == "context.cancel":
        return ContextCancel(event_id, f.context_id(), f.count("heard_samples"))
    if kind == "context.create":
        return ContextCreate(
            event_id,
            f.context_id(),
            f.string("voice"),
            f.string("language"),
            f.string("instructions"),
            f.audio_format(),
            f.sample_rate(),
            f.flag("word_timings"),
        )
    if kind == "session.update":
        max_lead_ms = f.count("max_lead_ms")
        if max_lead_ms is not None and not valid_max_lead_ms(max_lead_ms):
            raise f._bad("max_lead_ms", f"0 (no pacing) or at least {MIN_MAX_LEAD_MS} (ms)")
        return SessionUpdate(
            event_id,
            f.string("voice"),
            f.string("language"),
            f.string("instructions"),
            f.audio_format(),
            max_lead_ms,
            f.sample_rate(),
            f.flag("word_timings"),
        )
    if kind == "ping":
        ping_id = obj.get("id")
        if ping_id is not None and (isinstance(ping_id, bool) or not isinstance(ping_id, str | int)):
            raise f._bad("id", "a string or an integer")
        return Ping(event_id, ping_id, f.number("client_time_ms"))
    if not isinstance(kind, str):
        raise ProtocolError("invalid_event", "an event needs a string 'type'", event_id=event_id)
    raise ProtocolError("unknown_event_type", f"unknown event type {kind[:64]!r}", event_id=event_id)


# ---------------------------------------------------------------- server events


def dumps(event: dict[str, Any]) -> str:
    return orjson.dumps(event).decode()


def error_event(error: ProtocolError) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "error",
        "error": {"type": error.error_type, "code": error.code, "message": error.message},
    }
    if error.context_id is not None:
        event["context_id"] = error.context_id
    if error.event_id is not None:
        event["event_id"] = error.event_id
    return event


def audio_description(
    audio_format: str, *, samples_per_packet: int | None, pre_skip: int | None, sample_rate: int = SAMPLE_RATE
) -> dict[str, Any]:
    audio: dict[str, Any] = {"format": audio_format, "sample_rate": sample_rate, "channels": 1}
    if samples_per_packet is not None:
        audio["samples_per_packet"] = samples_per_packet
    if pre_skip is not None:
        audio["pre_skip"] = pre_skip
    return audio


def context_created(context_id: str, stream: int, audio: dict[str, Any]) -> dict[str, Any]:
    return {"type": "context.created", "context_id": context_id, "stream": stream, "audio": audio}


def word_timing(context_id: str, words: list[tuple[str, int, int]]) -> dict[str, Any]:
    """Approximate word timings (gateway/compat/timings.py), in samples of the context's timeline."""
    return {
        "type": "word.timing",
        "context_id": context_id,
        "approximate": True,
        "words": [{"word": w, "start_sample": start, "end_sample": end} for w, start, end in words],
    }


def context_flushed(context_id: str) -> dict[str, Any]:
    return {"type": "context.flushed", "context_id": context_id}


def context_done(context_id: str, reason: str, samples: int) -> dict[str, Any]:
    return {"type": "context.done", "context_id": context_id, "reason": reason, "samples": samples}


def context_cancelled(context_id: str, samples_sent: int, heard_samples: int | None) -> dict[str, Any]:
    return {
        "type": "context.cancelled",
        "context_id": context_id,
        "samples_sent": samples_sent,
        "heard_samples": heard_samples,
    }


def pong(ping_id: str | int | None, client_time_ms: float | None, server_time_ms: float) -> dict[str, Any]:
    return {"type": "pong", "id": ping_id, "client_time_ms": client_time_ms, "server_time_ms": server_time_ms}


def audio_frame(flags: int, stream: int, sequence: int, start_sample: int, payload: bytes) -> bytes:
    return (
        AUDIO_HEADER.pack(FRAME_VERSION, flags, stream, sequence & 0xFFFFFFFF, start_sample & 0xFFFFFFFF)
        + payload
    )


def parse_audio_frame(frame: bytes) -> tuple[int, int, int, int, bytes]:
    """(flags, stream, sequence, start_sample, payload): for clients and tests."""
    version, flags, stream, sequence, start_sample = AUDIO_HEADER.unpack_from(frame)
    if version != FRAME_VERSION:
        raise ValueError(f"unknown audio frame version {version}")
    return flags, stream, sequence, start_sample, frame[AUDIO_HEADER.size :]
