"""A serving loop that stops turning leaves every thread's stack on stderr; one that keeps turning leaves nothing."""

from __future__ import annotations

import time

from engine.stall_watch import StallWatch


def _blocked_in_a_named_frame(seconds: float) -> None:
    time.sleep(seconds)  # stands for a loop stuck in a native call (a CUDA event wait, a lock)


def test_a_loop_silent_past_the_limit_dumps_the_stack_it_is_stuck_in(tmp_path):
    with open(tmp_path / "stderr.txt", "w+") as sink:
        watch = StallWatch(0.2, sink)
        watch.arm()
        _blocked_in_a_named_frame(0.6)
        watch.disarm()
        sink.seek(0)
        dump = sink.read()
    assert "Timeout" in dump and "_blocked_in_a_named_frame" in dump


def test_a_loop_that_rearms_in_time_dumps_nothing(tmp_path):
    with open(tmp_path / "stderr.txt", "w+") as sink:
        watch = StallWatch(0.5, sink)
        for _ in range(6):
            watch.arm()
            time.sleep(0.1)
        watch.disarm()
        time.sleep(0.6)  # past the limit after disarming: still nothing
        sink.seek(0)
        assert sink.read() == ""


def test_a_watch_of_zero_seconds_never_dumps(tmp_path):
    with open(tmp_path / "stderr.txt", "w+") as sink:
        watch = StallWatch(0.0, sink)
        watch.arm()
        _blocked_in_a_named_frame(0.3)
        watch.disarm()
        sink.seek(0)
        assert sink.read() == ""
