"""The shared-memory segment of one gateway-worker <-> engine link: a small header and two rings.

The gateway worker creates it, the engine attaches by name, then the gateway unlinks the name at once
(`unlink()`), so after the handshake the segment lives only as two mappings and vanishes with the last
one: nothing can be left in /dev/shm after either side is killed. Every page is allocated at creation
(`posix_fallocate`): tmpfs otherwise allocates on first touch, and a ring page first touched while
/dev/shm is full kills the writer with SIGBUS. A /dev/shm without room fails `create` with
`SharedMemoryFull` instead, before anything is shared.

    offset
      0  +----------------------------------------------------------------------+
         | segment header (64 B)                                                 |
         |   8s  magic "VIVSEG01"   u32 version   u32 flags (bit 0: ring crc32)   |
         |   u64 to_engine offset   u64 to_engine capacity                         |
         |   u64 to_gateway offset  u64 to_gateway capacity   16 B reserved       |
     64  +----------------------------------------------------------------------+
         | ring "to_engine": gateway -> engine requests (see engine/ipc/ring.py)  |
         |   192 B ring header + to_engine capacity bytes                         |
         +----------------------------------------------------------------------+ (64-aligned)
         | ring "to_gateway": engine -> gateway audio and events                  |
         |   192 B ring header + to_gateway capacity bytes                        |
         +----------------------------------------------------------------------+
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import secrets
import struct
import sys
from multiprocessing import resource_tracker, shared_memory

from engine.ipc.ring import Ring, RingCorrupted, check_platform, region_bytes, validate_capacity

NAME_PREFIX = "vivace-ipc-"
VERSION = 1
MAX_SEGMENT_BYTES = 1 << 30  # an engine refuses to map more than this per link

_HEADER = struct.Struct("<8sIIQQQQ16x")
_created_here: set[str] = set()  # names this process created (and its resource tracker already knows)
_MAGIC = b"VIVSEG01"
_FLAG_CRC = 1


class SharedMemoryFull(OSError):
    """/dev/shm has no room for a link's rings."""


def _reserve(name: str, size: int) -> None:
    """Allocate every page of the named segment now, or raise SharedMemoryFull."""
    fd = os.open(f"/dev/shm/{name}", os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        raise SharedMemoryFull(
            errno.ENOSPC,
            f"/dev/shm has no room for a link's rings ({size / (1 << 20):.1f} MiB): {error.strerror}",
        ) from None
    finally:
        os.close(fd)


def _align64(n: int) -> int:
    return (n + 63) & ~63


def segment_bytes(to_engine_capacity: int, to_gateway_capacity: int) -> int:
    first = _align64(_HEADER.size + region_bytes(to_engine_capacity))
    return first + region_bytes(to_gateway_capacity)


class Segment:
    """Both rings of one link mapped in this process. The creator must `unlink()` once the peer attached."""

    def __init__(
        self, shm: shared_memory.SharedMemory, to_engine: Ring, to_gateway: Ring, *, owner: bool
    ) -> None:
        self._shm = shm
        self.to_engine = to_engine
        self.to_gateway = to_gateway
        self.name: str = shm.name
        self._owner = owner
        self._linked = owner

    @classmethod
    def create(cls, to_engine_capacity: int, to_gateway_capacity: int, *, checksums: bool = False) -> Segment:
        """Create a fresh named segment with two empty rings (capacities: powers of two)."""
        check_platform()
        validate_capacity(to_engine_capacity)
        validate_capacity(to_gateway_capacity)
        size = segment_bytes(to_engine_capacity, to_gateway_capacity)
        if size > MAX_SEGMENT_BYTES:
            raise ValueError(f"a link's rings may total at most {MAX_SEGMENT_BYTES} bytes, asked for {size}")
        name = f"{NAME_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        shm = shared_memory.SharedMemory(name=name, create=True, size=size)
        _created_here.add(shm.name)
        try:
            _reserve(shm.name, size)
            buf = shm.buf
            first = _HEADER.size
            second = _align64(first + region_bytes(to_engine_capacity))
            to_engine = Ring.create(buf[first:second], to_engine_capacity, checksums=checksums)
            to_gateway = Ring.create(buf[second:size], to_gateway_capacity, checksums=checksums)
            _HEADER.pack_into(
                buf, 0, _MAGIC, VERSION, _FLAG_CRC if checksums else 0,
                first, to_engine_capacity, second, to_gateway_capacity,
            )  # fmt: skip
        except BaseException:
            with contextlib.suppress(BufferError):
                shm.close()
            shm.unlink()
            _created_here.discard(shm.name)
            raise
        return cls(shm, to_engine, to_gateway, owner=True)

    @classmethod
    def attach(cls, name: str) -> Segment:
        """Map a segment created by the peer. Raises FileNotFoundError or RingCorrupted with a clear message."""
        check_platform()
        shm = _open_untracked(name)
        try:
            size = shm.size
            if size < _HEADER.size:
                raise RingCorrupted(f"segment {name!r} is too small ({size} bytes)")
            magic, version, _flags, first, cap_e, second, cap_g = _HEADER.unpack_from(shm.buf, 0)
            if magic != _MAGIC:
                raise RingCorrupted(f"segment {name!r} is not a Vivace link segment")
            if version != VERSION:
                raise RingCorrupted(
                    f"segment {name!r} has layout version {version}, this side speaks {VERSION}"
                )
            if first + region_bytes(cap_e) > second or second + region_bytes(cap_g) > size:
                raise RingCorrupted(f"segment {name!r} header describes rings beyond its {size} bytes")
            to_engine = Ring(shm.buf[first : first + region_bytes(cap_e)])
            try:
                to_gateway = Ring(shm.buf[second : second + region_bytes(cap_g)])
            except BaseException:
                to_engine.release()
                raise
        except BaseException:
            gc.collect()
            with contextlib.suppress(BufferError):
                shm.close()
            raise
        return cls(shm, to_engine, to_gateway, owner=False)

    def unlink(self) -> None:
        """Remove the name from /dev/shm (creator only); the mappings stay valid. Idempotent."""
        if self._owner and self._linked:
            self._linked = False
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()
            _created_here.discard(self.name)

    def close(self) -> None:
        """Unmap (and unlink if still named). Idempotent."""
        self.unlink()
        if self._shm is None:
            return
        self.to_engine.release()
        self.to_gateway.release()
        try:
            self._shm.close()
        except BufferError:
            # A caller still holds a view into the rings; collect cycles that may hold it and retry.
            gc.collect()
            with contextlib.suppress(BufferError):
                self._shm.close()
        self._shm = None


def _open_untracked(name: str) -> shared_memory.SharedMemory:
    """Attach without letting this process's resource_tracker adopt (and later unlink) the peer's segment."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg]
    shm = shared_memory.SharedMemory(name=name)
    # Python < 3.13 registers every attached segment with the resource tracker, which would unlink it
    # (and warn) when this process exits. The creator owns the name, so forget it here (unless the
    # creator is this very process, as in tests: its registration must stay for its own unlink).
    if shm.name not in _created_here:
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm
