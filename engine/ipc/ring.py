"""A single-producer/single-consumer byte ring over a shared-memory region: records go in whole, come
out whole and in order, and a full ring refuses a write instead of dropping or overwriting anything.

One ring is a header of three 64-byte cache lines followed by `capacity` data bytes (a power of two):

    region offset
      0  +--------------------------------------------------------------+
         | line 0, constant after creation                               |
         |   u64 magic "VIVRING1"   u64 capacity   u64 flags (bit 0 crc)  |
     64  +--------------------------------------------------------------+
         | line 1, written only by the producer                           |
         |   u64 write_pos   (bytes ever published, monotonic)            |
         |   u64 writer_waiting (1 while the producer holds records it   |
         |                       could not fit: the consumer wakes it)    |
    128  +--------------------------------------------------------------+
         | line 2, written only by the consumer                           |
         |   u64 read_pos    (bytes ever consumed, monotonic)             |
    192  +--------------------------------------------------------------+
         | data: capacity bytes, records back to back                     |
         +--------------------------------------------------------------+

    record at data[pos % capacity], every record starts on a 16-byte boundary:
         u32 length        payload bytes, or 0xFFFFFFFF for a wrap-padding record
         u32 crc32         zlib.crc32 of the payload when the crc flag is set, else 0
         payload           `length` bytes, then zero to 15 bytes of alignment slack
    A record never straddles the end of the data area: when it does not fit before the end, a padding
    record fills the rest and the record starts at offset 0. The largest record is capacity/2 bytes
    (header included), which guarantees that an empty ring can always take it.

The positions only grow (u64 never wraps in practice), so `write_pos - read_pos` is the bytes in use
and the ring is empty when they are equal. Each side keeps its own position privately and only
reads the other's when its cached view says there is no room or no data.

Memory ordering: the producer copies the record, then stores write_pos; the consumer loads write_pos,
then reads the record, then stores read_pos. This is correct only where stores become visible in
program order and loads are not reordered with older loads or with later stores, i.e. x86-64 (TSO);
the positions are read and written as aligned 8-byte memoryview items (one `mov`, single-copy atomic).
Other architectures (e.g. ARM in Grace-Hopper) need release/acquire barriers that Python cannot issue,
so `Ring` refuses to run there (`UnsupportedPlatform`) instead of corrupting data silently.
Nothing is ever locked, so a process killed at any instruction leaves nothing to unlock.
"""

from __future__ import annotations

import platform
import struct
import zlib
from collections.abc import Iterable

Buffer = bytes | bytearray | memoryview

HEADER_BYTES = 192
RECORD_ALIGN = 16
RECORD_HEADER_BYTES = 8
MIN_CAPACITY = 4096

_MAGIC = int.from_bytes(b"VIVRING1", "little")
_PADDING = 0xFFFFFFFF
_FLAG_CRC = 1
# Indices of the u64 words of the header (byte offset / 8).
_MAGIC_WORD, _CAPACITY_WORD, _FLAGS_WORD = 0, 1, 2
_WRITE_WORD, _WAITING_WORD = 8, 9
_READ_WORD = 16
_RECORD_HEADER = struct.Struct("<II")

_SUPPORTED_MACHINES = {"x86_64", "amd64"}


class UnsupportedPlatform(RuntimeError):
    """The ring's lock-free protocol relies on x86-64 memory ordering."""


class RingCorrupted(RuntimeError):
    """A record failed its checksum or the positions/headers are inconsistent."""


def check_platform(machine: str | None = None) -> None:
    """Raise `UnsupportedPlatform` unless this CPU orders memory like x86-64 (see module docstring)."""
    machine = (machine or platform.machine()).lower()
    if machine not in _SUPPORTED_MACHINES:
        raise UnsupportedPlatform(
            f"the shared-memory ring relies on x86-64 (TSO) memory ordering; this machine is {machine!r}. "
            "Other architectures need release/acquire barriers, which this pure-Python ring cannot issue."
        )


