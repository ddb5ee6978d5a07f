"""The OpenAPI 3.1 description of the HTTP API, served at `GET /openapi.json`.

One document for every HTTP endpoint: OpenAI-compatible speech, models and voices, the
ElevenLabs- and Cartesia-compatible endpoints, and the probes. WebSockets are not OpenAPI's to
describe; docs/protocol.md covers them. A test checks that every HTTP route of the app is described
here with its methods and nothing else is, so the document cannot drift from the routes.
"""

from __future__ import annotations

from typing import Any

from gateway.compat.formats import elevenlabs_formats
from gateway.encoders import MEDIA_TYPES
from gateway.resample import OUTPUT_RATES

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "string"},
            },
        }
    },
}
_ERRORS = {
    str(status): {
        "description": text,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    for status, text in (
        (400, "bad input"),
        (401, "missing or wrong API key"),
        (503, "engine unavailable, overloaded or draining"),
    )
}
_AUDIO = {
    "description": "audio, streamed as the engine produces it, in the media type of the asked format",
    "content": {media_type: {} for media_type in dict.fromkeys(MEDIA_TYPES.values())},
}
_SPEECH = {**_AUDIO, "content": {**_AUDIO["content"], "text/event-stream": {}}}  # stream_format sse
_SEED = {"type": "integer", "minimum": 0, "maximum": 2**64 - 1}
_LANGUAGE = {"type": "string", "description": "a language name, an ISO 639-1 code (en, zh-CN, ...) or auto"}
_VOICE_HELP = "a speaker name or an OpenAI voice name; with a Base model, a saved voice's name (required)"
_VOICE_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
_VOICE_ID = {
    "name": "voice_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "example": "alloy",
    "description": _VOICE_HELP,
}

SPEECH_REQUEST = {
    "type": "object",
    "required": ["input"],
    "properties": {
        "model": {"type": "string", "description": "any name selects the served model"},
        "input": {"type": "string", "minLength": 1},
        "voice": {
            "oneOf": [{"type": "string"}, {"type": "object", "properties": {"id": {"type": "string"}}}],
            "description": _VOICE_HELP,
        },
        "response_format": {"enum": ["mp3", "opus", "aac", "flac", "wav", "pcm"], "default": "mp3"},
        "stream_format": {"enum": ["audio", "sse"], "default": "audio"},
        "instructions": {"type": "string"},
        "speed": {"const": 1.0},
        "language": _LANGUAGE,
        "seed": _SEED,
        "sample_rate": {"enum": list(OUTPUT_RATES), "default": 24000},
        "stream": {"type": "boolean"},
        "non_streaming_mode": {"type": "boolean"},
    },
}
ELEVENLABS_REQUEST = {
    "type": "object",
    "required": ["text"],
    "properties": {
        "text": {"type": "string", "minLength": 1},
        "model_id": {"type": "string", "description": "accepted and ignored"},
        "language_code": {"type": "string", "description": "ISO 639-1"},
        "seed": _SEED,
        "voice_settings": {"type": "object", "description": "accepted and ignored"},
    },
}
CARTESIA_REQUEST = {
    "type": "object",
    "required": ["transcript"],
    "properties": {
        "model_id": {"type": "string", "description": "accepted and ignored"},
        "transcript": {"type": "string", "minLength": 1},
        "voice": {
            "oneOf": [
                {"type": "string"},
                {"type": "object", "properties": {"id": {"type": "string"}, "mode": {"const": "id"}}},
            ],
            "description": _VOICE_HELP,
        },
        "language": {"type": ["string", "null"], "description": "ISO 639-1; null: automatic"},
        "seed": _SEED,
        "output_format": {
            "type": "object",
            "properties": {
                "container": {"enum": ["raw", "wav", "mp3"]},
                "encoding": {"enum": ["pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw"]},
                "sample_rate": {"enum": list(OUTPUT_RATES)},
                "bit_rate": {"type": "integer"},
            },
        },
    },
}


def _json_body(schema_name: str) -> dict[str, Any]:
    return {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_name}"}}},
    }


def _elevenlabs(summary: str, response: dict[str, Any]) -> dict[str, Any]:
    output_format = {
        "name": "output_format",
        "in": "query",
        "schema": {"enum": elevenlabs_formats(), "default": "mp3_44100_128"},
    }
    return {
        "post": {
            "summary": summary,
            "tags": ["ElevenLabs-compatible"],
            "parameters": [_VOICE_ID, output_format],
            "requestBody": _json_body("ElevenLabsSpeechRequest"),
            "responses": {"200": response, **_ERRORS},
        }
    }


