"""Reference generation: batched equals per-request, stopping rules, length model, teacher forcing."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from torch import nn

from engine.ipc.messages import Sampling
from engine.model.generate import (
    RunawayError,
    decode_codes,
    generate_batch,
    generate_codes,
    synthesize,
    teacher_forced_probs,
)
from engine.model.qwen3_tts import Qwen3TTS
from engine.model.weights import load_model
from engine.request import length_model_frames, runaway_frame_cap
from engine.text.prompt import Prefill, build_prefill


def _prefill(
    model: Qwen3TTS, text: str, *, speaker="ryan", language="english", streaming=True, instruct=""
) -> Prefill:
    return build_prefill(
        model.config.prompt_ids,
        speaker=speaker,
        language=language,
        text_ids=model.tokenizer.target_ids(text),
        instruct_ids=model.tokenizer.instruct_ids(instruct),
        streaming=streaming,
    )


def test_batched_generation_equals_each_request_alone_in_tokens_and_pcm(tiny_model):
    texts = ["Hello there.", "A longer sentence, so the prompts differ in length.", "Short one"]
    prefills = [
        _prefill(tiny_model, texts[0]),
        _prefill(tiny_model, texts[1], speaker="vivian", language="auto", streaming=False),
        _prefill(tiny_model, texts[2], speaker="eric", language="chinese", instruct="Whisper."),
    ]
    samplings = [Sampling(), Sampling(greedy=True), Sampling(temperature=0.7, top_k=10)]
    seeds = [11, 12, 13]
    chars = [len(t) for t in texts]
    batched = generate_batch(tiny_model, prefills, samplings, seeds, text_chars=chars)
    assert len({len(p.rows) for p in prefills}) == 3  # really different prompt lengths
    for i in range(3):
        alone = generate_codes(tiny_model, prefills[i], samplings[i], seeds[i], text_chars=chars[i])
        assert torch.equal(batched[i], alone)
        np.testing.assert_array_equal(decode_codes(tiny_model, batched[i]), decode_codes(tiny_model, alone))
    assert not torch.equal(batched[0][:4], batched[2][:4])  # different seeds give different frames


def test_same_seed_same_frames_and_other_seed_other_frames(tiny_model):
    prefill = _prefill(tiny_model, "Seeds decide everything.")
    a = generate_codes(tiny_model, prefill, Sampling(), 5, text_chars=24)
    b = generate_codes(tiny_model, prefill, Sampling(), 5, text_chars=24)
    c = generate_codes(tiny_model, prefill, Sampling(), 6, text_chars=24)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.dtype == torch.int64 and a.shape[1] == 16 and int(a.max()) < 2048 and int(a.min()) >= 0


@pytest.mark.parametrize("text", ["Hi", "Hello world, how are you today?", "x" * 29])
def test_random_weight_models_follow_the_length_model(tiny_model, text):
    expected = math.ceil(12.5 * len(text) / 14)
    assert length_model_frames(len(text)) == expected
    for streaming in (True, False):
        codes = generate_codes(
            tiny_model, _prefill(tiny_model, text, streaming=streaming), Sampling(), 0, text_chars=len(text)
        )
        assert codes.shape[0] == expected
    capped = generate_codes(
        tiny_model, _prefill(tiny_model, text), Sampling(), 0, max_frames=2, text_chars=len(text)
    )
    assert capped.shape[0] == min(2, expected)


def test_random_weight_models_need_the_character_count(tiny_model):
    with pytest.raises(ValueError, match="text_chars"):
        generate_codes(tiny_model, _prefill(tiny_model, "Hi"), Sampling(), 0)


def test_synthesize_returns_1920_samples_per_frame(tiny_model):
    pcm = synthesize(tiny_model, "Good morning.", seed=3)
    assert pcm.dtype == np.float32 and pcm.shape == (length_model_frames(13) * 1920,)
    assert 0 < np.abs(pcm).max() <= 1.0
    with pytest.raises(ValueError, match="speaker"):
        synthesize(tiny_model, "Hi", speaker="nobody")


class _BiasedHead(nn.Module):
    """The talker head plus a fixed logit bias: steers EOS without touching the loop under test."""

    def __init__(self, head: nn.Module, bias: torch.Tensor) -> None:
        super().__init__()
        self.head, self.bias = head, bias

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden) + self.bias.to(hidden.dtype)


@pytest.fixture(scope="module")
def eos_model() -> Qwen3TTS:
    """A tiny model that plays by the real-checkpoint rules (EOS ends it, no length model)."""
    model = load_model("tiny")
    model.config = dataclasses.replace(model.config, random_weights=False)
    return model


def _steer_eos(model: Qwen3TTS, logit: float) -> None:
    head = model.talker.codec_head
    base = head.head if isinstance(head, _BiasedHead) else head
    bias = torch.zeros(model.config.talker.vocab_size)
    bias[model.config.talker.codec_eos_id] = logit
    model.talker.codec_head = _BiasedHead(base, bias)


def test_eos_ends_generation_after_the_minimum_and_is_not_emitted(eos_model):
    _steer_eos(eos_model, 1e4)
    codes = generate_codes(eos_model, _prefill(eos_model, "Hello"), Sampling(), 0)
    assert codes.shape == (2, 16)  # EOS is forbidden for the first two tokens, then wins at once
    assert (codes[:, 0] < 2048).all()


def test_runaway_guard_raises_when_eos_never_comes(eos_model):
    _steer_eos(eos_model, -1e4)
    prefill = _prefill(eos_model, "Hi")  # 2 fallback text tokens
    assert runaway_frame_cap(2) == 80
    with pytest.raises(RunawayError, match="after 80 frames"):
        generate_codes(eos_model, prefill, Sampling(greedy=True, subtalker_greedy=True), 0)
    quiet = generate_codes(eos_model, prefill, Sampling(greedy=True, subtalker_greedy=True), 0, max_frames=5)
    assert quiet.shape == (5, 16)  # an explicit cap ends quietly


def test_teacher_forced_probabilities_reproduce_greedy_generation(tiny_model):
    greedy = Sampling(greedy=True, subtalker_greedy=True)
    for streaming in (True, False):
        prefill = _prefill(tiny_model, "Teacher forcing.", streaming=streaming)
        codes = generate_codes(tiny_model, prefill, greedy, 0, text_chars=16)
        talker, predictor = teacher_forced_probs(tiny_model, prefill, codes, greedy)
        assert talker.shape == (codes.shape[0] + 1, 3072) and predictor.shape == (codes.shape[0], 15, 2048)
        assert torch.equal(talker[:-1].argmax(-1), codes[:, 0])
        assert torch.equal(predictor.argmax(-1), codes[:, 1:])
        assert ((talker == 0) | (talker == 1)).all()  # greedy rows are one-hot


def test_teacher_forced_sampling_distributions_are_normalised_top_k(tiny_model):
    prefill = _prefill(tiny_model, "Sampled history.")
    codes = generate_codes(tiny_model, prefill, Sampling(), 1, text_chars=16)
    talker, predictor = teacher_forced_probs(tiny_model, prefill, codes, Sampling(), step_count=3)
    assert talker.shape == (4, 3072) and predictor.shape == (3, 15, 2048)
    torch.testing.assert_close(talker.sum(-1), torch.ones(4))
    assert ((talker > 0).sum(-1) == 50).all() and ((predictor > 0).sum(-1) == 50).all()
    assert talker[:, 2048:].sum() == 0  # control ids and (random weights) EOS never drawable
    taken = talker[torch.arange(3), codes[:3, 0]]
    assert (taken > 0).all()  # each sampled code had probability under its own distribution