def region_bytes(capacity: int) -> int:
    """Bytes of shared memory one ring of `capacity` data bytes occupies."""
    return HEADER_BYTES + capacity


def _aligned(n: int) -> int:
    return (n + RECORD_ALIGN - 1) & ~(RECORD_ALIGN - 1)


def validate_capacity(capacity: int) -> None:
    if capacity < MIN_CAPACITY or capacity & (capacity - 1):
        raise ValueError(f"ring capacity must be a power of two >= {MIN_CAPACITY} bytes, got {capacity}")


class Ring:
    """One direction of the ring. A process uses a given ring either as its producer or its consumer.

    `Ring.create(region, capacity)` formats a zeroed region; `Ring(region)` attaches to a formatted one.
    Producer: `try_write(*parts)`. Consumer: `peek()` / `advance()` (or `read()` for a copy).
    """

    def __init__(self, region: memoryview) -> None:
        check_platform()
        if len(region) < HEADER_BYTES + MIN_CAPACITY:
            raise RingCorrupted(f"ring region of {len(region)} bytes is too small")
        self._words = region[:HEADER_BYTES].cast("Q")
        if self._words[_MAGIC_WORD] != _MAGIC:
            self._words.release()
            raise RingCorrupted("region does not hold a formatted ring (bad magic)")
        capacity = self._words[_CAPACITY_WORD]
        if capacity < MIN_CAPACITY or capacity & (capacity - 1) or len(region) < HEADER_BYTES + capacity:
            self._words.release()
            raise RingCorrupted(f"ring header claims capacity {capacity} for a {len(region)}-byte region")
        self.capacity: int = capacity
        self.checksums: bool = bool(self._words[_FLAGS_WORD] & _FLAG_CRC)
        self.max_record_bytes: int = capacity // 2 - RECORD_HEADER_BYTES
        self._data = region[HEADER_BYTES : HEADER_BYTES + capacity]
        self._mask = capacity - 1
        # Private copies of the positions; the shared words are touched only when these say "stuck".
        self._write = self._words[_WRITE_WORD]
        self._read = self._words[_READ_WORD]
        self._peeked: memoryview | None = None
        self._peeked_end = 0

    @classmethod
    def create(cls, region: memoryview, capacity: int, *, checksums: bool = False) -> Ring:
        """Format `region` (at least `region_bytes(capacity)` bytes) as an empty ring and attach to it."""
        check_platform()
        validate_capacity(capacity)
        if len(region) < region_bytes(capacity):
            raise ValueError(f"region of {len(region)} bytes cannot hold a ring of capacity {capacity}")
        words = region[:HEADER_BYTES].cast("Q")
        for i in range(len(words)):
            words[i] = 0
        words[_CAPACITY_WORD] = capacity
        words[_FLAGS_WORD] = _FLAG_CRC if checksums else 0
        words[_MAGIC_WORD] = _MAGIC
        words.release()
        return cls(region)

    # ------------------------------------------------------------ producer side

    def try_write(self, *parts: Buffer) -> bool:
        """Append one record made of `parts` back to back. False if it does not fit now (nothing written).

        Raises ValueError for a record that can never fit (larger than `max_record_bytes`).
        """
        length = 0
        for part in parts:
            length += len(part) if not isinstance(part, memoryview) else part.nbytes
        if length > self.max_record_bytes:
            raise ValueError(f"record of {length} bytes exceeds this ring's limit of {self.max_record_bytes}")
        stride = _aligned(RECORD_HEADER_BYTES + length)
        offset = self._write & self._mask
        tail = self.capacity - offset
        needed = stride if stride <= tail else tail + stride
        if self._write + needed - self._read > self.capacity:
            self._read = self._words[_READ_WORD]
            if self._write + needed - self._read > self.capacity:
                return False
        data = self._data
        if stride > tail:
            _RECORD_HEADER.pack_into(data, offset, _PADDING, 0)
            offset = 0
        crc = 0
        pos = offset + RECORD_HEADER_BYTES
        for part in parts:
            n = len(part) if not isinstance(part, memoryview) else part.nbytes
            data[pos : pos + n] = part
            if self.checksums:
                crc = zlib.crc32(part, crc)
            pos += n
        _RECORD_HEADER.pack_into(data, offset, length, crc)
        self._write += needed
        self._words[_WRITE_WORD] = self._write  # publish: after every byte of the record (x86-64 TSO)
        return True

    def write_all(self, records: Iterable[tuple[Buffer, ...]]) -> int:
        """Write records in order until one does not fit; returns how many were written."""
        written = 0
        for parts in records:
            if not self.try_write(*parts):
                break
            written += 1
        return written

    def free_bytes(self) -> int:
        """Bytes free right now (from the producer's view; a record also needs header and alignment)."""
        self._read = self._words[_READ_WORD]
        return self.capacity - (self._write - self._read)

    def set_writer_waiting(self, waiting: bool) -> None:
        """Producer: advertise that it holds records the ring refused, so the consumer should wake it."""
        self._words[_WAITING_WORD] = 1 if waiting else 0

    # ------------------------------------------------------------ consumer side

    def writer_waiting(self) -> bool:
        return self._words[_WAITING_WORD] != 0

    def peek(self) -> memoryview | None:
        """The next record's payload, or None if the ring is empty. Valid until `advance()`."""
        if self._peeked is not None:
            return self._peeked
        while True:
            if self._read == self._write:
                self._write = self._words[_WRITE_WORD]
                if self._read == self._write:
                    return None
            used = self._write - self._read
            if used < RECORD_HEADER_BYTES or used > self.capacity:
                raise RingCorrupted(f"ring positions inconsistent: read {self._read}, write {self._write}")
            offset = self._read & self._mask
            length, crc = _RECORD_HEADER.unpack_from(self._data, offset)
            if length == _PADDING:
                self._read += self.capacity - offset
                self._words[_READ_WORD] = self._read
                continue
            stride = _aligned(RECORD_HEADER_BYTES + length)
            if length > self.max_record_bytes or stride > used or offset + stride > self.capacity:
                raise RingCorrupted(f"record of {length} bytes at position {self._read} overruns the ring")
            view = self._data[offset + RECORD_HEADER_BYTES : offset + RECORD_HEADER_BYTES + length]
            if self.checksums and zlib.crc32(view) != crc:
                view.release()
                raise RingCorrupted(f"checksum mismatch in the {length}-byte record at position {self._read}")
            self._peeked = view
            self._peeked_end = self._read + stride
            return view

    def advance(self) -> None:
        """Consume the record returned by `peek()`; its view is released and its bytes may be reused."""
        if self._peeked is None:
            raise RuntimeError("advance() without a peeked record")
        self._peeked.release()
        self._peeked = None
        self._read = self._peeked_end
        self._words[_READ_WORD] = self._read  # after every load of the record (x86-64 TSO)

    def read(self) -> bytes | None:
        """Convenience: the next record's payload as a copy, consumed; None if empty."""
        view = self.peek()
        if view is None:
            return None
        data = bytes(view)
        self.advance()
        return data

    def is_empty(self) -> bool:
        return self._peeked is None and self._words[_WRITE_WORD] == self._read

    # ------------------------------------------------------------ both sides

    @property
    def write_position(self) -> int:
        """Bytes ever published (shared word): `write_position // capacity` counts wrap-arounds."""
        return self._words[_WRITE_WORD]

    @property
    def read_position(self) -> int:
        return self._words[_READ_WORD]

    def release(self) -> None:
        """Drop every view into the region so its shared memory can be unmapped."""
        if self._peeked is not None:
            self._peeked.release()
            self._peeked = None
        self._data.release()
        self._words.release()
