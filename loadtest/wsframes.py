"""The server side of RFC 6455 framing, just enough for the fake server: handshake, read, write.

Frame layout (client frames are always masked; server frames never are):

    byte 0: FIN(1) RSV(3) opcode(4)     byte 1: MASK(1) length(7)
    length 126 -> 2-byte length follows; 127 -> 8-byte length follows; then 4-byte mask if MASK
    payload (XOR mask[i % 4] when masked)

No extensions are negotiated (no permessage-deflate), so RSV bits must be zero.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import struct

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
MAX_MESSAGE_BYTES = 1 << 20


class ProtocolViolation(Exception):
    """The peer broke the framing rules; the connection is closed with `code`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def accept_key(client_key: str) -> str:
    return base64.b64encode(hashlib.sha1((client_key + GUID).encode()).digest()).decode()


def handshake_response(client_key: str, protocol: str) -> bytes:
    return (
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {accept_key(client_key)}\r\nSec-WebSocket-Protocol: {protocol}\r\n\r\n"
    ).encode()


def encode_frame(opcode: int, payload: bytes) -> bytes:
    n = len(payload)
    if n < 126:
        header = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 1 << 16:
        header = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return header + payload


def _unmask(payload: bytes, mask: bytes) -> bytes:
    n = len(payload)
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


async def read_message(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The next whole message (continuations joined) or control frame, as (opcode, payload)."""
    opcode: int | None = None
    parts: list[bytes] = []
    size = 0
    while True:
        b0, b1 = await reader.readexactly(2)
        if b0 & 0x70:
            raise ProtocolViolation(1002, "reserved bits set")
        if not b1 & 0x80:
            raise ProtocolViolation(1002, "client frames must be masked")
        length = b1 & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", await reader.readexactly(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", await reader.readexactly(8))
        size += length
        if size > MAX_MESSAGE_BYTES:
            raise ProtocolViolation(1009, f"message over {MAX_MESSAGE_BYTES} bytes")
        mask = await reader.readexactly(4)
        payload = _unmask(await reader.readexactly(length), mask)
        frame_op = b0 & 0x0F
        if frame_op >= OP_CLOSE:
            if parts:  # legal in RFC 6455, but no client we test against does it
                raise ProtocolViolation(1002, "control frame inside a fragmented message is not supported")
            return frame_op, payload
        if frame_op != OP_CONTINUATION:
            opcode = frame_op
        elif opcode is None:
            raise ProtocolViolation(1002, "continuation without a first frame")
        parts.append(payload)
        if b0 & 0x80:
            return opcode, b"".join(parts)


def encode_masked_frame(opcode: int, payload: bytes, mask: bytes) -> bytes:
    """A client frame: same header with the MASK bit set, the 4-byte mask, then the masked payload."""
    n = len(payload)
    if n < 126:
        header = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    return header + mask + _unmask(payload, mask)


class FrameParser:
    """Incremental parser of server frames (unmasked). `feed` returns whole messages and control frames."""

    def __init__(self, max_message_bytes: int = 1 << 24) -> None:
        self.max_message_bytes = max_message_bytes
        self.buffer = b""
        self.opcode: int | None = None
        self.parts: list[bytes] = []

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buffer = self.buffer + data if self.buffer else data
        messages: list[tuple[int, bytes]] = []
        pos, size = 0, len(buffer)
        while size - pos >= 2:
            b0, b1 = buffer[pos], buffer[pos + 1]
            length, offset = b1 & 0x7F, pos + 2
            if length == 126:
                if size - offset < 2:
                    break
                (length,) = struct.unpack_from("!H", buffer, offset)
                offset += 2
            elif length == 127:
                if size - offset < 8:
                    break
                (length,) = struct.unpack_from("!Q", buffer, offset)
                offset += 8
            if length > self.max_message_bytes:
                raise ProtocolViolation(1009, f"frame of {length} bytes")
            mask = b""
            if b1 & 0x80:
                mask, offset = buffer[offset : offset + 4], offset + 4
            if size - offset < length:
                break
            payload = buffer[offset : offset + length]
            if mask:
                payload = _unmask(payload, mask)
            pos = offset + length
            opcode = b0 & 0x0F
            if opcode >= OP_CLOSE:
                messages.append((opcode, payload))
            elif b0 & 0x80 and opcode != OP_CONTINUATION and not self.parts:
                messages.append((opcode, payload))  # the common case: one unfragmented frame
            else:
                if opcode != OP_CONTINUATION:
                    self.opcode = opcode
                elif self.opcode is None:
                    raise ProtocolViolation(1002, "continuation without a first frame")
                self.parts.append(payload)
                if b0 & 0x80:
                    messages.append((self.opcode, b"".join(self.parts)))
                    self.opcode, self.parts = None, []
        self.buffer = buffer[pos:]
        return messages
