"""Chunk policies: the fixed ramp, and the buffer-driven adaptive policy in a small playback simulation."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from engine.codec.chunking import AdaptivePolicy, ChunkPolicy, FixedSchedule


def test_fixed_schedule_follows_the_ramp_and_repeats_the_last_size():
    policy = FixedSchedule([1, 2, 4, 8, 12])
    decoded, sizes = 0, []
    for _ in range(7):
        size = policy.next_chunk_frames(decoded, 100, None, False, False)
        sizes.append(size)
        decoded += size
    assert sizes == [1, 2, 4, 8, 12, 12, 12]


def test_fixed_schedule_waits_for_a_whole_chunk_unless_flushed():
    policy = FixedSchedule([1, 2, 4, 8, 12])
    assert policy.next_chunk_frames(7, 7, 500.0, False, False) == 0  # needs 8
    assert policy.next_chunk_frames(7, 8, 500.0, False, False) == 8
    assert policy.next_chunk_frames(7, 5, 500.0, True, True) == 5
    assert policy.next_chunk_frames(7, 30, 500.0, True, True) == 8  # one chunk per call
    assert (
        policy.next_chunk_frames(9, 8, None, False, False) == 8
    )  # off-schedule after a flush: chunk 8's size


def test_adaptive_first_chunk_is_tiny_and_immediate():
    policy = AdaptivePolicy()
    assert policy.next_chunk_frames(0, 0, None, False, False) == 0
    assert policy.next_chunk_frames(0, 1, None, False, False) == 1
    assert policy.next_chunk_frames(0, 5, None, False, False) == 1
    assert AdaptivePolicy(first_chunk_frames=2).next_chunk_frames(0, 1, None, False, False) == 0


def test_adaptive_chunks_grow_with_the_buffer_and_shrink_as_it_runs_low():
    policy = AdaptivePolicy(sizes=(1, 2, 4, 8, 12), headroom=2.0, low_water_ms=160.0)
    assert [policy.target_frames(ms) for ms in (0, 159, 160, 320, 640, 1280, 1920, 10_000)] == [
        1,
        1,
        1,
        2,
        4,
        8,
        12,
        12,
    ]
    # Plenty buffered: wait until the target is ready, then take everything ready up to the cap.
    assert policy.next_chunk_frames(10, 3, 1280.0, False, False) == 0
    assert policy.next_chunk_frames(10, 8, 1280.0, False, False) == 8
    assert policy.next_chunk_frames(10, 11, 1280.0, False, False) == 8  # snapped to a captured size
    assert policy.next_chunk_frames(10, 40, 1280.0, False, False) == 12  # capped
    # Low buffer: whatever is ready, at once.
    assert policy.next_chunk_frames(10, 3, 150.0, False, False) == 2
    assert policy.next_chunk_frames(10, 1, 0.0, False, False) == 1
    # Unknown buffer after the first chunk: the fixed ramp.
    assert policy.next_chunk_frames(3, 4, None, False, False) == 4
    # Flush: what is ready, up to the cap, even off the captured sizes.
    assert policy.next_chunk_frames(10, 7, 5000.0, True, True) == 7


def test_policies_satisfy_the_protocol_and_reject_bad_settings():
    assert isinstance(FixedSchedule(), ChunkPolicy) and isinstance(AdaptivePolicy(), ChunkPolicy)
    with pytest.raises(ValueError):
        FixedSchedule([])
    with pytest.raises(ValueError):
        AdaptivePolicy(sizes=(2, 4))
    with pytest.raises(ValueError):
        AdaptivePolicy(first_chunk_frames=3)
    with pytest.raises(ValueError):
        AdaptivePolicy().next_chunk_frames(-1, 0, None, False, False)


# ------------------------------------------------------------------ playback simulation


@dataclass
class Outcome:
    ttfa_ms: float
    underrun_ms: float
    chunks: list[int]


def simulate(
    policy: ChunkPolicy,
    *,
    frames: int,
    frame_interval_ms: float,
    stall_at: int = -1,
    stall_ms: float = 0.0,
    call_ms: float = 3.0,
    per_frame_ms: float = 0.4,
) -> Outcome:
    """One stream: the talker emits a frame every `frame_interval_ms` (pausing `stall_ms` before frame
    `stall_at`, like a talker waiting for LLM text); one codec call at a time costs call_ms + per_frame_ms * n;
    playback starts at the first audio and runs in real time. 1 ms ticks."""
    ready_at, t = [], 0.0
    for k in range(frames):
        t += frame_interval_ms + (stall_ms if k == stall_at else 0.0)
        ready_at.append(t)
    decoded = delivered_frames = 0
    busy_until, pending, chunks = 0.0, 0, []
    ttfa = played = underrun = 0.0
    now = 0.0
    while delivered_frames < frames or played < frames * 80.0:
        if busy_until and now >= busy_until:  # a codec call finished: its audio reaches the listener
            delivered_frames += pending
            ttfa = ttfa or now
            busy_until, pending = 0.0, 0
        if ttfa:  # playback clock
            if played < delivered_frames * 80.0:
                played += 1.0
            elif delivered_frames < frames:
                underrun += 1.0
        generated = sum(1 for r in ready_at if r <= now)
        if not busy_until and decoded < generated:
            buffered = delivered_frames * 80.0 - played if ttfa else None
            n = policy.next_chunk_frames(decoded, generated - decoded, buffered, True, generated == frames)
            if n:
                chunks.append(n)
                decoded += n
                pending = n
                busy_until = now + call_ms + per_frame_ms * n
        now += 1.0
    return Outcome(ttfa, underrun, chunks)


def test_adaptive_policy_starts_as_fast_as_one_frame_chunks_with_far_fewer_codec_calls():
    kwargs = dict(frames=150, frame_interval_ms=40.0)  # talker at 2x realtime
    adaptive = simulate(AdaptivePolicy(), **kwargs)
    ones = simulate(FixedSchedule([1]), **kwargs)
    twelves = simulate(FixedSchedule([12]), **kwargs)
    assert adaptive.underrun_ms == 0 and ones.underrun_ms == 0
    assert adaptive.chunks[0] == 1 and adaptive.ttfa_ms == ones.ttfa_ms < twelves.ttfa_ms - 400
    assert max(adaptive.chunks) == 12  # grew to the cap once the buffer allowed
    assert len(adaptive.chunks) < len(ones.chunks) / 3
    assert sum(adaptive.chunks) == 150


def test_adaptive_policy_shrinks_chunks_through_a_talker_stall_and_underruns_less_than_the_ramp():
    kwargs = dict(
        frames=60, frame_interval_ms=70.0, stall_at=24, stall_ms=1500.0
    )  # barely faster than realtime
    adaptive = simulate(AdaptivePolicy(), **kwargs)
    ramp = simulate(FixedSchedule([1, 2, 4, 8, 12]), **kwargs)
    assert ramp.underrun_ms > 0  # waiting for a 12-frame chunk that the stalled talker cannot fill
    assert adaptive.underrun_ms < ramp.underrun_ms - 500
