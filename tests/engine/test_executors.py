"""The executors, driven by the real scheduler and loop in this process, reproduce the reference loop:
each request of a batch gets exactly the frames `generate_codes` gives it alone (same seed), and the
PCM of a full decode of those frames."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from engine.ipc.messages import DoneReason, Layout, Sampling
from engine.model.qwen3_tts import Qwen3TTS
from engine.request import WorkKind, length_model_frames
from tests.engine.helpers import SENTENCES, make_loop, reference, run_to_completion, submit

GREEDY = Sampling(greedy=True, subtalker_greedy=True)


def _check_against_reference(model: Qwen3TTS, msgs, results, frames) -> None:
    for msg in msgs:
        codes, pcm = reference(model, msg)
        result = results[msg.request_id]
        assert result.error is None and result.done.reason is DoneReason.COMPLETED
        assert torch.equal(frames[msg.request_id], codes), f"request {msg.request_id}: frames differ"
        assert result.done.samples == len(result.samples) == len(pcm)
        wrong = np.flatnonzero(np.abs(result.samples.astype(np.int32) - pcm) > 1)
        assert wrong.size == 0, (f"request {msg.request_id}: PCM differs from a full decode from sample {wrong[0]} "
                                 f"(frame {wrong[0] // 1920}) on")
        assert result.firsts == 1


@pytest.mark.parametrize("sampling", [GREEDY, Sampling()], ids=["greedy", "sampled"])
def test_batched_requests_equal_each_request_alone(tiny_model: Qwen3TTS, sampling: Sampling) -> None:
    loop = make_loop(tiny_model)
    msgs = [submit(tiny_model, i + 1, text, seed=100 + i, sampling=sampling,
                   layout=Layout.NON_STREAMING if i % 3 == 2 else Layout.STREAMING,
                   speaker=("ryan", "vivian", "")[i % 3], language=("english", "auto")[i % 2])
            for i, text in enumerate(SENTENCES[:5])]
    results, frames = run_to_completion(loop, msgs)
    assert loop.lifetime_max_batch[WorkKind.TALKER_DECODE] > 1
    assert loop.lifetime_max_batch[WorkKind.CODE_PREDICT] > 1
    assert loop.lifetime_max_batch[WorkKind.CODEC_CHUNK] > 1
    for msg in msgs:
        assert results[msg.request_id].done.frames == length_model_frames(msg.text_chars)
    _check_against_reference(tiny_model, msgs, results, frames)


def test_end_of_speech_stops_a_real_weight_model_where_the_reference_stops(tiny_model: Qwen3TTS) -> None:
    # A "real-weight" model (EOS decides the length) whose EOS logit is amplified, so EOS is drawn after a
    # few frames; the non-streaming layout allows EOS from frame 2 in both the engine and the reference.
    model = copy.deepcopy(tiny_model)
    model.config = dataclasses.replace(model.config, random_weights=False)
    eos = model.config.talker.codec_eos_id
    with torch.no_grad():
        model.talker.codec_head.weight[eos] *= 8.0
    loop = make_loop(model)
    msgs = [submit(model, i + 1, text, seed=7 + i, layout=Layout.NON_STREAMING)
            for i, text in enumerate(SENTENCES[:4])]
    results, frames = run_to_completion(loop, msgs)
    lengths = [results[m.request_id].done.frames for m in msgs]
    assert all(n >= 2 for n in lengths) and len(set(lengths)) > 1, f"EOS did not vary the lengths: {lengths}"
    _check_against_reference(model, msgs, results, frames)


def test_a_model_that_never_ends_is_stopped_where_the_reference_stops_it(tiny_model: Qwen3TTS) -> None:
    # A "real-weight" model whose EOS can never win: the engine's runaway guard and the reference's stop
    # after the same 64 + 8 * text-token frames; the engine still delivers the audio made up to there.
    from engine.model.generate import RunawayError, generate_codes
    from engine.request import runaway_frame_cap
    from engine.text.prompt import build_prefill

    model = copy.deepcopy(tiny_model)
    model.config = dataclasses.replace(model.config, random_weights=False)
    eos = model.config.talker.codec_eos_id
    head = model.talker.codec_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.zero_()
        biased.bias[eos] = -1e4  # EOS loses for every hidden state
    model.talker.codec_head = biased
    msg = submit(model, 1, "Hi there.", seed=3, sampling=GREEDY)
    cap = runaway_frame_cap(len(msg.text_ids))
    prefill = build_prefill(model.config.prompt_ids, speaker=msg.speaker, language=msg.language,
                            text_ids=msg.text_ids, streaming=True)
    with pytest.raises(RunawayError, match=f"after {cap} frames"):
        generate_codes(model, prefill, msg.sampling, msg.seed)

    results, frames = run_to_completion(make_loop(model), [msg])
    result = results[1]
    assert result.error is not None and result.error.code == "runaway", result.error
    assert result.done.reason is DoneReason.ERROR and result.done.frames == cap
    expected = generate_codes(model, prefill, msg.sampling, msg.seed, max_frames=cap)
    assert torch.equal(frames[1], expected)
    assert result.done.samples == len(result.samples) > 0


def test_with_codec_gathering_the_warm_up_and_every_request_complete_with_the_reference_audio(
    tiny_model: Qwen3TTS,
) -> None:
    """Codec plans that wait for their window (`codec_gather_ms`) leave the loop with nothing to plan for a
    moment: the warm-up waits for the window instead of giving up, and no frame or sample is lost."""
    loop = make_loop(tiny_model, codec_gather_ms=200.0)
    loop.warm_up(submit(tiny_model, 1000, SENTENCES[0]))
    msgs = [submit(tiny_model, i + 1, text, seed=100 + i) for i, text in enumerate(SENTENCES[:3])]
    results, frames = run_to_completion(loop, msgs, max_steps=500_000)
    _check_against_reference(tiny_model, msgs, results, frames)