def _get(summary: str, tag: str, description: str) -> dict[str, Any]:
    return {"get": {"summary": summary, "tags": [tag], "responses": {"200": {"description": description}}}}


def document() -> dict[str, Any]:
    timestamps = {
        "description": "JSON lines: audio_base64, alignment, normalized_alignment",
        "content": {"application/x-ndjson": {}},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Vivace",
            "version": "1",
            "description": "Realtime Qwen3-TTS server. WebSocket protocols (vivace.speech.v1, ElevenLabs "
            "stream-input and multi-stream-input, Cartesia /tts/websocket) are described in docs/protocol.md.",
        },
        "paths": {
            "/v1/audio/speech": {
                "post": {
                    "summary": "Synthesize speech (OpenAI-compatible)",
                    "tags": ["OpenAI-compatible"],
                    "requestBody": _json_body("SpeechRequest"),
                    "responses": {"200": _SPEECH, **_ERRORS},
                }
            },
            "/v1/models": _get("Served models", "OpenAI-compatible", "an OpenAI model list"),
            "/v1/audio/voices": {
                **_get("The served model's voices (built-in or saved), OpenAI aliases, languages", "OpenAI-compatible", "voices"),
                "post": {
                    "summary": "Save a voice from a reference recording (--voices-dir)",
                    "tags": ["Saved voices"],
                    "requestBody": {
                        "required": True,
                        "content": {"multipart/form-data": {"schema": {
                            "type": "object",
                            "required": ["name", "audio"],
                            "properties": {
                                "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,63}$"},
                                "audio": {"type": "string", "format": "binary"},
                                "transcript": {"type": "string"},
                            },
                        }}},
                    },
                    "responses": {"201": {"description": "the saved voice"}, **_ERRORS},
                },
            },
            "/v1/audio/voices/{name}": {
                "get": {"summary": "A saved voice", "tags": ["Saved voices"], "parameters": [_VOICE_NAME],
                        "responses": {"200": {"description": "the saved voice"}, **_ERRORS}},
                "delete": {"summary": "Delete a saved voice", "tags": ["Saved voices"], "parameters": [_VOICE_NAME],
                           "responses": {"200": {"description": "deleted"}, **_ERRORS}},
            },
            "/v1/text-to-speech/{voice_id}": _elevenlabs("Synthesize speech (ElevenLabs-compatible)", _AUDIO),
            "/v1/text-to-speech/{voice_id}/stream": _elevenlabs(
                "Stream speech (ElevenLabs-compatible)", _AUDIO
            ),
            "/v1/text-to-speech/{voice_id}/stream/with-timestamps": _elevenlabs(
                "Stream speech with approximate character timings (ElevenLabs-compatible)", timestamps
            ),
            "/v1/text-to-speech/{voice_id}/with-timestamps": _elevenlabs(
                "Speech and approximate character timings in one JSON object (ElevenLabs-compatible)",
                {
                    "description": "audio_base64, alignment, normalized_alignment",
                    "content": {"application/json": {}},
                },
            ),
            "/tts/bytes": {
                "post": {
                    "summary": "Synthesize speech (Cartesia-compatible)",
                    "tags": ["Cartesia-compatible"],
                    "parameters": [
                        {
                            "name": "Cartesia-Version",
                            "in": "header",
                            "schema": {"type": "string"},
                            "description": "accepted, any value",
                        }
                    ],
                    "requestBody": _json_body("CartesiaSpeechRequest"),
                    "responses": {"200": _AUDIO, **_ERRORS},
                }
            },
            "/health": _get("Liveness", "Operations", "the process serves"),
            "/ready": _get(
                "Readiness: every engine connected and warm (503 otherwise)", "Operations", "ready"
            ),
            "/metrics": _get("Prometheus metrics", "Operations", "Prometheus text exposition"),
            "/openapi.json": _get("This document", "Operations", "OpenAPI 3.1"),
        },
        "components": {
            "schemas": {
                "Error": _ERROR,
                "SpeechRequest": SPEECH_REQUEST,
                "ElevenLabsSpeechRequest": ELEVENLABS_REQUEST,
                "CartesiaSpeechRequest": CARTESIA_REQUEST,
            },
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "xApiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
                "xiApiKey": {"type": "apiKey", "in": "header", "name": "xi-api-key"},
            },
        },
        "security": [{}, {"bearer": []}, {"xApiKey": []}, {"xiApiKey": []}],
    }
