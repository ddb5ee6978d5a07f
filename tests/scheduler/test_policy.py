"""The scheduling policy, proven with simulated time: the cost model is the clock, outcomes are fake."""

from __future__ import annotations

import pytest

from engine.request import Phase, RequestState, WorkKind
from engine.scheduling import Lane, Outcome, Plan, Policy, Scheduler, SlackChunkPolicy
from engine.scheduling.chunk_sizing import request_chunk_frames

from .helpers import COSTS, MS, admit, make_request, make_scheduler, run, step


def _established_streams(scheduler: Scheduler, count: int, now: int) -> int:
    """`count` long streams, all playing, each with a distant deadline (so their work is filler)."""
    for rid in range(1, count + 1):
        admit(scheduler, make_request(rid, now, tokens=120, chars=600), now)
    streams = [scheduler.get(rid) for rid in range(1, count + 1)]
    _, now = run(scheduler, now, lambda: all(s.first_audio_ns is not None for s in streams))
    for _ in range(40):
        _, now = step(scheduler, now)
    for rid in range(1, count + 1):
        scheduler.set_deadline(rid, now + 10_000 * MS)
    return now


def _first_audio_plans(policy: Policy) -> list:
    scheduler = make_scheduler(policy=policy)
    now = _established_streams(scheduler, 40, 0)
    newcomer = admit(scheduler, make_request(99, now, tokens=10, chars=45), now)
    plans, _ = run(scheduler, now, lambda: newcomer.first_audio_ns is not None)
    return plans


def test_new_request_first_audio_is_not_delayed_by_filler_work():
    plans = _first_audio_plans(Policy.DEADLINE)
    assert all(99 in plan.request_ids for plan in plans), [p.kind for p in plans]
    assert [p.kind for p in plans] == [WorkKind.TALKER_PREFILL, WorkKind.CODE_PREDICT, WorkKind.CODEC_CHUNK]


def _newcomer_beside_a_decoding_cohort(**overrides: object) -> list:
    """A newcomer's plans up to first audio, admitted while 40 filler streams all wait for their talker decode."""
    scheduler = make_scheduler(**overrides)
    now = _established_streams(scheduler, 40, 0)
    cohort = [scheduler.get(rid) for rid in range(1, 41)]
    _, now = run(scheduler, now, lambda: all(r.phase is Phase.TALKER_DECODE and not r.generation_busy
                                             for r in cohort))
    newcomer = admit(scheduler, make_request(99, now, tokens=10, chars=45), now)
    plans, _ = run(scheduler, now, lambda: newcomer.first_audio_ns is not None)
    return plans


def test_while_slots_run_short_a_newcomer_prefills_after_the_cohorts_decode_and_joins_its_code_predictor():
    plans = _newcomer_beside_a_decoding_cohort(align_startup_rows=32, max_requests=48, max_codec_streams=48)
    kinds = [p.kind for p in plans]
    assert kinds == [WorkKind.TALKER_DECODE, WorkKind.TALKER_PREFILL, WorkKind.CODE_PREDICT, WorkKind.CODEC_CHUNK]
    assert len(plans[0].rows) == 40 and 99 not in plans[0].request_ids
    assert len(plans[2].rows) == 41 and 99 in plans[2].request_ids  # one code-predictor plan for all


def test_with_slots_to_spare_or_alignment_off_a_newcomer_prefills_at_once():
    for overrides in ({"align_startup_rows": 32}, {"align_startup_rows": 0, "max_requests": 48,
                                                   "max_codec_streams": 48}):
        plans = _newcomer_beside_a_decoding_cohort(**overrides)
        kinds = [p.kind for p in plans]
        assert kinds == [WorkKind.TALKER_PREFILL, WorkKind.CODE_PREDICT, WorkKind.CODEC_CHUNK], overrides
        assert plans[1].request_ids == (99,)  # the cohort is in the other phase: a code predictor of its own


