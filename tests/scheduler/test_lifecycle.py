"""A request's state machine through the scheduler's public calls: text, EOS, caps, cancel, failure, release."""

from __future__ import annotations

import pytest

from engine.ipc.messages import Layout
from engine.request import SAMPLES_PER_FRAME, TEXT_END, TEXT_PAD, FinishReason, Phase, SlotPool, WorkKind
from engine.scheduling import Outcome, Scheduler

from .helpers import MS, admit, make_request, make_scheduler, run, step


def _all_free(scheduler: Scheduler) -> bool:
    return (scheduler.kv_slots.free_count == scheduler.kv_slots.size
            and scheduler.codec_slots.free_count == scheduler.codec_slots.size)


def test_length_model_request_runs_to_done_and_frees_every_slot():
    scheduler = make_scheduler()
    r = admit(scheduler, make_request(1, tokens=10, chars=45))  # ceil(12.5 * 45 / 14) = 41 frames
    plans, _ = run(scheduler, 0, lambda: r.is_ended)
    assert r.phase is Phase.DONE and r.finish_reason is FinishReason.LENGTH_MODEL
    assert r.frames_generated == r.frames_decoded == 41
    assert r.samples_published == 41 * SAMPLES_PER_FRAME
    assert scheduler.pop_finished() == [r] and scheduler.active_count == 0 and _all_free(scheduler)
    assert sum(p.codec_frames for p in plans if p.kind is WorkKind.CODEC_CHUNK) == 41
    assert [p for p in plans if p.kind is WorkKind.CODEC_CHUNK][-1].rows[0].final_chunk


def test_talker_feeds_one_text_token_per_frame_then_end_then_pad():
    scheduler = make_scheduler(length_model=False)
    r = admit(scheduler, make_request(1, tokens=3, chars=12))
    fed = []
    _, now = run(scheduler, 0, lambda: len(fed) >= 0 and r.frames_generated >= 1)
    for _ in range(12):
        plan, now = step(scheduler, now)
        if plan and plan.kind is WorkKind.TALKER_DECODE:
            fed.append(plan.rows[0].text_index)
    assert fed[:4] == [1, 2, TEXT_END, TEXT_PAD]  # x_1 went in with the prefill


def test_talker_waits_for_text_instead_of_inventing_it():
    scheduler = make_scheduler(length_model=False)
    r = admit(scheduler, make_request(1, tokens=2, chars=8, ended=False))
    _, now = run(scheduler, 0, lambda: r.phase is Phase.WAITING_TEXT and not r.codec_busy)
    frames = r.frames_generated
    plans, now = run(scheduler, now, lambda: False, max_steps=20)  # runs dry: only codec work is left
    assert all(p.kind is WorkKind.CODEC_CHUNK for p in plans) and scheduler.plan(now) is None
    assert r.frames_generated == frames and r.frames_pending == 0
    scheduler.append_text(1, [5, 6], 9)
    assert r.phase is Phase.TALKER_DECODE
    plans, now = run(scheduler, now, lambda: r.phase is Phase.WAITING_TEXT)
    decode_rows = [row for p in plans if p.kind is WorkKind.TALKER_DECODE for row in p.rows]
    assert [row.text_index for row in decode_rows] == [2, 3]
    assert not any(row.eos_allowed for row in decode_rows)  # EOS stays masked while the text is open


def test_eos_is_allowed_only_after_the_text_ended_and_ends_generation():
    scheduler = make_scheduler(length_model=False)
    r = admit(scheduler, make_request(1, tokens=3, chars=12, ended=False))
    _, now = run(scheduler, 0, lambda: r.phase is Phase.WAITING_TEXT)
    scheduler.end_text(1)
    seen_eos_allowed = False
    for _ in range(50):
        plan = scheduler.plan(now)
        assert plan is not None
        now += int(plan.predicted_ms * MS)
        eos = frozenset()
        if plan.kind is WorkKind.TALKER_DECODE and plan.rows[0].eos_allowed:
            seen_eos_allowed = True
            assert plan.eos_possible
            eos = frozenset({1})
        scheduler.complete(plan, Outcome(eos=eos), now)
        if r.is_ended:
            break
    assert seen_eos_allowed and r.phase is Phase.DONE and r.finish_reason is FinishReason.EOS
    assert r.frames_decoded == r.frames_generated and _all_free(scheduler)


