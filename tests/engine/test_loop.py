"""The engine loop in this process (tiny model, no IPC): bad input gets a clear error for that request
only, the talker waits for streamed text instead of inventing it, and executor failures stay contained."""

from __future__ import annotations

import pytest

from engine.ipc.messages import (
    AppendText,
    Cancel,
    Done,
    DoneReason,
    EndText,
    Error,
    Layout,
    Sampling,
    Shutdown,
    Submit,
)
from engine.loop import MAX_FAILED_STEPS, EngineLoop
from engine.model.qwen3_tts import Qwen3TTS
from engine.request import Phase, WorkKind, length_model_frames
from tests.engine.helpers import (
    LINK,
    SENTENCES,
    assert_reference_audio,
    make_loop,
    record_plans,
    run_to_completion,
    submit,
    text_ids,
)


@pytest.fixture
def loop(tiny_model: Qwen3TTS) -> EngineLoop:
    return make_loop(tiny_model, kv_slots=4, max_batch=4)


def _replies(loop: EngineLoop) -> list:
    return [msg for _, msg in loop.take_replies()]


def _refused(loop: EngineLoop, msg: Submit) -> Error:
    loop.handle(LINK, msg, loop.clock())
    replies = _replies(loop)
    assert len(replies) == 2 and isinstance(replies[0], Error) and isinstance(replies[1], Done), replies
    assert replies[1].reason is DoneReason.ERROR and replies[0].request_id == replies[1].request_id == msg.request_id
    return replies[0]


def test_invalid_submits_are_refused_with_the_reason(loop: EngineLoop, tiny_model: Qwen3TTS) -> None:
    good = submit(tiny_model, 1, "Hello.")
    cases = {
        "unknown speaker": Submit(2, "nobody", "english", good.text_ids, 6, True),
        "unknown language": Submit(3, "ryan", "klingon", good.text_ids, 6, True),
        "must lie in": Submit(4, "ryan", "english", (10**9,), 1, True),
        "temperature": Submit(5, "ryan", "english", good.text_ids, 6, True, sampling=Sampling(temperature=0.0)),
        "whole text": Submit(6, "ryan", "english", good.text_ids, 6, False, layout=Layout.NON_STREAMING),
    }
    for fragment, msg in cases.items():
        error = _refused(loop, msg)
        assert error.code == "bad_request" and fragment in error.message, error
    loop.handle(LINK, good, loop.clock())
    assert _refused(loop, good).message == "request 1 is already running"
    assert loop.request_state(LINK, 1) is not None  # the duplicate did not disturb the running request


def test_shutdown_refuses_new_requests(loop: EngineLoop, tiny_model: Qwen3TTS) -> None:
    loop.handle(LINK, Shutdown(grace_ms=1000), loop.clock())
    assert _refused(loop, submit(tiny_model, 1, "Hello.")).code == "shutting_down"


def test_the_talker_waits_for_streamed_text_then_finishes_with_the_length_model(loop: EngineLoop,
                                                                                tiny_model: Qwen3TTS) -> None:
    first, rest = text_ids(tiny_model, "Hi"), text_ids(tiny_model, " there, how are you?")
    loop.handle(LINK, Submit(1, "ryan", "english", first, 2, False), loop.clock())
    while loop.step():
        pass
    state = loop.request_state(LINK, 1)
    assert state is not None and state.phase is Phase.WAITING_TEXT
    assert state.text_fed == len(first) and state.frames_generated == len(first)  # one frame per token fed
    loop.handle(LINK, AppendText(1, rest, 20), loop.clock())
    loop.handle(LINK, EndText(1), loop.clock())
    while loop.step():
        pass
    done = [m for m in _replies(loop) if isinstance(m, Done)]
    assert done == [Done(1, DoneReason.COMPLETED, done[0].samples, length_model_frames(22))]


def test_text_after_its_end_fails_only_that_request(loop: EngineLoop, tiny_model: Qwen3TTS) -> None:
    loop.handle(LINK, submit(tiny_model, 1, "Hello."), loop.clock())
    loop.handle(LINK, submit(tiny_model, 2, "Fine."), loop.clock())
    loop.handle(LINK, AppendText(1, text_ids(tiny_model, "more"), 4), loop.clock())
    loop.handle(LINK, Cancel(99), loop.clock())  # unknown ids are ignored: a late cancel is normal
    while loop.step():
        pass
    replies = _replies(loop)
    assert [m for m in replies if isinstance(m, Error)] == [Error(1, "bad_request", replies[0].message)]
    assert "after its end" in replies[0].message
    assert [m.reason for m in replies if isinstance(m, Done) and m.request_id == 2] == [DoneReason.COMPLETED]


def test_a_failing_step_fails_its_rows_and_repeated_failures_stop_the_engine(loop: EngineLoop,
                                                                             tiny_model: Qwen3TTS) -> None:
    real_launch = loop.executors.launch

    def broken(plan, inputs):
        raise RuntimeError("device lost")

    loop.executors.launch = broken  # type: ignore[method-assign]
    loop.handle(LINK, submit(tiny_model, 1, "Hello."), loop.clock())
    loop.step()
    replies = _replies(loop)
    assert replies[0] == Error(1, "internal", "talker_prefill step failed: RuntimeError: device lost")
    assert replies[1].reason is DoneReason.ERROR
    loop.executors.launch = real_launch  # type: ignore[method-assign]
    results, _ = run_to_completion(loop, [submit(tiny_model, 2, "Hello.")])
    assert results[2].done.reason is DoneReason.COMPLETED  # the engine kept serving

    loop.executors.launch = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="steps failed in a row"):
        for i in range(MAX_FAILED_STEPS):
            loop.handle(LINK, submit(tiny_model, 10 + i, "Hello."), loop.clock())
            loop.step()


def test_a_codec_batch_that_fails_on_one_row_fails_only_that_request(loop: EngineLoop, tiny_model: Qwen3TTS) -> None:
    # One stream's codes go bad (a code id past the codebook, as a broken sampler once produced): its
    # codec batch raises. The batch is rerun row by row, so only that request fails; the streams that
    # shared its batch still publish exactly their reference audio.
    predict = loop.executors.code_predictor.predict
    codes = loop.executors.codes

    def predict_then_poison_request_1(kv_slots, stream_slots, frame_index):  # type: ignore[no-untyped-def]
        predict(kv_slots, stream_slots, frame_index)
        victim = loop.request_state(LINK, 1)
        for slot, frame in zip(stream_slots, frame_index, strict=True):
            if victim is not None and slot == victim.codec_slot:
                codes[slot, frame, 5] = 10**6

    loop.executors.code_predictor.predict = predict_then_poison_request_1  # type: ignore[method-assign]
    plans = record_plans(loop)
    msgs = [submit(tiny_model, i, SENTENCES[i], seed=i) for i in (1, 2, 3)]
    results, _ = run_to_completion(loop, msgs)
    codec_batches = [p.request_ids for p in plans if p.kind is WorkKind.CODEC_CHUNK]

    victim_engine_id = min(min(batch) for batch in codec_batches)  # request 1 was admitted first
    assert any(len(batch) > 1 and victim_engine_id in batch for batch in codec_batches), codec_batches
    assert results[1].error is not None and results[1].error.code == "internal", results[1].error
    assert "codec_chunk step failed: IndexError" in results[1].error.message
    assert results[1].done.reason is DoneReason.ERROR
    for msg in msgs[1:]:
        assert_reference_audio(tiny_model, msg, results[msg.request_id])
