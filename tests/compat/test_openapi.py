"""/openapi.json describes exactly the app's HTTP routes, and real requests fit its schemas."""

from __future__ import annotations

import jsonschema
from starlette.routing import Route

from gateway.app import create_app
from gateway.settings import Settings
from tests.gateway.helpers import GatewayProcess


def _resolve(document: dict, schema: dict) -> dict:
    ref = schema["content"]["application/json"]["schema"]["$ref"]
    return document["components"]["schemas"][ref.rsplit("/", 1)[1]]


def test_every_http_route_is_described_with_its_methods_and_nothing_else(gateway: GatewayProcess) -> None:
    document = gateway.get("/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    app = create_app(Settings(model="tiny", device="cpu"))
    routes = {
        route.path: {m.lower() for m in (route.methods or ())} - {"head"}
        for route in app.routes
        if isinstance(route, Route)
    }
    described = {path: set(item) for path, item in document["paths"].items()}
    assert described == routes


def test_requests_the_clients_send_fit_the_documented_schemas(gateway: GatewayProcess) -> None:
    document = gateway.get("/openapi.json").json()
    paths = document["paths"]
    examples = {
        "/v1/audio/speech": {"model": "tts-1", "input": "Hi.", "voice": "alloy", "response_format": "mp3"},
        "/v1/text-to-speech/{voice_id}/stream": {"text": "Hi.", "model_id": "eleven_flash_v2_5"},
        "/tts/bytes": {
            "model_id": "sonic-3",
            "transcript": "Hi.",
            "voice": {"mode": "id", "id": "serena"},
            "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000},
            "language": "en",
        },
    }
    for path, body in examples.items():
        schema = _resolve(document, paths[path]["post"]["requestBody"])
        jsonschema.Draft202012Validator(schema).validate(body)
    bad = _resolve(document, paths["/v1/audio/speech"]["post"]["requestBody"])
    assert not jsonschema.Draft202012Validator(bad).is_valid({"input": "Hi.", "response_format": "webm"})
