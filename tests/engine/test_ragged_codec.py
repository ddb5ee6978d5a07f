"""With ragged codec batches (`--ragged-codec`) rows of one codec plan decode different frame counts, and every
request still publishes exactly the audio of its reference decode."""

from __future__ import annotations

from engine.request import WorkKind
from tests.engine.helpers import (
    SENTENCES,
    StepClock,
    assert_reference_audio,
    make_loop,
    record_plans,
    run_to_completion,
    submit,
)


def test_ragged_codec_plans_give_every_request_its_reference_audio(tiny_model):
    loop = make_loop(tiny_model, ragged_codec=True, clock=StepClock())
    plans = record_plans(loop)
    msgs = [submit(tiny_model, i, SENTENCES[i], seed=i) for i in range(6)]
    # Staggered arrivals: streams further along hold larger chunks, newcomers single frames.
    results, _ = run_to_completion(loop, msgs, submit_at=[0, 0, 30, 60, 90, 120])
    ragged_plans = [p for p in plans if p.kind is WorkKind.CODEC_CHUNK
                    and any(r.codec_frames != p.codec_frames for r in p.rows)]  # fmt: skip
    assert ragged_plans, "no codec plan mixed frame counts: the test did not exercise ragged batches"
    for msg in msgs:
        assert_reference_audio(tiny_model, msg, results[msg.request_id])


def test_without_the_flag_every_codec_plan_decodes_one_frame_count(tiny_model):
    loop = make_loop(tiny_model, clock=StepClock())
    plans = record_plans(loop)
    run_to_completion(loop, [submit(tiny_model, i, SENTENCES[i], seed=i) for i in range(6)],
                      submit_at=[0, 0, 30, 60, 90, 120])
    shapes = [{r.codec_frames for r in p.rows} | {p.codec_frames} for p in plans if p.kind is WorkKind.CODEC_CHUNK]
    assert shapes and all(len(s) == 1 for s in shapes)
