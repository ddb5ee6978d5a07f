"""Pacing by `max_lead_ms`: a stream generates only while its listener has less audio ahead than that,
sleeps (the loop is told when to wake) while it has more, and still finishes without running dry."""

from __future__ import annotations

from engine.request import NS_PER_SAMPLE, SAMPLES_PER_FRAME, FinishReason, WorkKind

from .helpers import MS, admit, make_request, make_scheduler, step

GENERATION = (WorkKind.TALKER_PREFILL, WorkKind.TALKER_DECODE, WorkKind.CODE_PREDICT)


def _ahead_ms(r, now_ns: int) -> float:  # type: ignore[no-untyped-def]
    deadline = r.effective_deadline_ns()
    return (deadline - now_ns) / MS + r.frames_pending * SAMPLES_PER_FRAME * NS_PER_SAMPLE / MS


def _serve(scheduler, r, now_ns: int, until) -> tuple[list, int, int]:  # type: ignore[no-untyped-def]
    """Run like the engine loop: step while there is work, else sleep until the scheduler's wake time."""
    plans, sleeps = [], 0
    for _ in range(100_000):
        if until():
            return plans, now_ns, sleeps
        ahead_ms = _ahead_ms(r, now_ns) if r.first_audio_ns is not None else None
        plan, after_ns = step(scheduler, now_ns)
        if plan is None:
            wake = scheduler.next_wake_ns(now_ns)
            assert wake is not None and wake > now_ns, "idle with nothing to wake for"
            now_ns, sleeps = wake, sleeps + 1
            continue
        plans.append((plan, ahead_ms))
        now_ns = after_ns
    raise AssertionError("did not finish")


def test_a_paced_stream_generates_only_within_its_lead_and_never_runs_dry():
    scheduler = make_scheduler()
    r = make_request(1, tokens=40, chars=300)  # the length model: ceil(12.5 * 300 / 14) = 268 frames, 21.4 s
    r.max_lead_ms = 1500
    admit(scheduler, r)
    plans, end_ns, sleeps = _serve(scheduler, r, 0, lambda: r.is_ended)

    assert r.finish_reason is FinishReason.LENGTH_MODEL and r.frames_decoded == r.frames_generated == 268
    assert sleeps > 0
    ahead_when_generating = [ahead for plan, ahead in plans if plan.kind in GENERATION and ahead is not None]
    assert ahead_when_generating and max(ahead_when_generating) <= 1500 + 1e-3  # ns rounding
    assert min(ahead for _, ahead in plans if ahead is not None) > 0  # the listener never ran dry
    # Generation kept pace with playback instead of racing ahead: it ended within the lead of the audio's end.
    audio_end_ns = r.effective_deadline_ns()
    assert audio_end_ns - end_ns <= 1500 * MS + SAMPLES_PER_FRAME * NS_PER_SAMPLE * 2


def test_an_unpaced_stream_races_ahead_and_never_asks_to_be_woken():
    scheduler = make_scheduler()
    r = admit(scheduler, make_request(1, tokens=40, chars=300))
    plans, end_ns, sleeps = _serve(scheduler, r, 0, lambda: r.is_ended)
    assert sleeps == 0 and scheduler.next_wake_ns(end_ns) is None
    assert r.effective_deadline_ns() - end_ns > 10_000 * MS  # far ahead of its listener when it finished


def test_pacing_never_delays_first_audio():
    paced, unpaced = make_request(1, tokens=40, chars=300), make_request(1, tokens=40, chars=300)
    paced.max_lead_ms = 1  # smaller than any chunk: only first audio may come before the listener needs it
    for r in (paced, unpaced):
        scheduler = make_scheduler()
        admit(scheduler, r)
        _serve(scheduler, r, 0, lambda r=r: r.first_audio_ns is not None)
    assert paced.first_audio_ns == unpaced.first_audio_ns


def test_pacing_is_suspended_while_slots_run_short_so_streams_finish_and_free_them():
    scheduler = make_scheduler(max_requests=4, max_codec_streams=4)
    paced = [make_request(i, tokens=40, chars=300) for i in (1, 2, 3, 4)]
    for r in paced:
        r.max_lead_ms = 1000
        admit(scheduler, r)
    assert not scheduler.pacing_allowed  # no slot free: nobody is held back
    _, now, sleeps = _serve(scheduler, paced[0], 0, lambda: all(r.generation_finished for r in paced))
    assert sleeps == 0 and scheduler.next_wake_ns(now) is None
