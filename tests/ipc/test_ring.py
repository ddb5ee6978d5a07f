"""The shared-memory ring: records arrive whole, in order and intact, a full ring refuses instead of
dropping or overwriting, and it refuses to run where its memory-ordering assumption does not hold."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.ipc.ring import Ring, RingCorrupted, UnsupportedPlatform, check_platform, region_bytes
from engine.ipc.segment import Segment
from tests.ipc.helpers import payload_stream, shm_entries

REPO = Path(__file__).resolve().parents[2]


def _local_ring(capacity: int = 4096, *, checksums: bool = True) -> tuple[Ring, Ring, bytearray]:
    """A producer view and a consumer view of one ring in process memory."""
    memory = bytearray(region_bytes(capacity))
    producer = Ring.create(memoryview(memory), capacity, checksums=checksums)
    consumer = Ring(memoryview(memory))
    return producer, consumer, memory


def test_records_come_out_whole_and_in_order_across_wraps_in_one_process() -> None:
    producer, consumer, _ = _local_ring(4096)
    expected = list(payload_stream(seed=7, count=3000, max_bytes=1500))
    received: list[bytes] = []
    pending = list(expected)
    while pending or len(received) < len(expected):
        while pending and producer.try_write(pending[0]):
            pending.pop(0)
        while (record := consumer.read()) is not None:
            received.append(record)
    assert received == expected
    assert producer.write_position // producer.capacity > 100  # wrapped many times, padding included


def test_a_record_may_be_written_in_parts() -> None:
    producer, consumer, _ = _local_ring()
    assert producer.try_write(b"head:", memoryview(b"middle"), bytearray(b":tail"))
    assert consumer.read() == b"head:middle:tail"
    assert consumer.read() is None


def test_full_ring_refuses_writes_and_keeps_every_record_until_drained() -> None:
    producer, consumer, _ = _local_ring(4096)
    written = []
    n = 0
    while producer.try_write(payload := n.to_bytes(4, "little") * 25):
        written.append(payload)
        n += 1
    assert len(written) == 4096 // 112  # 100-byte payload + 8-byte header, 16-aligned = 112 bytes
    while producer.try_write(payload := b"%d" % n):  # top up the last 64 bytes with 16-byte records
        written.append(payload)
        n += 1
    assert len(written) == 36 + 4
    assert producer.free_bytes() == 0
    assert not producer.try_write(b"x")  # full: refused, nothing overwritten
    assert consumer.read() == written[0]
    assert producer.try_write(b"after drain")  # one record drained = room again
    received = [record for record in iter(consumer.read, None)]
    assert received == written[1:] + [b"after drain"]


def test_records_larger_than_half_the_ring_are_rejected_with_a_clear_error() -> None:
    producer, _, _ = _local_ring(4096)
    assert producer.try_write(b"x" * producer.max_record_bytes)
    with pytest.raises(ValueError, match="exceeds this ring's limit"):
        producer.try_write(b"x" * (producer.max_record_bytes + 1))


def test_largest_record_always_fits_an_empty_ring_at_any_offset() -> None:
    producer, consumer, _ = _local_ring(4096)
    for target in range(0, 4096, 16):
        while (offset := producer.write_position % 4096) != target:  # walk the empty ring to `target`
            stride = min((target - offset) % 4096, 1024, 4096 - offset)
            assert producer.try_write(b"f" * (stride - 8))
            assert consumer.read() is not None
        big = bytes([target % 251]) * producer.max_record_bytes
        assert producer.try_write(big), f"refused at offset {target}"
        assert consumer.read() == big


def test_checksum_detects_a_corrupted_payload() -> None:
    producer, consumer, memory = _local_ring(4096, checksums=True)
    assert producer.try_write(b"precious audio")
    memory[192 + 8 + 3] ^= 0xFF  # flip a payload byte behind the ring's back (data starts at 192)
    with pytest.raises(RingCorrupted, match="checksum"):
        consumer.peek()


def test_inconsistent_positions_are_reported_not_trusted() -> None:
    producer, consumer, memory = _local_ring(4096)
    assert producer.try_write(b"abc")
    memoryview(memory)[64:72].cast("Q")[0] = 10 * 4096  # write_pos far beyond capacity
    with pytest.raises(RingCorrupted):
        consumer.peek()


def test_attaching_to_unformatted_memory_fails_clearly() -> None:
    with pytest.raises(RingCorrupted, match="magic"):
        Ring(memoryview(bytearray(region_bytes(4096))))


def test_other_architectures_are_refused_with_an_explanation() -> None:
    with pytest.raises(UnsupportedPlatform, match="x86-64"):
        check_platform("aarch64")
    check_platform("x86_64")


def _run_producer(
    segment: Segment, count: int, seed: int, max_bytes: int, *, reader_delay_s: float
) -> tuple[list[bytes], int]:
    """Drain `count` records that a child process writes into `segment.to_gateway`; returns them and the
    child's count of refused writes."""
    data_fd = os.eventfd(0, os.EFD_NONBLOCK)
    space_fd = os.eventfd(0, os.EFD_NONBLOCK)
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.ipc.ring_peer", segment.name, str(count), str(seed), str(max_bytes),
         str(data_fd), str(space_fd)],
        cwd=REPO, stdout=subprocess.PIPE, text=True, pass_fds=(data_fd, space_fd),
    )  # fmt: skip
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "attached"
        segment.unlink()  # as the gateway does once the peer has the segment mapped
        time.sleep(reader_delay_s)  # let the writer run into a full ring
        ring = segment.to_gateway
        received: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(received) < count:
            assert time.monotonic() < deadline, f"stalled after {len(received)} records"
            select.select([data_fd], [], [], 0.05)
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(data_fd)
            while (view := ring.peek()) is not None:
                received.append(bytes(view))
                ring.advance()
            if ring.writer_waiting():
                os.eventfd_write(space_fd, 1)
        line = child.stdout.readline().split()
        assert child.wait(10) == 0
        return received, int(line[1])
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(data_fd)
        os.close(space_fd)


def test_two_processes_move_1b_to_200kb_records_intact_across_many_wraps() -> None:
    before = shm_entries()
    segment = Segment.create(4096, 512 * 1024, checksums=True)
    try:
        expected = list(payload_stream(seed=11, count=2500, max_bytes=200_000))
        received, _ = _run_producer(segment, len(expected), 11, 200_000, reader_delay_s=0)
        assert len(received) == len(expected)
        for i, (got, want) in enumerate(zip(received, expected, strict=True)):
            assert got == want, f"record {i} differs ({len(got)} vs {len(want)} bytes)"
        assert min(map(len, expected)) < 10 and max(map(len, expected)) > 150_000
        assert segment.to_gateway.write_position // segment.to_gateway.capacity >= 50  # wrap-arounds
    finally:
        segment.close()
    assert shm_entries() == before


def test_full_ring_backpressures_another_process_and_loses_nothing() -> None:
    segment = Segment.create(4096, 64 * 1024, checksums=True)
    try:
        expected = list(payload_stream(seed=5, count=1500, max_bytes=20_000))
        received, refused = _run_producer(segment, len(expected), 5, 20_000, reader_delay_s=0.3)
        assert refused > 0, "the writer never saw a full ring; the test did not exercise backpressure"
        assert received == expected  # every record, in order, none overwritten
    finally:
        segment.close()
