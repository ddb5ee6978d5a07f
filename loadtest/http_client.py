"""HTTP transport: OpenAI-compatible `POST /v1/audio/speech`, raw PCM streamed back.

Works against any server that implements the OpenAI speech endpoint with `response_format: pcm`
(raw s16le mono). Time zero is when the request body starts going out (httpcore trace hook), so
pooled-connection setup is reported separately as `connect`, as the field does (peers.md 2.2).
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from loadtest.trace import RequestFailed, StreamTrace

PCM_CONTENT_TYPES = ("audio/pcm", "audio/l16", "audio/raw", "application/octet-stream")
SPEECH_PATH = "/v1/audio/speech"


def speech_fields(
    model: str, voice: str, language: str | None, extra: dict[str, Any] | None
) -> dict[str, Any]:
    """The JSON body of a speech request, minus `input`.

    Defaults the field sends (`stream_format` for vLLM-Omni, `stream` for Nari, `language`) may be
    overridden or dropped (a None value) by `extra`; the canonical fields never are.
    """
    fields: dict[str, Any] = {"stream_format": "audio", "stream": True}
    if language:
        fields["language"] = language
    fields.update(extra or {})
    fields.update(model=model, voice=voice, response_format="pcm")
    return {key: value for key, value in fields.items() if value is not None}


def check_pcm_headers(content_type: str | None, sample_rate_header: str | None, sample_rate: int) -> None:
    """Raise RequestFailed unless the response is raw PCM at the run's sample rate."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind not in PCM_CONTENT_TYPES:
        raise RequestFailed("protocol", f"unexpected content-type {kind!r} for raw PCM")
    if sample_rate_header is not None and sample_rate_header.strip() != str(sample_rate):
        raise RequestFailed(
            "protocol", f"x-sample-rate {sample_rate_header} but the run expects {sample_rate}"
        )


class HttpSpeechClient:
    """httpx implementation (`--client library`): one pooled client shared by all requests of a run."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        voice: str,
        language: str | None,
        sample_rate: int,
        max_connections: int,
        timeout_s: float,
        extra_params: dict[str, Any] | None = None,
        api_key: str | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + SPEECH_PATH
        self.sample_rate = sample_rate
        self.fields = speech_fields(model, voice, language, extra_params)
        headers = {"accept-encoding": "identity"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            # The pool must never queue a request: that would be hidden client-side latency.
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def close(self) -> None:
        await self.client.aclose()

    async def synthesize(self, text: str, trace: StreamTrace) -> None:
        """Stream one request into `trace`; raise RequestFailed on any error."""

        async def on_trace(event: str, info: dict[str, Any]) -> None:
            if event.endswith("send_request_body.started") and trace.dispatch is None:
                trace.dispatch = time.monotonic()

        try:
            async with self.client.stream(
                "POST", self.url, json={**self.fields, "input": text}, extensions={"trace": on_trace}
            ) as response:
                if trace.dispatch is None:  # a transport without trace events: headers are back by now
                    trace.dispatch = trace.started
                if response.status_code != 200:
                    body = (await response.aread())[:300].decode("utf-8", "replace")
                    raise RequestFailed(f"http_{response.status_code}", body)
                check_pcm_headers(
                    response.headers.get("content-type"),
                    response.headers.get("x-sample-rate"),
                    self.sample_rate,
                )
                async for data in response.aiter_raw():
                    trace.audio(data)
                trace.end = time.monotonic()
        except httpx.TimeoutException as exc:
            raise RequestFailed("timeout", f"{type(exc).__name__}: {exc}") from None
        except httpx.ConnectError as exc:
            raise RequestFailed("connect", str(exc) or type(exc).__name__) from None
        except (httpx.HTTPError, OSError) as exc:
            raise RequestFailed("transport", f"{type(exc).__name__}: {exc}") from None
