"""Submits that found every slot taken wait here, in arrival order, for a slot to free: at most `wait_ms` each.

At high load requests end and start every few milliseconds, so "all 128 slots are in use" is usually a burst
that clears a moment later; refusing such a request at once (HTTP 503) turns a short wait into a failure. A
waiting request holds nothing (no KV or codec slot, no scheduler state); the records its client sends meanwhile
(text, end of text, flush, deadline) are kept and replayed once it is admitted, in order, and a Cancel removes
it. The loop offers the head a slot every turn, and refuses it with the admission's reason when its time is up.

    Submit --all slots taken--> [ waiting: oldest first, records kept ] --slot free--> admitted, records replayed
                                              |--wait_ms passed / shutdown / link lost--> refused (Error + Done)

Plain Python, no clock reads (the loop passes `now_ns`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.ipc.messages import Cancel, Inbound, Submit


@dataclass(slots=True)
class Waiting:
    link_id: int
    submit: Submit
    prefill_len: int
    prompt_trailing: tuple[int, ...] | None
    since_ns: int
    reason: str  # why it could not be admitted at once (the refusal's message if it never is)
    records: list[Inbound] = field(default_factory=list)  # sent for it while it waited, in order


class SlotWaitQueue:
    def __init__(self, wait_ms: float, max_waiting: int) -> None:
        """`wait_ms`: how long a Submit may wait for a slot (0: refuse at once); `max_waiting`: how many may
        wait at once (a Submit past that is refused at once)."""
        if wait_ms < 0 or max_waiting < 0:
            raise ValueError("wait_ms and max_waiting must be >= 0")
        self.wait_ms = wait_ms
        self.max_waiting = max_waiting
        self._queue: deque[Waiting] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def accepting(self) -> bool:
        """Whether a Submit that finds no slot may wait here."""
        return self.wait_ms > 0 and len(self._queue) < self.max_waiting

    def add(self, waiting: Waiting) -> None:
        assert self.accepting, "the slot-wait queue is full or off"
        self._queue.append(waiting)

    def head(self) -> Waiting | None:
        return self._queue[0] if self._queue else None

    def pop_head(self) -> Waiting:
        return self._queue.popleft()

    def expired(self, waiting: Waiting, now_ns: int) -> bool:
        return now_ns - waiting.since_ns >= self.wait_ms * 1_000_000

    def deadline_ns(self) -> int | None:
        """When the head's wait ends (the loop must wake by then to refuse it)."""
        head = self.head()
        return None if head is None else head.since_ns + int(self.wait_ms * 1_000_000)

    def find(self, link_id: int, request_id: int) -> Waiting | None:
        return next((w for w in self._queue if w.link_id == link_id and w.submit.request_id == request_id), None)

    def record(self, link_id: int, msg: Inbound) -> Waiting | None:
        """A record for a waiting request: kept for its admission, or (Cancel) the request removed. -> the
        waiting request it was for, None if none waits under that id."""
        waiting = self.find(link_id, getattr(msg, "request_id", -1))
        if waiting is None:
            return None
        if isinstance(msg, Cancel):
            self._queue.remove(waiting)
        else:
            waiting.records.append(msg)
        return waiting

    def remove_link(self, link_id: int) -> list[Waiting]:
        """Every request of a link that is gone, removed."""
        gone = [w for w in self._queue if w.link_id == link_id]
        self._queue = deque(w for w in self._queue if w.link_id != link_id)
        return gone

    def take_all(self) -> list[Waiting]:
        everyone, self._queue = list(self._queue), deque()
        return everyone
