"""What a session sends, in order, within a byte budget: audio frames, events and the final close.

The budget is the slow-reader guard: audio is counted in bytes, and a `put` that would exceed
`max_bytes` is refused, so a client that does not read is noticed (the session then closes it with
`slow_reader`) instead of memory growing with a stalled client. Control items (events, errors,
the close) always fit: they are small and bounded in number.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.metrics import Gauge

if TYPE_CHECKING:
    from gateway.context import Context


@dataclass(slots=True)
class AudioOut:
    context: Context
    frame: bytes
    samples: int  # real (non-padding) samples this frame carries


@dataclass(slots=True)
class LazyText:
    """An event rendered when it is sent, so counts in it (samples_sent) are final."""

    render: Callable[[], str]


@dataclass(slots=True)
class ContextText:
    """An event about a context's audio (word timings): dropped with its audio if the context is cancelled."""

    context: Context
    text: str


@dataclass(slots=True)
class CloseOut:
    code: int
    reason: str


OutItem = str | AudioOut | LazyText | ContextText | CloseOut


class Outbox:
    """FIFO of outgoing items with a byte budget (the slow-reader guard); `gauge` sums all sessions."""

    def __init__(self, max_bytes: int, gauge: Gauge) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._gauge = gauge
        self._items: deque[tuple[OutItem, int]] = deque()
        self._wake = asyncio.Event()

    def put(self, item: OutItem, size: int) -> bool:
        if self.bytes + size > self.max_bytes and self._items:
            return False
        self._items.append((item, size))
        self._account(size)
        self._wake.set()
        return True

    def put_control(self, item: OutItem) -> None:
        """Control items (errors, close) always fit: they are small and bounded in number."""
        self._items.append((item, 0))
        self._wake.set()

    async def get(self) -> OutItem:
        while not self._items:
            self._wake.clear()
            await self._wake.wait()
        item, size = self._items.popleft()
        self._account(-size)
        return item

    def drop_audio(self) -> None:
        self._items = deque((item, size) for item, size in self._items if not isinstance(item, AudioOut))
        self._account(sum(size for _, size in self._items) - self.bytes)

    def _account(self, delta: int) -> None:
        self.bytes += delta
        self._gauge.inc(amount=delta)
