"""Cartesia wire shapes: the one place client requests are parsed and replies are built.

A generation request carries `context_id`, `transcript`, `continue`, `voice` (a string id, or an
object with `id`, older clients adding `"mode": "id"`), `output_format`, `language`, `flush` and
`add_timestamps`; a cancel request is `{"context_id": c, "cancel": true}`. `model_id`, `speed`,
`generation_config`, `max_buffer_delay_ms` and the other settings are accepted and ignored.
Every reply carries `type` and `context_id` (Pipecat reads both on every message); the end of a
context says `"type": "done"` and `"done": true`, and errors never say `done`.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.compat.errors import WireError
from gateway.compat.timings import WordTiming
from gateway.protocol import MAX_CONTEXT_ID_CHARS  # the native protocol's bound

STATUS_PARTIAL = 206


@dataclass(frozen=True, slots=True)
class Generation:
    context_id: str
    transcript: str
    more: bool  # `continue`: more transcript will follow on this context
    flush: bool
    voice: str | None
    output_format: Any  # the raw object; gateway/compat/formats.py parses it
    language: str | None
    add_timestamps: bool
    seed: int | None


@dataclass(frozen=True, slots=True)
class Cancel:
    context_id: str


Request = Generation | Cancel


def _voice(value: Any, context_id: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("id"), str):
        return str(value["id"])
    raise WireError("invalid_request", 'voice must be an id or {"id": ...}', context_id)


def _bool(obj: dict[str, Any], name: str, default: bool, context_id: str) -> bool:
    value = obj.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise WireError("invalid_request", f"{name} must be true or false", context_id)
    return value


def parse_request(raw: str) -> Request:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise WireError("invalid_json", f"message is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise WireError("invalid_request", "a message must be a JSON object")
    context_id = obj.get("context_id")
    if not isinstance(context_id, str) or not 0 < len(context_id) <= MAX_CONTEXT_ID_CHARS:
        raise WireError(
            "invalid_request", f"context_id must be a string of 1 to {MAX_CONTEXT_ID_CHARS} characters"
        )
    if obj.get("cancel") is True:
        return Cancel(context_id)
    transcript = obj.get("transcript", "")
    if not isinstance(transcript, str):
        raise WireError("invalid_request", "transcript must be a string", context_id)
    language = obj.get("language")
    if language is not None and not isinstance(language, str):
        raise WireError("invalid_request", "language must be a string", context_id)
    seed = obj.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise WireError("invalid_request", "seed must be an integer", context_id)
    return Generation(
        context_id=context_id,
        transcript=transcript,
        more=_bool(obj, "continue", False, context_id),
        flush=_bool(obj, "flush", False, context_id),
        voice=_voice(obj.get("voice"), context_id),
        output_format=obj.get("output_format"),
        language=language,
        add_timestamps=_bool(obj, "add_timestamps", False, context_id),
        seed=seed,
    )


def _dumps(reply: dict[str, Any]) -> str:
    return orjson.dumps(reply).decode()


def chunk(context_id: str, data: bytes, step_time_ms: float) -> str:
    return _dumps(
        {
            "type": "chunk",
            "context_id": context_id,
            "data": base64.b64encode(data).decode(),
            "done": False,
            "status_code": STATUS_PARTIAL,
            "step_time": round(step_time_ms, 3),
        }
    )


def timestamps(context_id: str, words: list[WordTiming]) -> str:
    """Word timings in seconds from the start of the context (running across its transcripts)."""
    return _dumps(
        {
            "type": "timestamps",
            "context_id": context_id,
            "done": False,
            "status_code": STATUS_PARTIAL,
            "word_timestamps": {
                "words": [w.word for w in words],
                "start": [round(w.start_s, 3) for w in words],
                "end": [round(w.end_s, 3) for w in words],
            },
        }
    )


def done(context_id: str) -> str:
    return _dumps({"type": "done", "context_id": context_id, "done": True, "status_code": STATUS_PARTIAL})


def error(context_id: str | None, code: str, message: str, status: int) -> str:
    return _dumps(
        {
            "type": "error",
            "context_id": context_id,
            "status_code": status,
            "title": code,
            "error_code": code,
            "message": message,
        }
    )