def test_eos_on_a_masked_row_fails_the_request():
    scheduler = make_scheduler(length_model=False)
    r = admit(scheduler, make_request(1, tokens=5, chars=20, ended=False))
    _, now = run(scheduler, 0, lambda: r.phase is Phase.TALKER_DECODE and r.frames_generated >= 2)
    plan = scheduler.plan(now)
    while plan is not None and plan.kind is WorkKind.CODEC_CHUNK:
        scheduler.complete(plan, Outcome(), now)
        plan = scheduler.plan(now)
    assert plan is not None and plan.kind is WorkKind.TALKER_DECODE and not plan.eos_possible
    scheduler.complete(plan, Outcome(eos=frozenset({1})), now + MS)
    assert r.phase is Phase.FAILED and "masked" in (r.error or "") and _all_free(scheduler)


def test_runaway_cap_ends_generation_and_still_delivers_the_audio():
    scheduler = make_scheduler(length_model=False, runaway_base_frames=14, runaway_frames_per_token=2)
    r = admit(scheduler, make_request(1, tokens=3, chars=12))
    run(scheduler, 0, lambda: r.is_ended)
    assert r.finish_reason is FinishReason.RUNAWAY and r.frames_generated == 20
    assert r.frames_decoded == 20 and _all_free(scheduler)


@pytest.mark.parametrize("in_flight", [False, True])
def test_cancel_releases_every_resource(in_flight):
    scheduler = make_scheduler()
    r = admit(scheduler, make_request(1, tokens=30, chars=150))
    other = admit(scheduler, make_request(2, tokens=30, chars=150))
    _, now = run(scheduler, 0, lambda: r.first_audio_ns is not None)
    plan = scheduler.plan(now) if in_flight else None
    assert scheduler.cancel(1)
    if in_flight:
        assert plan is not None and 1 in plan.request_ids
        assert r.kv_slot is not None  # the executor still uses it until the plan completes
        scheduler.complete(plan, Outcome(), now + MS)
    assert r.phase is Phase.CANCELLED and r.kv_slot is None and r.codec_slot is None
    assert scheduler.pop_finished() == [r] and scheduler.get(1) is None
    assert scheduler.kv_slots.free_count == scheduler.kv_slots.size - 1  # only `other` holds slots
    assert not scheduler.cancel(1) and not scheduler.append_text(1, [1], 1)  # gone: quietly ignored
    later = scheduler.plan(now + MS)
    assert later is not None and later.request_ids == (2,)
    scheduler.cancel(other.request_id)
    scheduler.complete(later, Outcome(), now + 2 * MS)
    assert _all_free(scheduler) and scheduler.active_count == 0


def test_executor_failure_fails_only_that_request():
    scheduler = make_scheduler()
    a, b = admit(scheduler, make_request(1)), admit(scheduler, make_request(2))
    plan = scheduler.plan(0)
    assert plan is not None and set(plan.request_ids) == {1, 2}
    scheduler.complete(plan, Outcome(failed={1: "boom"}), MS)
    assert a.phase is Phase.FAILED and a.error == "boom" and a.kv_slot is None
    assert b.phase is Phase.CODE_PREDICT and b.kv_slot is not None


def test_without_a_gateway_deadline_playback_is_assumed_to_start_at_first_audio():
    scheduler = make_scheduler()
    r = admit(scheduler, make_request(1, tokens=30, chars=150))
    _, now = run(scheduler, 0, lambda: r.first_audio_ns is not None)
    assert r.effective_deadline_ns() == r.first_audio_ns + 80 * MS  # one frame published
    scheduler.set_deadline(1, now + 500 * MS)
    assert r.effective_deadline_ns() == now + 500 * MS
    scheduler.set_deadline(1, 0)  # back to the assumption
    assert r.effective_deadline_ns() == r.first_audio_ns + 80 * MS


