"""The gateway worker's end of its link to the engine (asyncio, torch-free): send requests, get each
request's replies on its own queue, and learn the moment the engine is gone.

    link = await EngineLink.connect("@vivace-engine")
    await link.ready.wait()                       # the engine sent Ready
    events = link.subscribe(request_id)           # before sending, so no reply can be missed
    link.send(Submit(request_id, ...))            # LinkFull / LinkClosed on failure, never blocks
    while True:
        msg = await events.get()                  # Audio ..., then Done (or Error)
        if isinstance(msg, (Done, Error)): break
    link.unsubscribe(request_id)

Replies are routed by request_id; Ready, Heartbeat and Error(request_id=0) go to the callbacks given to
`on_engine_message`. A request's stream ends at its Done (the engine sends Error, then Done(ERROR), for
a failed request) or at an Error pushed by the link itself: when the engine dies (control socket EOF),
`closed` resolves with the reason and every subscribed request gets `Error(code=reason)`, with reason
"engine_died" for a crash, or "engine_shutdown" / "link_overflow" / "protocol_error" when the engine
said why before closing, or "link_closed" after our own `close()`.

Wake-ups: the engine writes an eventfd registered with `loop.add_reader`; one callback drains the
reply ring (at most `DRAIN_BATCH` records per loop turn, then yields). Our own wake-ups of the engine
are coalesced to one eventfd write per loop turn. No thread, no timer, no polling: an idle link costs
nothing. Use the link only from its event loop's thread.

Per-request queues are unbounded: the engine paces generation by playback deadlines, so a queue holds
at most what the engine runs ahead; a consumer that stops reading should unsubscribe (or cancel).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable

from engine.ipc import control
from engine.ipc.messages import Audio, Done, Error, Heartbeat, Inbound, Outbound, Ready
from engine.ipc.ring import RingCorrupted, validate_capacity
from engine.ipc.segment import Segment
from engine.ipc.wire import WireError, decode, encode_parts, encoded_size, is_inbound

log = logging.getLogger("engine.ipc")

DEFAULT_REQUEST_RING_BYTES = 1 << 20
DEFAULT_AUDIO_RING_BYTES = 8 << 20
DRAIN_BATCH = 512

ENGINE_DIED = "engine_died"
LINK_CLOSED = "link_closed"


class LinkClosed(ConnectionError):
    """The link is closed (the engine died, said goodbye, or `close()` was called)."""


class LinkFull(BufferError):
    """The request ring is full right now; nothing was written. Retry later or fail the request."""


EngineCallback = Callable[[Outbound], None]


class EngineLink:
    """One gateway worker's link to the engine. Create with `await EngineLink.connect(path)`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, segment: Segment,
                 wake_engine: int, wake_gateway: int, link_id: int) -> None:  # fmt: skip
        self.link_id = link_id
        self.ready = asyncio.Event()
        self.closed: asyncio.Future[str] = loop.create_future()
        self._loop = loop
        self._sock = sock
        self._segment = segment
        self._wake_engine = wake_engine
        self._wake_gateway = wake_gateway
        self._queues: dict[int, asyncio.Queue[Outbound]] = {}
        self._callbacks: list[EngineCallback] = []
        self._signal_scheduled = False
        self._drain_scheduled = False
        self._goodbye: str | None = None
        loop.add_reader(wake_gateway, self._on_wake)
        loop.add_reader(sock.fileno(), self._on_socket)

    # ------------------------------------------------------------ setup

    @classmethod
    async def connect(
        cls,
        socket_path: str,
        *,
        request_ring_bytes: int = DEFAULT_REQUEST_RING_BYTES,
        audio_ring_bytes: int = DEFAULT_AUDIO_RING_BYTES,
        checksums: bool = False,
        timeout_s: float = control.HANDSHAKE_TIMEOUT_S,
    ) -> EngineLink:
        """Create this worker's segment and eventfds, hand them to the engine, and unlink the segment name.

        Ring sizes must be powers of two (>= 4 KiB); `checksums` adds a crc32 per record (tests).
        Raises HandshakeError (refused, timed out, or not an engine) or OSError (nothing listening);
        on any failure everything created here is freed and nothing is left in /dev/shm.
        """
        loop = asyncio.get_running_loop()
        address = control.unix_address(socket_path)
        validate_capacity(request_ring_bytes)
        validate_capacity(audio_ring_bytes)
        segment: Segment | None = None
        wake_engine = wake_gateway = -1
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            async with asyncio.timeout(timeout_s):
                # Connect first: a caller retrying while the engine starts creates no segment per try.
                await loop.sock_connect(sock, address)
                segment = Segment.create(request_ring_bytes, audio_ring_bytes, checksums=checksums)
                wake_engine = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                wake_gateway = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                socket.send_fds(sock, [control.encode_hello(segment.name)], [wake_engine, wake_gateway])
                status, link_id, n = control.decode_ack_head(
                    await _recv_exactly(loop, sock, control.ACK.size)
                )
                message = (await _recv_exactly(loop, sock, n)).decode("utf-8", "replace") if n else ""
            if status != control.STATUS_OK:
                raise control.HandshakeError(f"engine refused the link: {message}")
        except BaseException as exc:
            if segment is not None:
                segment.close()
            sock.close()
            for fd in (wake_engine, wake_gateway):
                if fd >= 0:
                    os.close(fd)
            if isinstance(exc, TimeoutError):
                raise control.HandshakeError(
                    f"no engine handshake on {socket_path!r} within {timeout_s} s"
                ) from None
            raise
        segment.unlink()  # the engine has it mapped: from now on nothing can leak into /dev/shm
        return cls(loop, sock, segment, wake_engine, wake_gateway, link_id)

    # ------------------------------------------------------------ public surface

    def send(self, msg: Inbound) -> None:
        """Queue one request record for the engine without blocking.

        Raises LinkClosed once the link is closed, LinkFull when the request ring has no room now,
        ValueError/WireError for a record that cannot be encoded or is too large for the ring.
        """
        if self.closed.done():
            raise LinkClosed(f"link to the engine is closed ({self.closed.result()})")
        if not is_inbound(msg):
            raise TypeError(f"{type(msg).__name__} is not a gateway -> engine record")
        parts = encode_parts(msg)
        ring = self._segment.to_engine
        if encoded_size(parts) > ring.max_record_bytes:
            raise ValueError(
                f"{type(msg).__name__} record exceeds the request ring limit {ring.max_record_bytes}"
            )
        if not ring.try_write(*parts):
            raise LinkFull(f"request ring full ({ring.capacity} bytes); the engine is not draining it")
        self._schedule_signal()

    def subscribe(self, request_id: int) -> asyncio.Queue[Outbound]:
        """The queue that will receive every Audio/Done/Error for `request_id` (ids unique per link)."""
        if request_id <= 0:
            raise ValueError("request ids must be positive (0 addresses the engine itself)")
        if request_id in self._queues:
            raise ValueError(f"request {request_id} is already subscribed")
        queue: asyncio.Queue[Outbound] = asyncio.Queue()
        if self.closed.done():
            queue.put_nowait(self._death_error(request_id))
        else:
            self._queues[request_id] = queue
        return queue

    def unsubscribe(self, request_id: int) -> None:
        """Stop routing replies for `request_id` (later ones are dropped). Idempotent."""
        self._queues.pop(request_id, None)

    def on_engine_message(self, callback: EngineCallback) -> None:
        """Call `callback(msg)` for Ready, Heartbeat and engine-level Error(request_id=0)."""
        self._callbacks.append(callback)

    @property
    def subscriptions(self) -> int:
        return len(self._queues)

    async def close(self, reason: str = LINK_CLOSED) -> None:
        """Close the link (the engine sees EOF and cancels this worker's requests). Idempotent.

        `reason` is what open requests get as their Error code: ENGINE_DIED when giving up on a hung engine.
        """
        self._shutdown(reason)

    # ------------------------------------------------------------ wake-ups

    def _schedule_signal(self) -> None:
        if not self._signal_scheduled:
            self._signal_scheduled = True
            self._loop.call_soon(self._signal_engine)

    def _signal_engine(self) -> None:
        self._signal_scheduled = False
        if not self.closed.done():
            with contextlib.suppress(BlockingIOError):
                os.eventfd_write(self._wake_engine, 1)

    def _on_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._wake_gateway)  # clear before draining: a later write re-arms it
        self._drain()

    def _drain(self) -> None:
        self._drain_scheduled = False
        if self.closed.done():
            return
        ring = self._segment.to_gateway
        try:
            for _ in range(DRAIN_BATCH):
                view = ring.peek()
                if view is None:
                    break
                msg = decode(view)
                ring.advance()
                self._dispatch(msg)
            else:
                if not self._drain_scheduled:  # more waiting: continue next loop turn, let others run
                    self._drain_scheduled = True
                    self._loop.call_soon(self._drain)
            if ring.writer_waiting():
                self._schedule_signal()  # the engine holds a backlog: tell it there is room
        except (WireError, RingCorrupted) as exc:
            log.error("engine sent a bad record (%s); closing the link", exc)
            self._shutdown("protocol_error")

    def _dispatch(self, msg: Inbound | Outbound) -> None:
        kind = type(msg)
        if kind is Audio or kind is Done or (kind is Error and msg.request_id != 0):
            queue = self._queues.get(msg.request_id)  # type: ignore[union-attr]
            if queue is not None:
                queue.put_nowait(msg)
                if kind is Done:
                    del self._queues[msg.request_id]  # type: ignore[union-attr]
            return
        if kind is Ready:
            self.ready.set()
        elif kind is not Heartbeat and kind is not Error:
            log.error("engine sent a %s record; ignored", kind.__name__)
            return
        for callback in list(self._callbacks):
            try:
                callback(msg)  # type: ignore[arg-type]
            except Exception:
                log.exception("engine message callback failed")

    def _on_socket(self) -> None:
        try:
            data = self._sock.recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._goodbye = control.GOODBYE_REASONS.get(data[:1], self._goodbye)
            return
        self._shutdown(self._goodbye or ENGINE_DIED)

    # ------------------------------------------------------------ teardown

    def _death_error(self, request_id: int) -> Error:
        reason = self.closed.result()
        return Error(request_id=request_id, code=reason, message=_REASON_TEXT.get(reason, reason))

    def _shutdown(self, reason: str) -> None:
        if self.closed.done():
            return
        if reason != LINK_CLOSED and reason != "protocol_error":
            with contextlib.suppress(WireError, RingCorrupted):
                self._drain_rest()  # replies the engine published before it went away still count
        self.closed.set_result(reason)
        self.ready.clear()
        self._loop.remove_reader(self._wake_gateway)
        self._loop.remove_reader(self._sock.fileno())
        queues, self._queues = self._queues, {}
        for request_id, queue in queues.items():
            queue.put_nowait(self._death_error(request_id))
        self._sock.close()
        for fd in (self._wake_engine, self._wake_gateway):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._segment.close()
        if reason != LINK_CLOSED:
            log.warning("engine link closed: %s", reason)

    def _drain_rest(self) -> None:
        ring = self._segment.to_gateway
        while (view := ring.peek()) is not None:
            msg = decode(view)
            ring.advance()
            self._dispatch(msg)


_REASON_TEXT = {
    ENGINE_DIED: "the engine process exited or crashed",
    "engine_shutdown": "the engine shut down",
    "link_overflow": "the engine closed this link: the gateway stopped reading replies",
    "protocol_error": "the engine link carried a malformed record",
    LINK_CLOSED: "the gateway closed its engine link",
}


async def _recv_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = await loop.sock_recv(sock, n - len(data))
        if not chunk:
            raise control.HandshakeError("the engine closed the connection during the handshake")
        data += chunk
    return bytes(data)
