"""A VoiceDesign model served by the engine: a Submit carrying the voice description as `instruct_ids` gets
exactly the frames and PCM of the reference loop (`build_voice_design_prefill` + `generate_codes`), in both
prompt layouts, alone or batched with other descriptions; what it cannot serve is refused with the reason."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from engine.codec.silence import LeadingSilenceTrimmer, SilenceConfig
from engine.executors.codec import to_int16
from engine.ipc.messages import DoneReason, Error, Layout, Sampling, Submit
from engine.model.generate import decode_codes, generate_codes
from engine.model.qwen3_tts import Qwen3TTS
from engine.model.weights import load_model
from engine.request import WorkKind
from engine.text.prompt import build_voice_design_prefill
from tests.engine.helpers import LINK, SENTENCES, make_loop, run_to_completion, text_ids

GREEDY = Sampling(greedy=True, subtalker_greedy=True)
CALM = "A calm, low male voice."
BRIGHT = "A bright, fast young woman's voice; excited."


@pytest.fixture(scope="module")
def design_model() -> Qwen3TTS:
    torch.set_num_threads(1)
    return load_model("tiny-voice-design", voice_models=True)


def _submit(model: Qwen3TTS, request_id: int, text: str, description: str, **kw: object) -> Submit:
    assert model.tokenizer is not None
    return Submit(request_id=request_id, speaker="", language="english", text_ids=text_ids(model, text),
                  text_chars=len(text), text_ended=True,
                  instruct_ids=tuple(model.tokenizer.instruct_ids(description)), **kw)  # type: ignore[arg-type]


def _reference(model: Qwen3TTS, msg: Submit) -> tuple[torch.Tensor, np.ndarray]:
    """The request alone through the reference loop -> (frames, the int16 PCM the engine must publish)."""
    prefill = build_voice_design_prefill(model.config.prompt_ids, language=msg.language, text_ids=msg.text_ids,
                                         instruct_ids=msg.instruct_ids, streaming=msg.layout is Layout.STREAMING)
    codes = generate_codes(model, prefill, msg.sampling, msg.seed, text_chars=msg.text_chars)
    trimmer = LeadingSilenceTrimmer(SilenceConfig())
    pcm = trimmer.push(decode_codes(model, codes))
    return codes, to_int16(np.concatenate([pcm, trimmer.finish()]))


def test_described_voices_equal_the_reference_voice_design_loop_alone_and_batched(design_model: Qwen3TTS) -> None:
    loop = make_loop(design_model)
    msgs = [_submit(design_model, 1, SENTENCES[0], CALM, sampling=GREEDY),
            _submit(design_model, 2, SENTENCES[1], BRIGHT, sampling=GREEDY, layout=Layout.NON_STREAMING),
            _submit(design_model, 3, SENTENCES[2], BRIGHT, seed=5)]  # fmt: skip
    results, frames = run_to_completion(loop, msgs)
    assert loop.lifetime_max_batch[WorkKind.TALKER_DECODE] > 1
    for msg in msgs:
        codes, pcm = _reference(design_model, msg)
        result = results[msg.request_id]
        assert result.error is None and result.done.reason is DoneReason.COMPLETED
        assert torch.equal(frames[msg.request_id], codes), f"request {msg.request_id}: frames differ"
        assert len(result.samples) == len(pcm)
        assert np.abs(result.samples.astype(np.int32) - pcm).max() <= 1
    # The description matters: the same sampled request described otherwise gives other frames.
    other, _ = _reference(design_model, _submit(design_model, 3, SENTENCES[2], CALM, seed=5))
    assert not torch.equal(frames[3], other)


def test_what_a_voice_design_model_cannot_serve_is_refused_with_the_reason(design_model: Qwen3TTS,
                                                                           tiny_model: Qwen3TTS) -> None:
    loop = make_loop(design_model, kv_slots=2, max_batch=2)
    good = _submit(design_model, 1, "Hello.", CALM)
    cases = {
        "needs instructions": dataclasses.replace(good, request_id=2, instruct_ids=()),
        "no saved voices or built-in speakers (got 'ryan')": dataclasses.replace(good, request_id=3, speaker="ryan"),
        "no saved voices or built-in speakers (got 'alloy')": dataclasses.replace(good, request_id=4, voice="alloy"),
    }
    for fragment, msg in cases.items():
        loop.handle(LINK, msg, loop.clock())
        errors = [r for _, r in loop.take_replies() if isinstance(r, Error)]
        assert len(errors) == 1 and errors[0].code == "bad_request" and fragment in errors[0].message, (fragment, errors)
    loop.handle(LINK, good, loop.clock())
    assert loop.request_state(LINK, 1) is not None and not any(
        isinstance(r, Error) for _, r in loop.take_replies()
    )
    custom = make_loop(tiny_model, kv_slots=2, max_batch=2)  # the rule is VoiceDesign's alone: CustomVoice needs none
    custom.handle(LINK, dataclasses.replace(good, speaker="ryan", instruct_ids=()), custom.clock())
    assert not any(isinstance(r, Error) for _, r in custom.take_replies())
