"""An engine's stderr, passed through to the gateway's own stderr while its last lines are kept.

One promise: everything the engine writes to the pipe reaches the gateway's stderr unchanged and promptly,
and `tail()` gives its last lines afterwards, so a gateway that gives up on an engine can repeat why.
The pipe is read by the event loop (`loop.add_reader`, non-blocking reads): no thread, no busy wait.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os

TAIL_LINES = 20
TAIL_LINE_BYTES = 2000  # a longer line is kept cut to this many bytes
READ_BYTES = 65536


class StderrTail:
    """Owns the read end of one engine's stderr pipe, from spawn until `close()`."""

    def __init__(self, read_fd: int, forward_fd: int = 2) -> None:
        self._fd = read_fd
        self._forward_fd = forward_fd
        self._lines: collections.deque[bytes] = collections.deque(maxlen=TAIL_LINES)
        self._partial = b""
        self._loop = asyncio.get_running_loop()
        self.eof = asyncio.Event()
        os.set_blocking(read_fd, False)
        self._loop.add_reader(read_fd, self._on_readable)

    @classmethod
    def pipe(cls) -> tuple[StderrTail, int]:
        """A new pipe: the tail reading it, and the write end to hand to the child (then close it here)."""
        read_fd, write_fd = os.pipe()
        return cls(read_fd), write_fd

    def _on_readable(self) -> None:
        try:
            data = os.read(self._fd, READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._stop_reading()
            return
        with contextlib.suppress(OSError):
            os.write(self._forward_fd, data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()[-TAIL_LINE_BYTES:]
        self._lines.extend(line[-TAIL_LINE_BYTES:] for line in lines)

    def _stop_reading(self) -> None:
        if not self.eof.is_set():
            self._loop.remove_reader(self._fd)
            self.eof.set()

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last `lines` lines written (an unterminated last line included), blank lines dropped."""
        kept = [*self._lines, self._partial] if self._partial else list(self._lines)
        text = [line.decode("utf-8", "replace").rstrip() for line in kept]
        return "\n".join([t for t in text if t.strip()][-lines:])

    async def close(self, wait_s: float = 1.0) -> None:
        """Read what is left (up to `wait_s`: a grandchild may hold the pipe open), then close the fd."""
        if self._fd < 0:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.eof.wait(), wait_s)
        self._stop_reading()
        os.close(self._fd)
        self._fd = -1