def test_without_the_startup_tier_filler_delays_first_audio():
    """The same scene under plain FIFO: the newcomer waits behind older streams (so the test above can fail)."""
    plans = _first_audio_plans(Policy.FIFO)
    assert any(99 not in plan.request_ids for plan in plans)


# The two scenes below bring 40 streams to 8-frame chunks together with powers-of-two codec batches (40 rows padded
# to 64); with a 48-row size, early rows fill the smaller padding and keep some streams below 8 frames until they end.
POWERS_OF_TWO = {"codec_capture_sizes": (1, 2, 4, 8, 16, 32, 64)}


def _first_audio_beside_long_chunks(urgent_stream: int | None = None, **overrides: object):
    """A newcomer's first-audio codec plan, admitted when 40 playing streams with distant deadlines each have a
    long chunk (8+ frames) ready; `urgent_stream` is brought 58 ms from running dry and flushed."""
    scheduler = make_scheduler(**{**POWERS_OF_TWO, **overrides})
    now = _established_streams(scheduler, 40, 0)

    def long_chunks_ready() -> bool:
        return all(request_chunk_frames(scheduler.get(rid), now, scheduler.slack_chunks) >= 8 for rid in range(1, 41))

    while not long_chunks_ready():
        _, now = step(scheduler, now)
    newcomer = admit(scheduler, make_request(99, now, tokens=10, chars=45), now)
    if urgent_stream is not None:
        scheduler.set_deadline(urgent_stream, now + 58 * MS)  # urgent (slack < 60 ms), not yet a rescue
        scheduler.flush(urgent_stream)
    plans, _ = run(scheduler, now, lambda: newcomer.first_audio_ns is not None)
    assert plans[-1].kind is WorkKind.CODEC_CHUNK and 99 in plans[-1].request_ids
    return plans[-1]


def test_a_newcomers_first_chunk_is_a_plan_of_its_own_on_the_generation_lane():
    """The default (first_chunk_lane): no playing stream's long chunk is cut to the newcomer's one frame, and the
    newcomer's first audio queues behind generation work only, never behind the codec lane."""
    plan = _first_audio_beside_long_chunks()
    assert plan.request_ids == (99,) and plan.rows[0].codec_frames == 1
    assert plan.first_chunks and plan.lane is Lane.GENERATION


def test_with_one_codec_lane_every_stream_with_frames_ready_decodes_the_newcomers_one_frame():
    """The scene above with one lane for every chunk: 31 long chunks are cut to one frame each."""
    plan = _first_audio_beside_long_chunks(first_chunk_lane=False)
    assert len(plan.rows) > 1 and all(row.codec_frames == 1 for row in plan.rows)
    assert not plan.first_chunks and plan.lane is Lane.CODEC


def test_with_a_join_ratio_a_stream_with_a_long_chunk_ready_does_not_join_a_newcomers_one_frame_chunk():
    plan = _first_audio_beside_long_chunks(codec_join_ratio=4.0, first_chunk_lane=False)
    assert plan.request_ids == (99,) and plan.rows[0].codec_frames == 1


def test_with_a_join_ratio_an_urgent_stream_joins_a_newcomers_chunk_whatever_its_own_chunk():
    plan = _first_audio_beside_long_chunks(urgent_stream=7, codec_join_ratio=4.0, first_chunk_lane=False)
    assert set(plan.request_ids) == {99, 7}


def _codec_plan_while_a_newcomer_waits(**overrides: object) -> Plan:
    """The codec-lane plan picked while 40 playing streams have long chunks ready and a newcomer awaits audio."""
    scheduler = make_scheduler(**{**POWERS_OF_TWO, **overrides})
    now = _established_streams(scheduler, 40, 0)
    while not all(request_chunk_frames(scheduler.get(rid), now, scheduler.slack_chunks) >= 8 for rid in range(1, 41)):
        _, now = step(scheduler, now)
    admit(scheduler, make_request(99, now, tokens=10, chars=45), now)
    plan = scheduler.plan(now, frozenset({Lane.CODEC}))
    assert plan is not None and plan.kind is WorkKind.CODEC_CHUNK and 99 not in plan.request_ids
    assert scheduler.startup_waiting
    return plan


