"""With early codec rows (`--codec-fill-frames`) a codec plan also decodes streams whose own chunk is not due yet,
so the same requests take fewer codec plans, and every request still publishes exactly its reference audio."""

from __future__ import annotations

from engine.request import WorkKind
from engine.scheduling import Lane
from tests.engine.helpers import (
    SENTENCES,
    StepClock,
    assert_reference_audio,
    make_loop,
    record_plans,
    run_to_completion,
    submit,
)


def _codec_lane_plans(tiny_model, msgs, **settings):  # type: ignore[no-untyped-def]
    loop = make_loop(tiny_model, clock=StepClock(), **settings)
    plans = record_plans(loop)
    results, _ = run_to_completion(loop, msgs, submit_at=[0, 0, 20, 40, 60, 80])
    return results, [len(p.rows) for p in plans if p.kind is WorkKind.CODEC_CHUNK and p.lane is Lane.CODEC]


def test_early_codec_rows_decode_the_same_audio_in_fewer_codec_plans(tiny_model):
    long_texts = [" ".join(SENTENCES[i:] + SENTENCES[:i]) for i in range(6)]  # ~190 characters: ~170 frames each
    msgs = [submit(tiny_model, i, text, seed=i) for i, text in enumerate(long_texts)]
    _, without = _codec_lane_plans(tiny_model, msgs, codec_fill_frames=0)
    results, with_fill = _codec_lane_plans(tiny_model, msgs, codec_fill_frames=4, codec_fill_ms=1e6)
    assert len(with_fill) < len(without) and max(with_fill) > max(without)
    for msg in msgs:
        assert_reference_audio(tiny_model, msg, results[msg.request_id])
