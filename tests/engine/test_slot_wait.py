"""A Submit that finds every slot taken waits for one (engine.slot_wait): it is served, with the text its client
sent meanwhile, once a slot frees; it is refused as overloaded when its wait is over; a Cancel or a lost link
removes it; and nobody overtakes it."""

from __future__ import annotations

import numpy as np

from engine.ipc.messages import AppendText, Cancel, Done, DoneReason, EndText, Error, Submit
from engine.loop import EngineLoop
from engine.model.qwen3_tts import Qwen3TTS
from tests.engine.helpers import LINK, SENTENCES, make_loop, reference, submit, text_ids


class Clock:
    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns


def _drain(loop: EngineLoop) -> list:
    """Step until nothing runs and nobody waits -> every reply, in order."""
    replies = []
    for _ in range(20_000):
        ran = loop.step()
        replies += [m for _, m in loop.take_replies()]
        if not ran and not len(loop.waiting):
            return replies
    raise AssertionError("the loop did not go idle")


def _one_slot_loop(model: Qwen3TTS, clock: Clock | None = None, wait_ms: float = 60_000.0) -> EngineLoop:
    """One KV slot; on the real clock the wait is long (a tiny request takes a while on a CPU)."""
    loop = make_loop(model, kv_slots=1, max_batch=1, clock=clock)
    loop.waiting.wait_ms = wait_ms
    return loop


def test_a_submit_that_finds_every_slot_taken_is_served_once_one_frees_with_the_text_sent_meanwhile(
        tiny_model: Qwen3TTS) -> None:  # fmt: skip
    loop = _one_slot_loop(tiny_model)
    first = submit(tiny_model, 1, SENTENCES[0], seed=3)
    loop.handle(LINK, first, loop.clock())
    whole = submit(tiny_model, 2, SENTENCES[1], seed=4)
    opening, rest = "The quick", " brown fox jumps."
    assert text_ids(tiny_model, opening) + text_ids(tiny_model, rest) == whole.text_ids
    streamed = Submit(2, whole.speaker, whole.language, text_ids(tiny_model, opening), len(opening), False, seed=4)
    loop.handle(LINK, streamed, loop.clock())  # the one slot is taken: it waits, holding nothing
    assert loop.request_state(LINK, 2) is None and len(loop.waiting) == 1 and loop.queued_count() >= 1
    loop.handle(LINK, AppendText(2, text_ids(tiny_model, rest), len(rest)), loop.clock())  # kept for admission
    loop.handle(LINK, EndText(2), loop.clock())
    replies = _drain(loop)
    assert not [m for m in replies if isinstance(m, Error)]
    for msg in (first, whole):  # both as each alone, the second with all the text its client sent
        _, pcm = reference(tiny_model, msg)
        got = np.frombuffer(b"".join(m.pcm for m in replies if getattr(m, "pcm", None) is not None
                                     and m.request_id == msg.request_id), dtype="<i2")
        done = [m for m in replies if isinstance(m, Done) and m.request_id == msg.request_id]
        assert done and done[0].reason is DoneReason.COMPLETED
        assert len(got) == len(pcm) and int(np.abs(got.astype(np.int32) - pcm).max()) <= 1


def test_a_waiting_submit_is_refused_as_overloaded_when_its_wait_is_over(tiny_model: Qwen3TTS) -> None:
    clock = Clock()
    loop = _one_slot_loop(tiny_model, clock, wait_ms=200.0)
    loop.handle(LINK, submit(tiny_model, 1, SENTENCES[3]), clock())
    loop.step()
    loop.handle(LINK, submit(tiny_model, 2, SENTENCES[1]), clock())
    loop.step()
    assert not [m for _, m in loop.take_replies() if m.request_id == 2]  # still waiting: no answer yet
    clock.ns += int(loop.waiting.wait_ms * 1e6)
    loop.step()
    replies = [m for _, m in loop.take_replies() if m.request_id == 2]
    assert isinstance(replies[0], Error) and replies[0].code == "overloaded"
    assert "KV slots" in replies[0].message and "waited 200 ms" in replies[0].message
    assert replies[1] == Done(2, DoneReason.ERROR, 0, 0) and len(loop.waiting) == 0


def test_with_the_queue_full_or_no_wait_a_submit_that_finds_every_slot_taken_is_refused_at_once(tiny_model: Qwen3TTS) -> None:
    loop = _one_slot_loop(tiny_model)
    loop.handle(LINK, submit(tiny_model, 1, SENTENCES[0]), loop.clock())
    loop.handle(LINK, submit(tiny_model, 2, SENTENCES[1]), loop.clock())  # waits: the queue holds one
    loop.handle(LINK, submit(tiny_model, 3, SENTENCES[2]), loop.clock())
    replies = [m for _, m in loop.take_replies()]
    assert [m.request_id for m in replies] == [3, 3] and replies[0].code == "overloaded"
    assert "wait" in replies[0].message
    loop.waiting.wait_ms = 0.0  # off: refused at once, with the slots' own reason
    loop.handle(LINK, submit(tiny_model, 4, SENTENCES[3]), loop.clock())
    loop.waiting.take_all()
    loop.handle(LINK, submit(tiny_model, 5, SENTENCES[4]), loop.clock())
    replies = [m for _, m in loop.take_replies() if m.request_id == 5]
    assert isinstance(replies[0], Error) and replies[0].code == "overloaded" and "KV slots" in replies[0].message


def test_a_cancel_or_a_lost_link_removes_a_waiting_submit(tiny_model: Qwen3TTS) -> None:
    loop = _one_slot_loop(tiny_model)
    loop.waiting.max_waiting = 2  # (as many as there are KV slots by default: one here)
    loop.handle(LINK, submit(tiny_model, 1, SENTENCES[0]), loop.clock())
    loop.handle(LINK, submit(tiny_model, 2, SENTENCES[1]), loop.clock())
    loop.handle(LINK + 1, submit(tiny_model, 2, SENTENCES[2]), loop.clock())  # another link, the same id
    assert len(loop.waiting) == 2
    loop.handle(LINK, Cancel(2), loop.clock())
    assert [m for _, m in loop.take_replies()] == [Done(2, DoneReason.CANCELLED, 0, 0)]
    loop._drop_link(LINK + 1)
    assert len(loop.waiting) == 0
    assert [m.reason for m in _drain(loop) if isinstance(m, Done)] == [DoneReason.COMPLETED]
    assert loop.scheduler.active_count == 0


def test_waiting_submits_are_admitted_in_arrival_order(tiny_model: Qwen3TTS) -> None:
    loop = _one_slot_loop(tiny_model)
    loop.waiting.max_waiting = 3
    for rid in range(1, 5):
        loop.handle(LINK, submit(tiny_model, rid, SENTENCES[rid]), loop.clock())
    firsts = [m.request_id for m in _drain(loop) if getattr(m, "first", False)]
    assert firsts == [1, 2, 3, 4]
