"""The engine's end of every gateway link: receive requests, send replies, never block the engine loop.

`EngineEndpoint` listens on a Unix socket; each gateway worker connects once and brings its own
shared-memory segment (two rings, see engine/ipc/segment.py) and two eventfds (see engine/ipc/control.py).
Plain blocking code, no asyncio, no threads:

    endpoint = EngineEndpoint("@vivace-engine")
    while running:
        for link_id in endpoint.new_links(): endpoint.send(link_id, Ready(...))
        for link_id in endpoint.dead_links(): cancel that link's requests
        for link_id, msg in endpoint.poll(timeout_s=0 if busy else None): handle msg
        ... run a step ...
        endpoint.send_many((link_id, Audio(...)) for each published chunk)

`poll` drains every link's request ring and, only when there is nothing to return, sleeps in epoll on
the links' eventfds and sockets (zero CPU while idle). It returns early, possibly with [], when a link
connected or died so the loop can react at once.

Backpressure: when a link's reply ring is full, `send` keeps the record in that link's local backlog
(order preserved, nothing dropped) and raises the ring's `writer_waiting` flag; the gateway wakes the
engine after draining, and every `poll`/`flush` retries the backlog. While a backlog exists `poll`
sleeps at most `backlog_retry_s` (1 ms), a safety net for the one wake-up that x86-64 store->load
reordering could lose. A backlog over `max_backlog_bytes` (default 64 MiB, i.e. on top of the 8 MiB
ring) means that gateway worker has stopped reading: the link is closed with a GOODBYE "O" and
reported by `dead_links()` like any dead link.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.ipc import control
from engine.ipc.messages import Inbound, Outbound
from engine.ipc.ring import RingCorrupted
from engine.ipc.segment import Segment
from engine.ipc.wire import WireError, decode, encode_parts, encoded_size, is_inbound

log = logging.getLogger("engine.ipc")

DEFAULT_MAX_BACKLOG_BYTES = 64 << 20
DEFAULT_MAX_LINKS = 64
_RECORD_OVERHEAD = 32  # bytes charged per backlog entry on top of its payload


@dataclass(eq=False)
class _Link:
    id: int
    sock: socket.socket
    segment: Segment
    wake_engine: int  # eventfd the gateway writes; we read it to clear it
    wake_gateway: int  # eventfd we write after publishing replies
    backlog: deque[bytes] = field(default_factory=deque)
    backlog_bytes: int = 0


@dataclass(eq=False)
class _Pending:
    sock: socket.socket
    deadline: float
    data: bytearray = field(default_factory=bytearray)
    fds: list[int] = field(default_factory=list)


class EngineEndpoint:
    """Serves any number of gateway-worker links on one Unix socket. Not thread-safe (one engine loop)."""

    def __init__(
        self,
        socket_path: str,
        *,
        max_backlog_bytes: int = DEFAULT_MAX_BACKLOG_BYTES,
        max_links: int = DEFAULT_MAX_LINKS,
        backlog_retry_s: float = 0.001,
        handshake_timeout_s: float = control.HANDSHAKE_TIMEOUT_S,
    ) -> None:
        self.socket_path = socket_path
        self.max_backlog_bytes = max_backlog_bytes
        self.max_links = max_links
        self.backlog_retry_s = backlog_retry_s
        self.handshake_timeout_s = handshake_timeout_s
        self._links: dict[int, _Link] = {}
        self._pending: dict[int, _Pending] = {}
        self._by_fd: dict[int, tuple[str, object]] = {}
        self._new: list[int] = []
        self._dead: list[int] = []
        self._next_id = 1
        self._changed = False
        self._closed = False
        self._epoll = select.epoll()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            self._listener = control.new_listener(socket_path)
        except BaseException:
            os.close(self._wake_fd)
            self._epoll.close()
            raise
        self._watch(self._listener.fileno(), "listen", None)
        self._watch(self._wake_fd, "wakeup", None)

    # ------------------------------------------------------------ public surface

    def poll(self, timeout_s: float | None) -> list[tuple[int, Inbound]]:
        """Every inbound record waiting on any link, as (link_id, record), in per-link order.

        Blocks up to `timeout_s` (None: forever; 0: never) only while there is nothing to return; returns
        [] on timeout, on `wakeup()`, and when a link connected or died (see `new_links`/`dead_links`).
        """
        self._check_open()
        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        self._changed = False
        while True:
            self.flush()
            received = self._drain()
            if received or self._changed:
                return received
            now = time.monotonic()
            wait = -1.0 if deadline is None else max(0.0, deadline - now)
            if any(link.backlog for link in self._links.values()):
                wait = self.backlog_retry_s if wait < 0 else min(wait, self.backlog_retry_s)
            if self._pending:
                first = max(0.0, min(p.deadline for p in self._pending.values()) - now)
                wait = first if wait < 0 else min(wait, first)
            events = self._epoll.poll(wait)
            woken = False
            for fd, mask in events:
                woken |= self._on_event(fd, mask)
            self._expire_handshakes()
            if woken:
                return self._drain()
            if not events and deadline is not None and time.monotonic() >= deadline:
                return []

    def send(self, link_id: int, msg: Outbound) -> None:
        """Publish one record to a link. Never blocks, never drops (see the module docstring on backlog).

        Sending to a link that has died is a no-op (its death is reported by `dead_links`); an id that
        never existed raises KeyError; a record larger than the ring's limit raises ValueError.
        """
        link = self._link(link_id)
        if link is not None and self._put(link, msg):
            self._signal(link)

    def send_many(self, items: Iterable[tuple[int, Outbound]]) -> None:
        """`send` for many records, waking each gateway worker once at the end."""
        dirty: dict[int, _Link] = {}
        for link_id, msg in items:
            link = self._link(link_id)
            if link is not None and self._put(link, msg):
                dirty[link.id] = link
        for link in dirty.values():
            if link.id in self._links:
                self._signal(link)

    def flush(self) -> None:
        """Move backlogged records into rings that have room again (also done by every `poll`)."""
        for link in list(self._links.values()):
            if not link.backlog:
                continue
            ring = link.segment.to_gateway
            wrote = False
            while link.backlog and ring.try_write(link.backlog[0]):
                link.backlog_bytes -= len(link.backlog.popleft()) + _RECORD_OVERHEAD
                wrote = True
            if not link.backlog:
                ring.set_writer_waiting(False)
            if wrote:
                self._signal(link)

    def new_links(self) -> list[int]:
        """Links that completed their handshake since the last call (send them Ready when ready)."""
        new, self._new = [p for p in self._new if p in self._links], []
        return new

    def dead_links(self) -> list[int]:
        """Links that closed, died, overflowed or misbehaved since the last call: cancel their requests."""
        dead, self._dead = self._dead, []
        return dead

    def links(self) -> list[int]:
        """Ids of the live links (e.g. to broadcast a Heartbeat)."""
        return list(self._links)

    def pending_bytes(self, link_id: int) -> int:
        """Bytes of replies waiting in a link's local backlog because its ring is full (0 if unknown)."""
        link = self._links.get(link_id)
        return link.backlog_bytes if link is not None else 0

    def wakeup(self) -> None:
        """Make a blocked `poll` return now; safe from a signal handler or another thread."""
        with contextlib.suppress(OSError):
            os.eventfd_write(self._wake_fd, 1)

    def fileno(self) -> int:
        """The epoll descriptor: readable whenever `poll` has something to do (for outer event loops)."""
        return self._epoll.fileno()

    def close(self) -> None:
        """Say goodbye to every link, free every segment mapping and descriptor, remove the socket file."""
        if self._closed:
            return
        for link in list(self._links.values()):
            self._drop(link, control.GOODBYE_SHUTDOWN, report=False)
        for fd in list(self._pending):
            self._drop_pending(fd)
        self._unwatch(self._listener.fileno())
        self._listener.close()
        address = control.unix_address(self.socket_path)
        if isinstance(address, str):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address)
        self._unwatch(self._wake_fd)
        os.close(self._wake_fd)
        self._epoll.close()
        self._closed = True

    def __enter__(self) -> EngineEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ sending

    def _link(self, link_id: int) -> _Link | None:
        link = self._links.get(link_id)
        if link is None and not (0 < link_id < self._next_id):
            raise KeyError(f"no link {link_id} was ever connected")
        return link

    def _put(self, link: _Link, msg: Outbound) -> bool:
        """Write or backlog one record; True if it went into the ring (the gateway needs a wake-up)."""
        parts = encode_parts(msg)
        ring = link.segment.to_gateway
        size = encoded_size(parts)
        if size > ring.max_record_bytes:
            raise ValueError(
                f"{type(msg).__name__} of {size} bytes exceeds the ring limit {ring.max_record_bytes}"
            )
        if not link.backlog and ring.try_write(*parts):
            return True
        # Copy now: the caller may reuse its PCM buffer once send() returns.
        link.backlog.append(b"".join(parts))
        link.backlog_bytes += size + _RECORD_OVERHEAD
        ring.set_writer_waiting(True)
        if link.backlog_bytes > self.max_backlog_bytes:
            log.warning("link %d: gateway stopped reading (%d bytes backlogged); closing it", link.id,
                        link.backlog_bytes)  # fmt: skip
            self._drop(link, control.GOODBYE_OVERFLOW)
        return False

    def _signal(self, link: _Link) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_write(link.wake_gateway, 1)

    # ------------------------------------------------------------ receiving

    def _drain(self) -> list[tuple[int, Inbound]]:
        received: list[tuple[int, Inbound]] = []
        for link in list(self._links.values()):
            ring = link.segment.to_engine
            try:
                while (view := ring.peek()) is not None:
                    msg = decode(view)
                    ring.advance()
                    if not is_inbound(msg):
                        raise WireError(f"{type(msg).__name__} is not a gateway -> engine record")
                    received.append((link.id, msg))  # type: ignore[arg-type]
            except (WireError, RingCorrupted) as exc:
                log.error("link %d sent a bad record (%s); closing it", link.id, exc)
                self._drop(link, control.GOODBYE_PROTOCOL)
        return received

    def _on_event(self, fd: int, events: int) -> bool:
        """Handle one epoll event; True if the loop was asked to return (wakeup)."""
        kind, obj = self._by_fd.get(fd, ("gone", None))
        if kind == "wake":
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(fd)
        elif kind == "sock":
            self._on_link_socket(obj)  # type: ignore[arg-type]
        elif kind == "listen":
            self._accept()
        elif kind == "pending":
            self._on_pending(fd)
        elif kind == "wakeup":
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(fd)
            return True
        return False

    def _on_link_socket(self, link: _Link) -> None:
        try:
            data = link.sock.recv(256)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(link, None)
        # Gateways send nothing after the handshake; stray bytes are ignored.

    # ------------------------------------------------------------ handshakes

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: keep serving the links we have
                log.error("accept failed: %s", exc)
                return
            sock.setblocking(False)
            pending = _Pending(sock, time.monotonic() + self.handshake_timeout_s)
            self._pending[sock.fileno()] = pending
            self._watch(sock.fileno(), "pending", pending)

    def _on_pending(self, fd: int) -> None:
        pending = self._pending[fd]
        try:
            data, fds, _flags, _addr = socket.recv_fds(pending.sock, 4096, 4)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        pending.fds.extend(fds)
        if not data:  # closed before finishing (e.g. wait_for_socket's probe)
            self._drop_pending(fd)
            return
        pending.data += data
        total = control.hello_length(bytes(pending.data))
        if total is None or len(pending.data) < total:
            return
        self._complete(fd, pending, bytes(pending.data[:total]))

    def _complete(self, fd: int, pending: _Pending, hello: bytes) -> None:
        try:
            if len(self._links) >= self.max_links:
                raise control.HandshakeError(f"engine already serves its limit of {self.max_links} links")
            name = control.decode_hello(hello)
            if len(pending.fds) != 2:
                raise control.HandshakeError(f"hello must carry 2 eventfds, got {len(pending.fds)}")
            segment = Segment.attach(name)
        except (control.HandshakeError, OSError, RingCorrupted, UnicodeDecodeError, ValueError) as exc:
            log.warning("refused a link: %s", exc)
            with contextlib.suppress(OSError):
                pending.sock.send(control.encode_ack(control.STATUS_REFUSED, 0, str(exc)))
            self._drop_pending(fd)
            return
        self._unwatch(fd)
        del self._pending[fd]
        wake_engine, wake_gateway = pending.fds
        link = _Link(self._next_id, pending.sock, segment, wake_engine, wake_gateway)
        self._next_id += 1
        try:
            pending.sock.send(control.encode_ack(control.STATUS_OK, link.id))
        except OSError:
            self._links[link.id] = link  # so _drop frees it all uniformly
            self._drop(link, None, report=False)
            return
        self._links[link.id] = link
        self._watch(link.sock.fileno(), "sock", link)
        self._watch(link.wake_engine, "wake", link)
        self._new.append(link.id)
        self._changed = True

    def _expire_handshakes(self) -> None:
        now = time.monotonic()
        for fd, pending in list(self._pending.items()):
            if now >= pending.deadline:
                log.warning("a gateway connected but sent no hello within %.1f s", self.handshake_timeout_s)
                self._drop_pending(fd)

    def _drop_pending(self, fd: int) -> None:
        pending = self._pending.pop(fd)
        self._unwatch(fd)
        pending.sock.close()
        for extra in pending.fds:
            with contextlib.suppress(OSError):
                os.close(extra)

    # ------------------------------------------------------------ teardown

    def _drop(self, link: _Link, goodbye: bytes | None, *, report: bool = True) -> None:
        if self._links.pop(link.id, None) is None:
            return
        self._unwatch(link.sock.fileno())
        self._unwatch(link.wake_engine)
        if goodbye is not None:
            with contextlib.suppress(OSError):
                link.sock.send(goodbye)
        link.sock.close()
        for fd in (link.wake_engine, link.wake_gateway):
            with contextlib.suppress(OSError):
                os.close(fd)
        link.backlog.clear()
        link.segment.close()
        if report:
            self._dead.append(link.id)
            self._changed = True

    def _watch(self, fd: int, kind: str, obj: object) -> None:
        self._epoll.register(fd, select.EPOLLIN)
        self._by_fd[fd] = (kind, obj)

    def _unwatch(self, fd: int) -> None:
        if self._by_fd.pop(fd, None) is not None:
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("EngineEndpoint is closed")
