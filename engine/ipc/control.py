"""The control socket of a link: addresses, the two-message handshake, and the goodbye byte.

A link is one Unix stream connection from a gateway worker to the engine. It carries three things and
nothing else; all data travels through the shared-memory rings.

    gateway worker                                            engine
    1. Segment.create(), two eventfds
    2. connect ────────────────────────────────────────────▶ accept
    3. HELLO  + SCM_RIGHTS[wake_engine, wake_gateway] ─────▶ attach segment by name, keep both fds
    4.        ◀───────────────────────────────────────────── ACK (status 0 + link id, or status != 0 + why)
    5. unlink the segment's name; add_reader(wake_gateway), add_reader(socket)
       ... requests and replies flow through the rings; eventfd writes wake the other side ...
    6.        ◀───────────────────────────────────────────── optional GOODBYE byte, then close
       EOF on either side = the peer is gone (closed, exited or killed): the kernel reports it at once.

    HELLO  = 4s "VIVH"  u16 version  u16 flags (0)  u16 name length  name (utf-8)
    ACK    = 4s "VIVA"  u16 version  u16 status     u32 link id      u16 message length  message (utf-8)
    GOODBYE= 1 byte: b"S" engine shutting down, b"O" gateway too slow (send backlog over its cap),
             b"P" protocol error (the engine could not decode a request)

Addresses: a path starting with "@" names the Linux abstract namespace (no file, gone with the
listener); anything else is a filesystem path.
"""

from __future__ import annotations

import os
import socket
import stat
import struct

PROTOCOL_VERSION = 1
HANDSHAKE_TIMEOUT_S = 2.0  # both sides give up on a half-done handshake after this long

HELLO = struct.Struct("<4sHHH")
ACK = struct.Struct("<4sHHIH")
HELLO_MAGIC = b"VIVH"
ACK_MAGIC = b"VIVA"
STATUS_OK = 0
STATUS_REFUSED = 1

GOODBYE_SHUTDOWN = b"S"
GOODBYE_OVERFLOW = b"O"
GOODBYE_PROTOCOL = b"P"
GOODBYE_REASONS = {
    GOODBYE_SHUTDOWN: "engine_shutdown",
    GOODBYE_OVERFLOW: "link_overflow",
    GOODBYE_PROTOCOL: "protocol_error",
}

_MAX_UNIX_PATH = 107


class HandshakeError(ConnectionError):
    """The link could not be set up (refused, malformed, timed out, or the peer went away)."""


def unix_address(path: str) -> str | bytes:
    """The `socket.bind`/`connect` address for `path` ("@name" means the abstract namespace)."""
    if not path:
        raise ValueError("socket path must not be empty")
    abstract = path.startswith("@")
    raw = b"\0" + path[1:].encode("utf-8") if abstract else path.encode("utf-8")
    if len(raw) > _MAX_UNIX_PATH:
        raise ValueError(f"socket path {path!r} is longer than the {_MAX_UNIX_PATH}-byte Unix limit")
    return raw if abstract else path


def encode_hello(segment_name: str) -> bytes:
    name = segment_name.encode("utf-8")
    return HELLO.pack(HELLO_MAGIC, PROTOCOL_VERSION, 0, len(name)) + name


def hello_length(head: bytes) -> int | None:
    """Total HELLO length once its fixed part is in `head`, else None."""
    if len(head) < HELLO.size:
        return None
    return HELLO.size + HELLO.unpack_from(head, 0)[3]


def decode_hello(data: bytes) -> str:
    magic, version, _flags, n = HELLO.unpack_from(data, 0)
    if magic != HELLO_MAGIC:
        raise HandshakeError("not a Vivace link hello")
    if version != PROTOCOL_VERSION:
        raise HandshakeError(
            f"link protocol version {version} is not supported (engine speaks {PROTOCOL_VERSION})"
        )
    if len(data) != HELLO.size + n:
        raise HandshakeError("malformed link hello")
    return data[HELLO.size :].decode("utf-8")


def encode_ack(status: int, link_id: int, message: str = "") -> bytes:
    text = message.encode("utf-8")[:4000]
    return ACK.pack(ACK_MAGIC, PROTOCOL_VERSION, status, link_id, len(text)) + text


def decode_ack_head(head: bytes) -> tuple[int, int, int]:
    """(status, link_id, message length) from the fixed part of an ACK."""
    magic, version, status, link_id, n = ACK.unpack(head)
    if magic != ACK_MAGIC:
        raise HandshakeError("the socket did not answer like a Vivace engine")
    if version != PROTOCOL_VERSION:
        raise HandshakeError(f"engine speaks link protocol {version}, this side {PROTOCOL_VERSION}")
    return status, link_id, n


def new_listener(path: str, backlog: int = 64) -> socket.socket:
    """A non-blocking listening Unix stream socket; a stale socket file at `path` is replaced."""
    address = unix_address(path)
    if isinstance(address, str) and os.path.exists(address):
        if not stat.S_ISSOCK(os.stat(address).st_mode):
            raise FileExistsError(f"{address} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(address)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(address)  # a previous engine died without removing it
        else:
            raise OSError(f"another process is already listening on {address}")
        finally:
            probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address)
        listener.listen(backlog)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    return listener
