"""EngineEndpoint <-> EngineLink over real sockets, eventfds and shared memory: handshake, routing,
backpressure of the engine's send queue, refusals, and what each side sees when the other dies."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

from engine.ipc.client import EngineLink, LinkClosed, LinkFull
from engine.ipc.control import HandshakeError
from engine.ipc.messages import Audio, Cancel, Done, DoneReason, Error, Heartbeat, Inbound, Ready, Submit
from engine.ipc.server import EngineEndpoint
from tests.ipc.helpers import mapped_segments, shm_entries

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")
PCM_80MS = b"\x01\x00" * 1920  # one 80 ms frame of int16 at 24 kHz


class Harness:
    """Drives an EngineEndpoint and an asyncio gateway side from one thread, turn by turn."""

    def __init__(self, socket_path: str, **endpoint_options: object) -> None:
        self.loop = asyncio.new_event_loop()
        self.endpoint = EngineEndpoint(socket_path, **endpoint_options)  # type: ignore[arg-type]
        self.socket_path = socket_path
        self.inbox: list[tuple[int, Inbound]] = []

    def turn(self, gateway: bool = True) -> None:
        if gateway:
            self.loop.run_until_complete(asyncio.sleep(0.001))
        self.inbox += self.endpoint.poll(0)

    def run(self, awaitable: Awaitable[T], timeout_s: float = 5.0) -> T:
        task = asyncio.ensure_future(awaitable, loop=self.loop)
        deadline = time.monotonic() + timeout_s
        while not task.done():
            assert time.monotonic() < deadline, "timed out"
            self.turn()
        return task.result()

    def connect(self, **options: object) -> EngineLink:
        return self.run(EngineLink.connect(self.socket_path, **options))  # type: ignore[arg-type]

    def close(self) -> None:
        self.endpoint.close()
        self.loop.run_until_complete(asyncio.sleep(0.01))
        self.loop.close()


@pytest.fixture
def harness(socket_path: str, no_shm_leftovers: None):
    h = Harness(socket_path)
    yield h
    h.close()


def test_requests_and_replies_are_routed_per_link_and_per_request(harness: Harness) -> None:
    first, second = harness.connect(), harness.connect()
    assert sorted(harness.endpoint.new_links()) == sorted([first.link_id, second.link_id])
    assert not any(entry.startswith("vivace-ipc-") for entry in shm_entries())  # names unlinked at once
    assert len(mapped_segments()) >= 4  # both sides of both links are mapped, yet no name is in /dev/shm

    queues = {(link.link_id, rid): link.subscribe(rid) for link in (first, second) for rid in (1, 2)}
    for link in (first, second):
        link.send(Submit(1, "ryan", "english", (5, 6), 2, True))
        link.send(Submit(2, "ryan", "english", (7,), 1, True))
    while len(harness.inbox) < 4:
        harness.turn()
    assert sorted((link_id, msg.request_id) for link_id, msg in harness.inbox) == sorted(queues)
    events: list[object] = []
    for link in (first, second):
        link.on_engine_message(events.append)
    for link_id, rid in queues:
        harness.endpoint.send(link_id, Audio(rid, 0, PCM_80MS, first=True))
        harness.endpoint.send(link_id, Done(rid, DoneReason.COMPLETED, 1920, 1))
    harness.endpoint.send_many((link.link_id, Heartbeat(123, 4, 0)) for link in (first, second))
    harness.endpoint.send(first.link_id, Ready("m", True, 24000, ("ryan",), ("english",), "cpu", 8))
    harness.turn()
    for (_, rid), queue in queues.items():
        audio, done = queue.get_nowait(), queue.get_nowait()
        assert audio == Audio(rid, 0, PCM_80MS, first=True) and done.request_id == rid
    assert first.subscriptions == 0 and second.subscriptions == 0  # Done ends a subscription
    assert sorted(type(e).__name__ for e in events) == ["Heartbeat", "Heartbeat", "Ready"]
    assert first.ready.is_set()
    assert not second.ready.is_set()
    harness.run(first.close())
    harness.run(second.close())
    while len(harness.endpoint.links()) > 0:
        harness.turn()
    assert sorted(harness.endpoint.dead_links()) == sorted([first.link_id, second.link_id])
    assert mapped_segments() == []


def test_engine_send_queue_absorbs_a_gateway_that_stops_reading_then_delivers_everything_in_order(
    socket_path: str, no_shm_leftovers: None
) -> None:
    h = Harness(socket_path, max_backlog_bytes=512 * 1024)
    try:
        link = h.connect(audio_ring_bytes=64 * 1024)
        (link_id,) = h.endpoint.new_links()
        queue = link.subscribe(1)
        for i in range(40):  # the gateway loop is not running: nobody reads
            h.endpoint.send(link_id, Audio(1, i * 1920, PCM_80MS * 2))
        assert h.endpoint.pending_bytes(link_id) > 200_000  # most of it waits in the engine's backlog
        assert h.endpoint.dead_links() == []
        received: list[Audio] = []
        deadline = time.monotonic() + 5
        while len(received) < 40:
            assert time.monotonic() < deadline
            h.turn()  # the gateway drains and wakes the engine; the engine's poll flushes its backlog
            while not queue.empty():
                received.append(queue.get_nowait())
        assert [a.start_sample for a in received] == [i * 1920 for i in range(40)]
        assert all(a.pcm == PCM_80MS * 2 for a in received)
        assert h.endpoint.pending_bytes(link_id) == 0
        h.run(link.close())
    finally:
        h.close()


def test_engine_send_queue_is_bounded_and_overflow_closes_only_that_link(
    socket_path: str, no_shm_leftovers: None
) -> None:
    h = Harness(socket_path, max_backlog_bytes=256 * 1024)
    try:
        stuck, healthy = h.connect(audio_ring_bytes=64 * 1024), h.connect()
        stuck_id, healthy_id = stuck.link_id, healthy.link_id
        h.endpoint.new_links()
        queue = stuck.subscribe(1)
        for i in range(100):  # 100 x 7.7 KB: 64 KB ring + 256 KB backlog cannot hold it
            h.endpoint.send(stuck_id, Audio(1, i * 3840, PCM_80MS * 2))
        assert h.endpoint.dead_links() == [stuck_id]
        assert h.endpoint.links() == [healthy_id]
        h.endpoint.send(stuck_id, Audio(1, 0, PCM_80MS))  # sending to a dead link is a harmless no-op
        assert h.run(stuck.closed) == "link_overflow"
        messages = [queue.get_nowait() for _ in range(queue.qsize())]
        assert isinstance(messages[-1], Error) and messages[-1].code == "link_overflow"
        assert (
            all(isinstance(m, Audio) for m in messages[:-1]) and len(messages) > 1
        )  # ring contents delivered
        with pytest.raises(LinkClosed):
            stuck.send(Cancel(1))
        healthy_queue = healthy.subscribe(5)
        h.endpoint.send(healthy_id, Done(5, DoneReason.COMPLETED, 0, 0))
        h.turn()
        assert healthy_queue.get_nowait().request_id == 5
        h.run(healthy.close())
    finally:
        h.close()


def test_full_request_ring_raises_link_full_and_recovers_once_the_engine_drains(harness: Harness) -> None:
    link = harness.connect(request_ring_bytes=4096)
    sent = 0
    with pytest.raises(LinkFull):
        for sent in range(1000):  # noqa: B007 - `sent` is read after the loop
            link.send(Submit(sent + 1, "ryan", "english", tuple(range(20)), 20, True))
    harness.turn()
    assert len(harness.inbox) == sent  # everything accepted before LinkFull arrived, nothing more
    link.send(Cancel(1))
    harness.turn()
    assert harness.inbox[-1][1] == Cancel(1)
    harness.run(link.close())


def test_a_refused_handshake_raises_and_leaves_nothing_behind(
    socket_path: str, no_shm_leftovers: None
) -> None:
    h = Harness(socket_path, max_links=1)
    try:
        link = h.connect()
        with pytest.raises(HandshakeError, match="limit of 1 links"):
            h.connect()
        h.run(link.close())
    finally:
        h.close()
    assert mapped_segments() == []


async def test_connecting_to_nothing_fails_fast_and_leaves_nothing_behind(
    socket_path: str, no_shm_leftovers: None
) -> None:
    with pytest.raises(OSError):
        await EngineLink.connect(socket_path)
    assert mapped_segments() == []


def test_a_malformed_request_closes_that_link_with_protocol_error(harness: Harness) -> None:
    link = harness.connect()
    queue = link.subscribe(9)
    assert link._segment.to_engine.try_write(b"\xee\x00garbage")  # bypass the encoder on purpose
    os.eventfd_write(link._wake_engine, 1)
    assert harness.run(link.closed) == "protocol_error"
    assert harness.endpoint.dead_links() == [link.link_id]
    assert queue.get_nowait().code == "protocol_error"


def test_engine_close_tells_every_gateway_it_shut_down(socket_path: str, no_shm_leftovers: None) -> None:
    h = Harness(socket_path)
    link = h.connect()
    queue = link.subscribe(1)
    h.endpoint.close()
    assert h.loop.run_until_complete(asyncio.wait_for(link.closed, 2)) == "engine_shutdown"
    assert queue.get_nowait().code == "engine_shutdown"
    h.loop.close()
    assert mapped_segments() == []


def test_killed_gateway_is_reported_within_a_second_and_leaves_nothing(harness: Harness) -> None:
    """kill -9 a gateway worker mid-stream: the engine sees the link die at once, unmaps it, and
    /dev/shm is as before."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.ipc.gateway_peer", harness.socket_path, "4"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        active: dict[int, set[int]] = {}
        streaming = False
        deadline = time.monotonic() + 20
        while not streaming:
            assert time.monotonic() < deadline and child.poll() is None
            harness.turn(gateway=False)
            for link_id, msg in harness.inbox:
                active.setdefault(link_id, set()).add(msg.request_id)  # type: ignore[union-attr]
            harness.inbox.clear()
            for link_id, rids in active.items():
                harness.endpoint.send_many((link_id, Audio(rid, 0, PCM_80MS)) for rid in rids)
            streaming = (
                bool(select.select([child.stdout], [], [], 0.005)[0])
                and "streaming" in child.stdout.readline()
            )
        (link_id,) = active
        assert len(mapped_segments(child.pid)) == 1 and "(deleted)" in mapped_segments(child.pid)[0]

        child.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        dead: list[int] = []
        while not dead:
            assert time.monotonic() - killed < 1.0, "engine did not notice the dead gateway within 1 s"
            harness.endpoint.send_many((link_id, Audio(rid, 0, PCM_80MS)) for rid in active[link_id])
            harness.endpoint.poll(0.05)
            dead = harness.endpoint.dead_links()
        assert dead == [link_id]
        assert harness.endpoint.links() == []
        assert mapped_segments() == []  # the engine released its mapping of the dead link
    finally:
        child.kill()
        child.wait()