def test_codec_lane_plans_keep_the_step_budget_while_a_newcomer_waits_on_the_other_lane():
    cfg = make_scheduler().config
    lanes = _codec_plan_while_a_newcomer_waits()
    assert cfg.startup_codec_ms < lanes.predicted_ms <= cfg.max_step_ms
    one_lane = _codec_plan_while_a_newcomer_waits(first_chunk_lane=False)  # the newcomer would wait behind it
    assert one_lane.predicted_ms <= cfg.startup_codec_ms < lanes.predicted_ms
    assert len(one_lane.rows) < len(lanes.rows)


def test_a_lane_with_no_room_on_the_device_gets_no_plan():
    scheduler = make_scheduler()
    now = _established_streams(scheduler, 8, 0)
    while not any(request_chunk_frames(scheduler.get(rid), now, scheduler.slack_chunks) for rid in range(1, 9)):
        _, now = step(scheduler, now)
    for lanes in (frozenset({Lane.GENERATION}), frozenset({Lane.CODEC}), frozenset()):
        plan = scheduler.plan(now, lanes)
        assert plan is None or plan.lane in lanes, lanes
        if plan is not None:
            scheduler.complete(plan, Outcome(), now)


def _two_playing_streams() -> tuple[Scheduler, RequestState, RequestState, int]:
    """Streams 1 and 2, playing, each with frames generated and its talker decode next."""
    scheduler = make_scheduler()
    a, b = make_request(1, 0, tokens=60, chars=300), make_request(2, 0, tokens=60, chars=300)
    admit(scheduler, a, 0)
    admit(scheduler, b, 0)
    _, now = run(scheduler, 0, lambda: a.frames_generated >= 3 and b.frames_generated >= 3
                 and a.phase is Phase.TALKER_DECODE and b.phase is Phase.TALKER_DECODE)
    return scheduler, a, b, now


def test_stream_near_its_deadline_preempts_one_far_from_it():
    scheduler, a, b, now = _two_playing_streams()
    scheduler.set_deadline(1, now + 5_000 * MS)  # a: far
    scheduler.set_deadline(2, now + 20 * MS)  # b: about to run dry
    plan = scheduler.plan(now)
    assert plan is not None and plan.kind is WorkKind.CODEC_CHUNK and plan.request_ids == (2,)


def test_deadline_updates_take_effect_at_the_next_plan():
    scheduler, a, b, now = _two_playing_streams()
    scheduler.set_deadline(1, now + 5_000 * MS)
    scheduler.set_deadline(2, now + 5_000 * MS)
    plan = scheduler.plan(now)
    assert plan is not None and plan.kind is WorkKind.TALKER_DECODE and set(plan.request_ids) == {1, 2}
    scheduler.complete(plan, Outcome(), now + MS)
    now += MS
    scheduler.set_deadline(1, now + 15 * MS)  # the gateway learns a's client is almost dry
    plan = scheduler.plan(now)
    assert plan is not None and plan.kind is WorkKind.CODEC_CHUNK and plan.request_ids == (1,)


