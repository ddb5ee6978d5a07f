"""engine/gc_watch.py: garbage-collection pauses are counted and timed, start-up objects are frozen out of them."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator

import pytest

from engine.gc_watch import LONG_PAUSE_S, GcWatch, freeze_startup_objects, process_watch


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the test session collects as usual


def test_each_collection_of_the_process_is_counted_with_its_pause() -> None:
    watch = process_watch()
    collections, seconds = watch.collections, watch.seconds
    for _ in range(3):
        Cycle()
        gc.collect()
    assert watch.collections >= collections + 3
    assert watch.seconds > seconds and watch.longest_s > 0
    assert process_watch() is watch and gc.callbacks.count(watch.on_gc) == 1


def test_a_long_pause_is_logged_with_its_generation(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    watch = GcWatch(clock=lambda: now[0], process="engine")
    with caplog.at_level(logging.WARNING, logger="vivace.gc"):
        watch.on_gc("start", {"generation": 0})
        now[0] += LONG_PAUSE_S / 4
        watch.on_gc("stop", {"generation": 0, "collected": 3})
        watch.on_gc("start", {"generation": 2})
        now[0] += 0.16
        watch.on_gc("stop", {"generation": 2, "collected": 7})
        watch.on_gc("stop", {"generation": 2, "collected": 0})  # a stop without its start counts nothing
    assert watch.collections == 2 and watch.seconds == pytest.approx(0.16 + LONG_PAUSE_S / 4)
    assert watch.longest_s == pytest.approx(0.16)
    assert [r.getMessage() for r in caplog.records] == [
        "engine: garbage collection of generation 2 paused the process for 160.0 ms (7 collected)"
    ]


def test_objects_alive_at_start_up_are_no_longer_walked_by_collections(unfrozen: None) -> None:
    kept = Cycle()
    garbage = Cycle()
    del garbage
    frozen = freeze_startup_objects()
    assert frozen > 0 and gc.get_freeze_count() == frozen
    assert not any(obj is kept for obj in gc.get_objects())
    later = Cycle()  # what serving allocates afterwards is collected as usual
    assert any(obj is later for obj in gc.get_objects())