async def test_gateway_sees_engine_death_within_a_second_even_with_no_reply_pending(
    socket_path: str, no_shm_leftovers: None
) -> None:
    """The control socket reports death even when the engine dies silently (no Done, no goodbye)."""
    script = (
        "import sys, time; sys.path.insert(0, sys.argv[1]);"
        "from engine.ipc.server import EngineEndpoint;"
        "e = EngineEndpoint(sys.argv[2]);"
        "[e.poll(0.05) for _ in iter(int, 1)]"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(REPO), socket_path])
    try:
        from engine.ipc.process import wait_for_socket_async

        await wait_for_socket_async(socket_path, 20, proc)
        link = await EngineLink.connect(socket_path)
        queues = [link.subscribe(rid) for rid in range(1, 21)]
        for rid in range(1, 21):
            link.send(Submit(rid, "ryan", "english", (1,), 1, True))
        await asyncio.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        assert await asyncio.wait_for(link.closed, 1.0) == "engine_died"
        errors = [await asyncio.wait_for(q.get(), 1.0) for q in queues]
        assert time.monotonic() - killed < 1.0
        assert all(isinstance(e, Error) and e.code == "engine_died" for e in errors)
        assert [e.request_id for e in errors] == list(range(1, 21))
        assert link.subscribe(99).get_nowait().code == "engine_died"  # late subscribers learn it too
        assert mapped_segments() == []
    finally:
        proc.kill()
        proc.wait()


def test_a_connection_that_never_says_hello_is_dropped_after_the_handshake_timeout(
    socket_path: str, no_shm_leftovers: None
) -> None:
    import socket

    from engine.ipc.control import unix_address

    h = Harness(socket_path, handshake_timeout_s=0.2)
    try:
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent.connect(unix_address(socket_path))
        silent.setblocking(False)
        assert h.endpoint.poll(0.05) == []
        with pytest.raises(BlockingIOError):
            silent.recv(16)  # accepted and waiting for a hello
        assert h.endpoint.poll(0.3) == []
        assert silent.recv(16) == b""  # given up on and closed by the engine
        silent.close()
        link = h.connect()  # still serving
        assert h.endpoint.new_links() == [link.link_id]
        h.run(link.close())
    finally:
        h.close()


def test_a_stale_socket_file_is_replaced_but_a_live_one_is_refused(tmp_path: Path) -> None:
    import socket

    path = str(tmp_path / "engine.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # the file remains, nobody listens: what a killed engine leaves behind
    endpoint = EngineEndpoint(path)
    try:
        with pytest.raises(OSError, match="already listening"):
            EngineEndpoint(path)
    finally:
        endpoint.close()
    assert not os.path.exists(path)  # close() removes its socket file