@pytest.mark.parametrize("counted", [False, True])
def test_audio_published_after_the_gateways_deadline_moves_it_later_when_the_deadline_says_what_it_counted(counted):
    # The gateway tells the engine a later deadline only when its listener drifts from the engine's reckoning; a
    # deadline that names the audio it counted as sent moves on by each chunk published after it, so a stream that
    # was just rescued is not still taken for one about to run dry (and its next work is not rescue work).
    scheduler, a, b, now = _two_playing_streams()
    scheduler.set_deadline(1, now + 5_000 * MS)
    scheduler.set_deadline(2, now + 20 * MS, b.samples_published if counted else None)
    rescue = scheduler.plan(now)
    assert rescue is not None and rescue.kind is WorkKind.CODEC_CHUNK and rescue.request_ids == (2,)
    sent = b.samples_published
    scheduler.complete(rescue, Outcome(), now + 2 * MS)
    now += 2 * MS
    published_ms = (b.samples_published - sent) / 24
    assert published_ms >= 80  # at least one frame of audio
    expected_ms = 18 + published_ms if counted else 18
    assert b.effective_deadline_ns() - now == pytest.approx(expected_ms * MS, abs=MS // 1000)
    before = scheduler.pressure
    plan = scheduler.plan(now)
    assert plan is not None and plan.kind is WorkKind.TALKER_DECODE and set(plan.request_ids) == {1, 2}
    assert (scheduler.pressure <= before) if counted else (scheduler.pressure > before)


def test_oversize_cohorts_are_split_across_turns():
    scheduler = make_scheduler(admission_control=False)
    requests = [admit(scheduler, make_request(rid, 0), 0) for rid in range(1, 201)]
    _, now = run(scheduler, 0, lambda: all(r.phase is Phase.CODE_PREDICT for r in requests))
    first, second = scheduler.plan(now), scheduler.plan(now)  # the first is still "running"
    assert first is not None and second is not None
    assert first.kind is second.kind is WorkKind.CODE_PREDICT
    assert (len(first.rows), first.padded_batch) == (128, 128)
    assert (len(second.rows), second.padded_batch) == (72, 128)
    assert set(first.request_ids).isdisjoint(second.request_ids)
    assert scheduler.plan(now) is None  # every lane is busy: nothing is planned twice


def _codec_plan_after_64_streams_flush(**overrides: object):
    """The codec plan when 64 streams, 30 frames each generated, all flush (step budget 8 ms)."""
    scheduler = make_scheduler(admission_control=False, max_step_ms=8.0, **overrides)
    requests = [admit(scheduler, make_request(rid, 0, tokens=40, chars=200), 0) for rid in range(1, 65)]
    _, now = run(scheduler, 0, lambda: all(r.frames_generated >= 30 for r in requests))
    for r in requests:
        scheduler.flush(r.request_id)
    plan = scheduler.plan(now)
    assert plan is not None and plan.kind is WorkKind.CODEC_CHUNK
    return plan


def test_a_batch_is_cut_to_the_step_budget_but_the_anchor_always_runs():
    plan = _codec_plan_after_64_streams_flush()
    assert plan.predicted_ms <= 8.0 and len(plan.rows) < 64


def test_while_slots_run_short_a_batch_may_take_the_saturated_step_budget():
    def codec_plan(slots: int):
        return _codec_plan_after_64_streams_flush(saturated_step_ms=20.0, max_requests=slots, max_codec_streams=slots)

    spare = codec_plan(256)  # 64 of 256 slots in use: the plain budget
    assert spare.predicted_ms <= 8.0
    short = codec_plan(72)  # 8 of 72 free, under pacing_min_free_share: the GPU is the limit
    assert 8.0 < short.predicted_ms <= 20.0
    assert len(short.rows) * short.codec_frames > len(spare.rows) * spare.codec_frames


def test_split_phases_merge_with_the_majority_first():
    """Filler streams alternate code predictor and talker decode; a straggler in the other phase waits
    one step so that everyone shares the next batch, instead of two half-full steps per frame."""
    scheduler = make_scheduler()
    group = [admit(scheduler, make_request(rid, 0, tokens=60, chars=300), 0) for rid in range(1, 9)]
    straggler = admit(scheduler, make_request(9, 0, tokens=2, chars=10, ended=False), 0)
    _, now = run(scheduler, 0, lambda: straggler.phase is Phase.WAITING_TEXT
                 and all(r.phase is Phase.CODE_PREDICT and r.first_audio_ns for r in group)
                 and not any(r.codec_busy or r.generation_busy for r in group))
    for r in group:
        scheduler.set_deadline(r.request_id, now + 10_000 * MS)
    scheduler.set_deadline(9, now + 2_000 * MS)  # earliest deadline, but not urgent
    scheduler.append_text(9, [7, 8, 9], 12)  # the straggler resumes in the talker-decode phase
    plan, now = step(scheduler, now)
    while plan is not None and plan.kind is WorkKind.CODEC_CHUNK:
        plan, now = step(scheduler, now)
    assert plan is not None and plan.kind is WorkKind.CODE_PREDICT and len(plan.rows) == 8
    plan, now = step(scheduler, now)
    while plan is not None and plan.kind is WorkKind.CODEC_CHUNK:
        plan, now = step(scheduler, now)
    assert plan is not None and plan.kind is WorkKind.TALKER_DECODE and len(plan.rows) == 9


def test_chunks_are_tiny_when_the_buffer_is_thin_and_grow_with_it():
    policy = SlackChunkPolicy(COSTS, first_chunk_frames=1, margin_ms=40.0)
    assert policy.next_chunk_frames(0, 1, 0.0, False, None) == 1  # first audio: one frame, at once
    assert policy.next_chunk_frames(5, 8, 30.0, False, 12.0) == 2  # nearly dry: what exists, allowed size
    assert policy.next_chunk_frames(5, 6, 200.0, False, 12.0) == 0  # worth waiting for a longer chunk
    assert policy.next_chunk_frames(5, 30, 3_000.0, False, 12.0) == 25  # deep buffer: the longest chunk
    assert policy.next_chunk_frames(5, 9, 3_000.0, False, 12.0) == 0
    fast = max(n for n in range(1, 30) if policy.next_chunk_frames(0 + 1, 1 + n, 400.0, False, 10.0))
    slow = max((n for n in range(1, 30) if policy.next_chunk_frames(1, 1 + n, 400.0, False, 70.0)), default=0)
    assert fast >= slow  # a request generated slowly waits for fewer frames


def test_flush_drains_pending_frames_in_one_chunk():
    policy = SlackChunkPolicy(COSTS)
    assert policy.next_chunk_frames(10, 17, 3_000.0, True, 12.0) == 7
    assert policy.next_chunk_frames(10, 60, 3_000.0, True, 12.0) == 25


def _newcomers_first_codec_plan(**overrides: object):
    """40 playing streams with a largest chunk each still to decode and audio to spare (filler), then a newcomer:
    -> the codec plan its first audio rides in (its own first chunk anchors; the streams' chunks fill)."""
    scheduler = make_scheduler(**overrides)
    now = _established_streams(scheduler, 40, 0)
    for rid in range(1, 41):
        stream = scheduler.get(rid)
        stream.frames_generated = stream.frames_decoded + 25  # a largest chunk ready to decode
    newcomer = admit(scheduler, make_request(99, now, tokens=10, chars=45), now)
    plans, _ = run(scheduler, now, lambda: newcomer.first_audio_ns is not None)
    first_audio = [p for p in plans if p.kind is WorkKind.CODEC_CHUNK and 99 in p.request_ids]
    assert len(first_audio) == 1
    return first_audio[0]


def test_with_one_codec_lane_a_newcomers_first_codec_batch_is_predicted_within_the_startup_budget():
    one_lane = {"first_chunk_lane": False, "max_step_ms": 50.0, "codec_join_ratio": 0.0}
    bounded = _newcomers_first_codec_plan(startup_codec_ms=4.0, **one_lane)
    assert bounded.predicted_ms <= 4.0 and bounded.rows[0].request_id == 99
    # Without the startup budget the same batch is larger and slower, so the bound above can fail.
    unbounded = _newcomers_first_codec_plan(startup_codec_ms=50.0, **one_lane)
    assert len(unbounded.rows) > len(bounded.rows) and unbounded.predicted_ms > 4.0


def test_with_the_first_chunk_lane_a_newcomers_first_audio_rides_with_first_chunks_only():
    plan = _newcomers_first_codec_plan(startup_codec_ms=4.0, max_step_ms=50.0)
    assert plan.request_ids == (99,) and plan.first_chunks and plan.predicted_ms <= 4.0


def _first_audio_plans_beside_streams_due_in(deadline_ms: float) -> list:
    """A newcomer's plans up to its first audio, beside 40 playing streams whose listeners run dry in `deadline_ms`
    """
    scheduler = make_scheduler()
    now = _established_streams(scheduler, 40, 0)
    for rid in range(1, 41):
        scheduler.set_deadline(rid, now + int(deadline_ms * MS))
    newcomer = admit(scheduler, make_request(99, now, tokens=10, chars=45), now)
    plans, _ = run(scheduler, now, lambda: newcomer.first_audio_ns is not None)
    return plans


def test_streams_with_some_slack_left_do_not_hold_a_newcomers_first_audio_back():
    """Urgent (slack under urgent_slack_ms, 60) but above rescue_slack_ms (40): the newcomer goes first."""
    plans = _first_audio_plans_beside_streams_due_in(62)
    assert [p.kind for p in plans] == [WorkKind.TALKER_PREFILL, WorkKind.CODE_PREDICT, WorkKind.CODEC_CHUNK]
    assert all(99 in plan.request_ids for plan in plans)


def test_streams_about_to_run_dry_are_rescued_before_a_newcomer_starts():
    plans = _first_audio_plans_beside_streams_due_in(25)
    assert any(99 not in plan.request_ids for plan in plans)


@pytest.mark.parametrize("ragged", [False, True])
def test_a_ragged_codec_batch_lets_each_row_decode_its_own_chunk(ragged: bool):
    """Uniform (the default; here with `codec_join_ratio` off, so b joins): every row decodes the anchor's chunk.
    Ragged (`ragged_codec`): a row with more frames ready drains them in the same step, padded to the largest."""
    scheduler = make_scheduler(ragged_codec=ragged, codec_join_ratio=0.0)
    a = admit(scheduler, make_request(1, 0, tokens=60, chars=300), 0)
    b = admit(scheduler, make_request(2, 0, tokens=60, chars=300), 0)
    _, now = run(scheduler, 0, lambda: all(r.first_audio_ns is not None and not r.codec_busy
                                           and not r.generation_busy for r in (a, b)))
    a.frames_generated = a.frames_decoded + 1
    b.frames_generated = b.frames_decoded + 8
    scheduler.set_deadline(1, now + 30 * MS)  # a is about to run dry: its one frame anchors
    scheduler.flush(2)  # b drains all 8
    plan = scheduler.plan(now)
    assert plan is not None and plan.kind is WorkKind.CODEC_CHUNK and plan.rows[0].request_id == 1
    frames = {row.request_id: row.codec_frames for row in plan.rows}
    assert frames == ({1: 1, 2: 8} if ragged else {1: 1, 2: 1})
    assert plan.codec_frames == (8 if ragged else 1)


def _filler_codec_rows_ready(**overrides: object) -> tuple[Scheduler, int]:
    """Eight playing streams far from running dry, each with a codec chunk ready on the codec lane."""
    scheduler = make_scheduler(**overrides)
    now = _established_streams(scheduler, 8, 0)
    while not all(request_chunk_frames(scheduler.get(rid), now, scheduler.slack_chunks) for rid in range(1, 9)):
        _, now = step(scheduler, now)
    return scheduler, now


def _codec_plans_a_moment_apart(**overrides: object) -> tuple[Plan | None, Scheduler, int]:
    """A codec-lane plan at `now`, generation until rows are ready again, then the codec lane asked 10 ms later."""
    scheduler, now = _filler_codec_rows_ready(**overrides)
    first = scheduler.plan(now, frozenset({Lane.CODEC}))
    assert first is not None and first.lane is Lane.CODEC
    scheduler.complete(first, Outcome(), now + MS)
    while not any(request_chunk_frames(scheduler.get(rid), now, scheduler.slack_chunks)
                  and not scheduler.get(rid).codec_busy for rid in range(1, 9)):  # fmt: skip
        plan = scheduler.plan(now, frozenset({Lane.GENERATION}))
        assert plan is not None
        scheduler.complete(plan, Outcome(), now)
    return scheduler.plan(now + 10 * MS, frozenset({Lane.CODEC})), scheduler, now


def test_with_codec_gathering_filler_codec_plans_start_at_most_once_per_window():
    plan, scheduler, now = _codec_plans_a_moment_apart(codec_gather_ms=30.0)
    assert plan is None  # rows are ready, but the window is open: they gather
    assert scheduler.next_wake_ns(now + 10 * MS) == now + 30 * MS  # the loop wakes when it closes
    later = scheduler.plan(now + 30 * MS, frozenset({Lane.CODEC}))
    assert later is not None and later.lane is Lane.CODEC


def test_with_codec_gathering_a_stream_running_low_ends_the_gathering_before_it_turns_urgent():
    """Nothing else need wake an idle loop before the window closes: a stream that runs low meanwhile must not
    wait for the window, and its plan runs as filler work, not as an urgent rescue (admission counts those)."""
    plan, scheduler, now = _codec_plans_a_moment_apart(codec_gather_ms=30.0)
    assert plan is None
    waiting = next(rid for rid in range(1, 9)
                   if (r := scheduler.get(rid)).frames_generated > r.frames_decoded and not r.codec_busy)  # fmt: skip
    scheduler.set_deadline(waiting, now + 100 * MS)  # urgent (slack < 60 ms) from about now + 39 ms
    wake = scheduler.next_wake_ns(now + 10 * MS)
    assert wake is not None and now + 10 * MS < wake < now + 30 * MS  # its headroom: 20 ms before it
    assert scheduler.plan(wake - 2 * MS, frozenset({Lane.CODEC})) is None  # it gathers until then
    pressure = scheduler.pressure
    plan = scheduler.plan(wake, frozenset({Lane.CODEC}))
    assert plan is not None and waiting in plan.request_ids
    assert scheduler.pressure < pressure  # filler work, not a rescue: the share of rescue work falls


def test_with_codec_gathering_codec_plans_run_back_to_back_once_rescues_take_much_of_the_device():
    plan, scheduler, now = _codec_plans_a_moment_apart(codec_gather_ms=30.0)
    assert plan is None  # it gathers
    while scheduler.pressure < 0.75 * scheduler.config.max_pressure:  # as recent rescues leave it
        scheduler.rescues.record(WorkKind.CODE_PREDICT, 5.0, rescue=True)
    plan = scheduler.plan(now + 10 * MS, frozenset({Lane.CODEC}))
    assert plan is not None and plan.lane is Lane.CODEC


def test_without_codec_gathering_codec_plans_run_back_to_back():
    plan, _, _ = _codec_plans_a_moment_apart(codec_gather_ms=0.0)
    assert plan is not None and plan.lane is Lane.CODEC


def test_with_codec_gathering_a_stream_near_running_dry_is_decoded_at_once():
    scheduler, now = _filler_codec_rows_ready(codec_gather_ms=30.0)
    first = scheduler.plan(now, frozenset({Lane.CODEC}))
    assert first is not None
    scheduler.complete(first, Outcome(), now)
    waiting = [rid for rid in range(1, 9) if rid not in first.request_ids]
    assert waiting, "the first plan took every row: nothing left to test"
    scheduler.set_deadline(waiting[0], now + 20 * MS)  # urgent now
    plan = scheduler.plan(now + MS, frozenset({Lane.CODEC}))
    assert plan is not None and waiting[0] in plan.request_ids


def _streams_with_frames_ready_but_not_due(count: int, pending: int, **overrides: object) -> tuple[Scheduler, int]:
    """`count` playing streams far from running dry, each with `pending` frames generated and not decoded: too
    few for the chunk its pace allows (the chunk policy waits for more), so no codec chunk of theirs is due."""
    scheduler = make_scheduler(**overrides)
    now = _established_streams(scheduler, count, 0)
    for rid in range(1, count + 1):
        r = scheduler.get(rid)
        r.frames_generated = r.frames_decoded + pending
        assert not r.codec_busy and request_chunk_frames(r, now, scheduler.slack_chunks) == 0
    return scheduler, now


def test_a_codec_plan_takes_streams_whose_chunk_is_not_due_yet_when_they_have_its_frames_ready():
    scheduler, now = _streams_with_frames_ready_but_not_due(10, 8, codec_fill_frames=4, codec_fill_ms=1e6)
    scheduler.flush(1)  # stream 1's 8 frames are due now: it anchors an 8-frame codec plan
    plan = scheduler.plan(now, frozenset({Lane.CODEC}))
    assert plan is not None and plan.kind is WorkKind.CODEC_CHUNK and plan.rows[0].request_id == 1
    assert set(plan.request_ids) == set(range(1, 11)) and all(row.codec_frames == 8 for row in plan.rows)


def test_without_filling_a_codec_plan_takes_only_the_streams_whose_chunk_is_due():
    scheduler, now = _streams_with_frames_ready_but_not_due(10, 8, codec_fill_frames=0)
    scheduler.flush(1)
    plan = scheduler.plan(now, frozenset({Lane.CODEC}))
    assert plan is not None and plan.request_ids == (1,)


def test_streams_whose_chunk_is_not_due_never_start_a_codec_plan():
    scheduler, now = _streams_with_frames_ready_but_not_due(10, 8, codec_fill_frames=4, codec_fill_ms=1e6)
    assert scheduler.plan(now, frozenset({Lane.CODEC})) is None


def test_a_codec_plan_of_fewer_frames_than_the_fill_size_takes_no_early_stream():
    scheduler, now = _streams_with_frames_ready_but_not_due(10, 8, codec_fill_frames=4, codec_fill_ms=1e6)
    r = scheduler.get(1)
    r.frames_generated = r.frames_decoded + 2
    scheduler.flush(1)  # a 2-frame plan: early streams would decode a sliver of what they have
    plan = scheduler.plan(now, frozenset({Lane.CODEC}))
    assert plan is not None and plan.request_ids == (1,) and plan.codec_frames == 2


def test_early_streams_fill_a_codec_plans_padding_but_grow_it_only_within_the_fill_budget():
    scheduler, now = _streams_with_frames_ready_but_not_due(10, 8, codec_fill_frames=4, codec_fill_ms=0.0)
    for rid in (1, 2, 3):
        scheduler.flush(rid)  # three due rows: a batch padded to 4, so one early row rides along for free
    plan = scheduler.plan(now, frozenset({Lane.CODEC}))
    assert plan is not None and plan.padded_batch == 4 and len(plan.rows) == 4
    assert {1, 2, 3} <= set(plan.request_ids)
    budget = COSTS.ms(WorkKind.CODEC_CHUNK, 8, 8)  # time of the batch of 8 the early rows could grow it to
    scheduler, now = _streams_with_frames_ready_but_not_due(10, 8, codec_fill_frames=4, codec_fill_ms=budget)
    for rid in (1, 2, 3):
        scheduler.flush(rid)
    plan = scheduler.plan(now, frozenset({Lane.CODEC}))
    assert plan is not None and plan.padded_batch == 8 and len(plan.rows) == 8
