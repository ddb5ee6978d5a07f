"""The code-predictor fast path (fused layers, static-shape frame, padding and splitting) gives the plain
executor's frames exactly and its summed code embeddings within fp32 rounding, on the CPU twins."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.executors.code_predictor import CodePredictorExecutor
from engine.executors.slots import GenerationSlots, new_code_buffer
from engine.fast.code_predictor_graph import CodePredictorGraphs, FrameKernels
from engine.ipc.messages import Sampling
from engine.model.qwen3_tts import Qwen3TTS
from engine.model.weights import load_model

SAMPLINGS = [Sampling(), Sampling(subtalker_greedy=True), Sampling(subtalker_temperature=0.5, subtalker_top_k=3),
             Sampling(subtalker_top_k=0), Sampling(subtalker_temperature=1.3, subtalker_top_k=64)]  # fmt: skip


@pytest.fixture(scope="module")
def model() -> Qwen3TTS:
    torch.set_num_threads(1)
    return load_model("tiny")


def _slots(model: Qwen3TTS, count: int) -> GenerationSlots:
    c = model.config.talker
    slots = GenerationSlots(count, c.hidden_size, c.vocab_size, device=model.device, dtype=model.dtype)
    gen = torch.Generator().manual_seed(5)
    for slot in range(count):
        slots.start(slot, SAMPLINGS[slot % len(SAMPLINGS)], seed=1000 + slot)
    slots.hidden.copy_(torch.randn(slots.hidden.shape, generator=gen))
    slots.code0.copy_(torch.randint(0, c.num_codes, slots.code0.shape, generator=gen))
    return slots


@pytest.mark.parametrize(("sizes", "frame_io"), [((1, 2), False), ((4,), False), ((1, 2, 4, 8), False),
                                                ((2, 4), True)],
                         ids=["split", "padded", "exact", "frame-io"])  # fmt: skip
def test_fast_frame_equals_the_plain_executor(model: Qwen3TTS, sizes: tuple[int, ...], frame_io: bool) -> None:
    """frame-io: the frame's inputs and outputs in one kernel each, the sampler reading its settings by slot
    (`FrameKernels.frame_io`), with a cohort of 5 split and padded."""
    plain_slots = _slots(model, 6)
    fast_slots = copy.deepcopy(plain_slots)
    plain_codes, fast_codes = new_code_buffer(6, 4, model.device), new_code_buffer(6, 4, model.device)
    fast = CodePredictorGraphs(model, fast_slots, fast_codes, sizes, kernels=FrameKernels(frame_io=frame_io))
    plain = CodePredictorExecutor(model, plain_slots, plain_codes, max_batch=8)
    kv_slots, streams, frames = [4, 0, 3, 1, 5], [2, 5, 0, 1, 3], [0, 3, 1, 2, 0]
    fast.predict(kv_slots, streams, frames)
    plain.predict(kv_slots, streams, frames)
    assert torch.equal(fast_codes, plain_codes)
    assert fast_codes[streams, frames].ne(0).any()  # frames were written where the plan said
    torch.testing.assert_close(fast_slots.frame_embed, plain_slots.frame_embed, rtol=1e-5, atol=1e-5)
    assert fast.steps.eager_runs == -(-5 // max(sizes))  # one run per piece of the split cohort


def test_a_row_is_independent_of_its_batch(model: Qwen3TTS) -> None:
    slots = _slots(model, 6)
    codes = new_code_buffer(6, 2, model.device)
    fast = CodePredictorGraphs(model, slots, codes, (1, 2, 4))
    fast.predict([2], [0], [1])
    alone = codes[0, 1].clone()
    fast.predict([0, 1, 2], [1, 2, 0], [0, 0, 1])
    assert torch.equal(codes[0, 1], alone)


def test_top_k_above_the_static_cap_is_refused_before_anything_runs(model: Qwen3TTS) -> None:
    slots = _slots(model, 2)
    slots.start(1, Sampling(subtalker_top_k=500), seed=1)
    fast = CodePredictorGraphs(model, slots, new_code_buffer(2, 2, model.device), (1, 2), top_k_cap=64)
    with pytest.raises(ValueError, match="cap of 64"):
        fast.predict([0, 1], [0, 1], [0, 0])
    assert fast.steps.eager_runs == 0
