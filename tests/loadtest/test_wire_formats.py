"""The lean HTTP/1.1 and WebSocket clients parse responses split at every possible byte boundary."""

from __future__ import annotations

import asyncio
import math
import struct

import numpy as np
import pytest

from loadtest.h1_client import FastHttpSpeechClient
from loadtest.trace import RequestFailed, StreamTrace
from loadtest.wsframes import OP_BINARY, OP_CLOSE, OP_TEXT, FrameParser, encode_frame, encode_masked_frame

RATE = 24_000
PCM = (0.1 * np.sin(2 * math.pi * 220 * np.arange(4800) / RATE) * 32767).astype("<i2").tobytes()


def chunked(body: bytes, sizes: list[int]) -> bytes:
    out, pos = b"", 0
    for size in sizes:
        out += b"%x;ext=1\r\n%s\r\n" % (size, body[pos : pos + size])
        pos += size
    return out + b"0\r\nx-trailer: yes\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: audio/pcm\r\nx-sample-rate: 24000\r\n"
RESPONSES = {
    "chunked": HEAD + b"transfer-encoding: chunked\r\n\r\n" + chunked(PCM, [1, 999, 5000, len(PCM) - 6000]),
    "content_length": HEAD + b"content-length: %d\r\n\r\n" % len(PCM) + PCM,
    "until_close": HEAD + b"connection: close\r\n\r\n" + PCM,
}


async def serve_trickled(response: bytes, piece: int) -> tuple[asyncio.Server, int]:
    """A server that answers every request with `response`, written `piece` bytes at a time."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        for i in range(0, len(response), piece):
            writer.write(response[i : i + piece])
            await writer.drain()
            await asyncio.sleep(0)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def client(port: int) -> FastHttpSpeechClient:
    return FastHttpSpeechClient(
        f"http://127.0.0.1:{port}",
        model="m",
        voice="ryan",
        language=None,
        sample_rate=RATE,
        max_connections=4,
        timeout_s=5.0,
    )


@pytest.mark.parametrize("framing", sorted(RESPONSES))
@pytest.mark.parametrize("piece", [1, 7, 4096])
async def test_fast_http_client_reassembles_every_framing_at_any_split(framing: str, piece: int) -> None:
    server, port = await serve_trickled(RESPONSES[framing], piece)
    speech = client(port)
    try:
        trace = StreamTrace(RATE)
        await asyncio.wait_for(speech.synthesize("hello", trace), 20)
    finally:
        await speech.close()
        server.close()
    assert bytes(trace.pcm) == PCM
    assert trace.samples == len(PCM) // 2 and trace.playback.total_samples == trace.samples
    assert trace.end is not None and trace.dispatch is not None


@pytest.mark.parametrize(
    ("response", "kind"),
    [
        (b'HTTP/1.1 400 Bad Request\r\ncontent-length: 27\r\n\r\n{"error":{"message":"no"}}\n', "http_400"),
        (HEAD.replace(b"audio/pcm", b"audio/mpeg") + b"content-length: 2\r\n\r\nab", "protocol"),
        (HEAD.replace(b"24000", b"22050") + b"content-length: 2\r\n\r\nab", "protocol"),
        (HEAD + b"transfer-encoding: chunked\r\n\r\nzz\r\n", "protocol"),
        (HEAD + b"content-length: 100\r\n\r\nshort", "transport"),
    ],
)
async def test_fast_http_client_reports_bad_responses_by_kind(response: bytes, kind: str) -> None:
    server, port = await serve_trickled(response, 4096)
    speech = client(port)
    try:
        with pytest.raises(RequestFailed) as failure:
            await asyncio.wait_for(speech.synthesize("hello", StreamTrace(RATE)), 20)
    finally:
        await speech.close()
        server.close()
    assert failure.value.kind == kind


def test_frame_parser_reassembles_frames_split_anywhere() -> None:
    audio = struct.pack("<BBHII", 1, 1, 0, 0, 0) + PCM[:70_000]  # 64-bit length form
    stream = (
        encode_frame(OP_TEXT, b'{"type":"context.created"}')
        + encode_frame(OP_BINARY, audio)
        + encode_frame(OP_BINARY, b"x" * 300)  # 16-bit length form
        + encode_masked_frame(OP_TEXT, b"masked ok", b"\x01\x02\x03\x04")
        + encode_frame(OP_CLOSE, struct.pack("!H", 1000))
    )
    expected = [
        (OP_TEXT, b'{"type":"context.created"}'),
        (OP_BINARY, audio),
        (OP_BINARY, b"x" * 300),
        (OP_TEXT, b"masked ok"),
        (OP_CLOSE, struct.pack("!H", 1000)),
    ]
    for piece in (1, 3, 125, 65_536, len(stream)):
        parser = FrameParser()
        messages = []
        for i in range(0, len(stream), piece):
            messages.extend(parser.feed(stream[i : i + piece]))
        assert messages == expected, piece


def test_frame_parser_joins_fragmented_messages() -> None:
    first = struct.pack("!BB", OP_TEXT, 3) + b"abc"  # FIN clear
    last = struct.pack("!BB", 0x80, 3) + b"def"  # continuation with FIN
    assert FrameParser().feed(first + last) == [(OP_TEXT, b"abcdef")]
