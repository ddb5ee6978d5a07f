"""The compatible protocols' routes (and /openapi.json, which describes them), in one list gateway/app.py mounts."""

from __future__ import annotations

from starlette.routing import Route, WebSocketRoute

from gateway import http_api
from gateway.compat import cartesia, elevenlabs

_TTS = "/v1/text-to-speech/{voice_id}"

ROUTES: list[Route | WebSocketRoute] = [
    WebSocketRoute(_TTS + "/stream-input", elevenlabs.stream_input),
    WebSocketRoute(_TTS + "/multi-stream-input", elevenlabs.multi_stream_input),
    Route(_TTS, elevenlabs.convert, methods=["POST"]),
    Route(_TTS + "/stream", elevenlabs.convert, methods=["POST"]),
    Route(_TTS + "/stream/with-timestamps", elevenlabs.stream_with_timestamps, methods=["POST"]),
    Route(_TTS + "/with-timestamps", elevenlabs.convert_with_timestamps, methods=["POST"]),
    WebSocketRoute("/tts/websocket", cartesia.websocket),
    Route("/tts/bytes", cartesia.tts_bytes, methods=["POST"]),
    Route("/openapi.json", http_api.openapi),
]