def test_flush_publishes_pending_frames_without_waiting_for_a_full_chunk():
    scheduler = make_scheduler()
    r = admit(scheduler, make_request(1, tokens=60, chars=400))
    _, now = run(scheduler, 0, lambda: r.first_audio_ns is not None)
    scheduler.set_deadline(1, now + 60_000 * MS)  # a deep buffer: chunks would grow long
    _, now = run(scheduler, now, lambda: r.frames_pending >= 5 and not r.codec_busy)
    scheduler.flush(1)
    plan = scheduler.plan(now)
    assert plan is not None and plan.kind is WorkKind.CODEC_CHUNK and plan.codec_frames == r.frames_pending


def test_first_audio_waits_for_audible_samples():
    """A chunk whose samples were all trimmed as leading silence is not first audio."""
    scheduler = make_scheduler()
    r = admit(scheduler, make_request(1, tokens=30, chars=150))
    _, now = run(scheduler, 0, lambda: r.frames_generated >= 1 and not r.generation_busy)
    plan = scheduler.plan(now)
    assert plan is not None and plan.kind is WorkKind.CODEC_CHUNK
    scheduler.complete(plan, Outcome(samples={1: 0}), now + MS)
    assert r.first_audio_ns is None and r.frames_decoded == 1


def test_release_is_idempotent_and_double_frees_are_caught():
    pool_kv, pool_codec = SlotPool("kv", 2), SlotPool("codec", 2)
    r = make_request(1)
    assert r.attach_slots(pool_kv, pool_codec)
    r.release()
    r.release()
    assert pool_kv.free_count == 2 and pool_codec.free_count == 2
    slot = pool_kv.allocate()
    pool_kv.free(slot)
    with pytest.raises(AssertionError):
        pool_kv.free(slot)


def test_text_after_end_is_a_protocol_error():
    scheduler = make_scheduler()
    admit(scheduler, make_request(1))
    with pytest.raises(ValueError, match="after its end"):
        scheduler.append_text(1, [1], 1)


def test_non_streaming_layout_prefills_all_text_and_feeds_pad():
    scheduler = make_scheduler(length_model=False)
    r = admit(scheduler, make_request(1, tokens=4, chars=16, layout=Layout.NON_STREAMING, prefill_len=15))
    plans, _ = run(scheduler, 0, lambda: r.frames_generated >= 3)
    decode_rows = [row for p in plans if p.kind is WorkKind.TALKER_DECODE for row in p.rows]
    assert {row.text_index for row in decode_rows} == {TEXT_PAD}
    assert [row.position for row in decode_rows] == [15, 16]
    assert [row.eos_allowed for row in decode_rows] == [False, True]  # min_new_tokens = 2


def test_a_chunk_policy_from_engine_codec_chunking_plugs_in():
    from engine.codec.chunking import FixedSchedule

    scheduler = Scheduler(make_scheduler().config, make_scheduler().costs, FixedSchedule((1, 2, 4, 8)))
    r = admit(scheduler, make_request(1, tokens=10, chars=45))
    plans, _ = run(scheduler, 0, lambda: r.is_ended)
    chunks = [p.codec_frames for p in plans if p.kind is WorkKind.CODEC_CHUNK]
    assert chunks[:4] == [1, 2, 4, 8] and sum(chunks) == 41 and r.phase is Phase.DONE


@pytest.mark.parametrize("phase", list(Phase))
def test_a_request_has_finished_generating_in_finishing_and_every_ended_phase_only(phase):
    r = make_request(1, tokens=3, chars=12)
    r.phase = phase
    assert r.is_ended is (phase in (Phase.DONE, Phase.CANCELLED, Phase.FAILED))
    assert r.generation_finished is (phase is Phase.FINISHING or r.is_ended)
