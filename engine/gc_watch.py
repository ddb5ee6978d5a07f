"""Python's garbage collector in a serving process: its pauses timed and counted, startup objects out of its sight.

A full (generation 2) collection walks every container object the process holds. An engine holds a model, its
captured graphs and Triton's caches; a gateway holds every live session's state. While a collection runs, the
engine plans and launches nothing and the gateway sends nothing, so a long one is a stall of every stream at once.

- `freeze_startup_objects()` (after start-up and warm-up): one last collection, then `gc.freeze()` moves every
  object that exists into a permanent generation no later collection walks (what serving allocates is still
  collected as usual).
- `process_watch()`: the process's `GcWatch`, installed on `gc.callbacks` once; it sums collections and their
  pause, keeps the longest, and logs any pause of `LONG_PAUSE_S` or more, so a pause shows in the metrics
  (engine heartbeat `host.gc`, gateway `vivace_gateway_gc_pause_seconds_total`) instead of as an unexplained stall.

Imports no torch: the gateway uses it too.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("vivace.gc")

LONG_PAUSE_S = 0.02  # a collection this long is logged: at 12.5 frames a second it is a quarter of a frame


class GcWatch:
    """Collections and their pauses since this watch was installed (`on_gc` is the `gc.callbacks` hook)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, process: str = "") -> None:
        self.collections = 0
        self.seconds = 0.0  # paused in collections, in all
        self.longest_s = 0.0
        self._clock = clock
        self._process = process
        self._started: float | None = None

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self._clock()
            return
        if self._started is None:  # installed between a collection's start and its stop
            return
        pause = self._clock() - self._started
        self._started = None
        self.collections += 1
        self.seconds += pause
        self.longest_s = max(self.longest_s, pause)
        if pause >= LONG_PAUSE_S:
            log.warning("%sgarbage collection of generation %s paused the process for %.1f ms (%s collected)",
                        f"{self._process}: " if self._process else "", info.get("generation"), pause * 1e3,
                        info.get("collected"))  # fmt: skip


_process_watch: GcWatch | None = None


def process_watch(process: str = "") -> GcWatch:
    """This process's watch, installed on first use (`process` names it in the log: "engine", "gateway")."""
    global _process_watch
    if _process_watch is None:
        _process_watch = GcWatch(process=process)
        gc.callbacks.append(_process_watch.on_gc)
    return _process_watch


def freeze_startup_objects() -> int:
    """Collect once, then keep every object that exists now out of later collections -> how many were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
