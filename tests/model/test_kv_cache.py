"""The slot KV cache: rows at different lengths in one batch compute what each row computes alone."""

from __future__ import annotations

import pytest
import torch

from engine.model.qwen3_tts import Qwen3TTS


def _run_alone(model: Qwen3TTS, prompt: torch.Tensor, steps: torch.Tensor) -> list[torch.Tensor]:
    """Prefill one prompt [L,H], then decode steps [S,H] one at a time -> hidden after each call."""
    cache = model.talker.new_cache(1, 64)
    out = [model.talker(prompt[None], cache, cache.prefill_batch([0], [prompt.shape[0]]))[0, -1]]
    cache.advance([0], [prompt.shape[0]])
    for step in steps:
        out.append(model.talker(step[None, None], cache, cache.decode_batch([0]))[0, 0])
        cache.advance([0], [1])
    return out


@torch.inference_mode()
def test_batched_prefill_and_decode_at_different_lengths_equal_each_row_alone(tiny_model):
    model = tiny_model
    hidden = model.config.talker.hidden_size
    torch.manual_seed(0)
    prompts = [torch.randn(n, hidden) for n in (7, 3, 12)]
    steps = torch.randn(3, 4, hidden)  # 4 decode steps per row
    expected = [_run_alone(model, p, s) for p, s in zip(prompts, steps, strict=True)]

    cache = model.talker.new_cache(4, 64)
    slots = [3, 0, 2]  # not 0..B-1: exercises the gather path and masks
    lengths = [p.shape[0] for p in prompts]
    x = torch.nn.utils.rnn.pad_sequence(prompts, batch_first=True)
    out = model.talker(x, cache, cache.prefill_batch(slots, lengths))
    cache.advance(slots, lengths)
    for row, n in enumerate(lengths):
        torch.testing.assert_close(out[row, n - 1], expected[row][0], rtol=1e-5, atol=1e-5)
    for k in range(4):
        batch = cache.decode_batch(slots)
        assert batch.mask is not None  # rows sit at different positions
        out = model.talker(steps[:, k, None], cache, batch)
        cache.advance(slots, [1, 1, 1])
        for row in range(3):
            torch.testing.assert_close(out[row, 0], expected[row][k + 1], rtol=1e-5, atol=1e-5)
    assert cache.lengths == [lengths[1] + 4, 0, lengths[2] + 4, lengths[0] + 4]


@torch.inference_mode()
def test_a_subset_of_slots_can_decode_while_others_wait(tiny_model):
    model = tiny_model
    hidden = model.config.talker.hidden_size
    torch.manual_seed(1)
    prompts = [torch.randn(5, hidden), torch.randn(9, hidden)]
    steps = torch.randn(2, 3, hidden)
    expected = _run_alone(model, prompts[1], steps[1])

    cache = model.talker.new_cache(2, 32)
    for slot, prompt in enumerate(prompts):
        model.talker(prompt[None], cache, cache.prefill_batch([slot], [prompt.shape[0]]))
        cache.advance([slot], [prompt.shape[0]])
    model.talker(steps[0, :1, None], cache, cache.decode_batch([0]))  # slot 0 moves on alone
    cache.advance([0], [1])
    for k in range(3):
        out = model.talker(steps[1, k, None, None], cache, cache.decode_batch([1]))
        cache.advance([1], [1])
        torch.testing.assert_close(out[0, 0], expected[k + 1], rtol=1e-5, atol=1e-5)


def test_a_full_slot_is_a_clear_error(tiny_model):
    cache = tiny_model.talker.new_cache(1, 8)
    cache.advance([0], [8])
    with pytest.raises(RuntimeError, match="slot 0 is full"):
        cache.decode_batch([0])
