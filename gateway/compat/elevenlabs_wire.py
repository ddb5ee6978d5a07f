"""ElevenLabs wire shapes: the one place client messages are parsed and replies are built.

Client messages carry no type; what they mean follows from their fields (`text`, `context_id`,
`flush`, `close_context`, `close_socket`, plus settings that are accepted and ignored).
Replies are camelCase as ElevenLabs sends them: `audio` (base64), `contextId`, `isFinal`,
`alignment` / `normalizedAlignment` with `chars`, `charStartTimesMs`, `charDurationsMs`.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.compat.errors import WireError
from gateway.compat.timings import CharTiming
from gateway.protocol import MAX_CONTEXT_ID_CHARS  # the native protocol's bound

IGNORED_OBJECTS = ("voice_settings", "generation_config")  # accepted (type-checked) and ignored


@dataclass(frozen=True, slots=True)
class Message:
    text: str | None
    context_id: str | None
    flush: bool
    close_context: bool
    close_socket: bool


def parse_message(raw: str) -> Message:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise WireError("invalid_json", f"message is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise WireError("invalid_message", "a message must be a JSON object")
    context_id = obj.get("context_id")
    if context_id is not None and (
        not isinstance(context_id, str) or not 0 < len(context_id) <= MAX_CONTEXT_ID_CHARS
    ):
        raise WireError(
            "invalid_message", f"context_id must be a string of 1 to {MAX_CONTEXT_ID_CHARS} characters"
        )
    text = obj.get("text")
    if text is not None and not isinstance(text, str):
        raise WireError("invalid_message", "text must be a string", context_id)
    for name in IGNORED_OBJECTS:
        if obj.get(name) is not None and not isinstance(obj[name], dict):
            raise WireError("invalid_message", f"{name} must be an object", context_id)
    flags = {}
    for name in ("flush", "close_context", "close_socket", "try_trigger_generation"):
        value = obj.get(name, False)
        if not isinstance(value, bool):
            raise WireError("invalid_message", f"{name} must be true or false", context_id)
        flags[name] = value
    return Message(text, context_id, flags["flush"], flags["close_context"], flags["close_socket"])


def alignment(chars: list[CharTiming], origin_s: float) -> dict[str, list[Any]]:
    """`chars` / `charStartTimesMs` / `charDurationsMs`, times in ms from `origin_s`."""
    starts = [round((c.start_s - origin_s) * 1000) for c in chars]
    ends = [round((c.end_s - origin_s) * 1000) for c in chars]
    return {
        "chars": [c.char for c in chars],
        "charStartTimesMs": starts,
        "charDurationsMs": [e - s for s, e in zip(starts, ends, strict=True)],
    }


def audio_reply(context_id: str | None, data: bytes, chars: list[CharTiming], origin_s: float) -> str:
    """Audio (possibly empty) with the alignment of the characters it carries, relative to its start."""
    reply: dict[str, Any] = {"audio": base64.b64encode(data).decode() if data else None, "isFinal": False}
    if chars:
        reply["alignment"] = reply["normalizedAlignment"] = alignment(chars, origin_s)
    if context_id is not None:
        reply["contextId"] = context_id
    return orjson.dumps(reply).decode()


def final_reply(context_id: str | None) -> str:
    """`isFinal` in a message of its own (Pipecat drops audio that shares a message with it)."""
    reply: dict[str, Any] = {"isFinal": True}
    if context_id is not None:
        reply["contextId"] = context_id
    return orjson.dumps(reply).decode()


def error_reply(code: str, message: str, context_id: str | None) -> str:
    reply: dict[str, Any] = {"error": code, "message": message}
    if context_id is not None:
        reply["contextId"] = context_id
    return orjson.dumps(reply).decode()


def http_alignment(chars: list[CharTiming]) -> dict[str, list[Any]]:
    """The HTTP with-timestamps shape: seconds from the start of the request's audio."""
    return {
        "characters": [c.char for c in chars],
        "character_start_times_seconds": [round(c.start_s, 3) for c in chars],
        "character_end_times_seconds": [round(c.end_s, 3) for c in chars],
    }


def http_chunk(data: bytes, chars: list[CharTiming]) -> dict[str, Any]:
    timed = http_alignment(chars) if chars else None
    return {
        "audio_base64": base64.b64encode(data).decode(),
        "alignment": timed,
        "normalized_alignment": timed,
    }
