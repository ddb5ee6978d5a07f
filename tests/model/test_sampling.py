"""Logits processors in the official order, and counter-based draws independent of batch composition."""

from __future__ import annotations

import torch

from engine.ipc.messages import Sampling
from engine.model import rng
from engine.model.sampling import RowSettings, draw, processed_probs, talker_scores

EOS, CODES, VOCAB = 2150, 2048, 3072


def _reference_talker_probs(logits, history, penalty, temperature, top_k):
    """Straightforward per-row version of the official processor chain (reference 6.3)."""
    scores = logits.clone()
    for token in set(history):
        scores[token] = scores[token] / penalty if scores[token] >= 0 else scores[token] * penalty
    if len(history) < 2:
        scores[EOS] = float("-inf")
    for token in range(CODES, VOCAB):
        if token != EOS:
            scores[token] = float("-inf")
    scores = scores / temperature
    threshold = torch.sort(scores, descending=True).values[top_k - 1]
    scores[scores < threshold] = float("-inf")
    return torch.softmax(scores, -1)


def test_talker_processors_match_the_official_chain_row_by_row():
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB) * 3
    histories = [[], [5, 5, 9], [1, 2, 3, 2150]]
    samplings = [Sampling(), Sampling(temperature=0.5, top_k=7, repetition_penalty=1.3), Sampling(top_k=1)]
    seen = torch.zeros(3, VOCAB, dtype=torch.bool)
    for row, history in enumerate(histories):
        seen[row, history] = True
    generated = torch.tensor([len(h) for h in histories])
    penalty = torch.tensor([[s.repetition_penalty] for s in samplings])
    scores = talker_scores(logits, seen, generated, penalty, EOS, CODES, torch.zeros(3, dtype=torch.bool))
    probs = processed_probs(scores, RowSettings.talker(samplings, "cpu"))
    for row, (history, s) in enumerate(zip(histories, samplings, strict=True)):
        expected = _reference_talker_probs(logits[row], history, s.repetition_penalty, s.temperature, s.top_k)
        torch.testing.assert_close(probs[row], expected, rtol=1e-6, atol=1e-7)
    assert (probs[:, CODES:EOS] == 0).all() and (probs[:, EOS + 1 :] == 0).all()


def test_eos_is_masked_for_the_first_two_tokens_and_always_for_random_weight_rows():
    logits = torch.zeros(4, VOCAB)
    logits[:, EOS] = 100.0
    seen = torch.zeros(4, VOCAB, dtype=torch.bool)
    generated = torch.tensor([0, 1, 2, 5])
    eos_never = torch.tensor([False, False, False, True])
    scores = talker_scores(logits, seen, generated, torch.ones(4, 1), EOS, CODES, eos_never)
    assert torch.isinf(scores[:, EOS]).tolist() == [True, True, False, True]


def test_top_k_keeps_ties_at_the_threshold_and_greedy_rows_are_one_hot():
    scores = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0], [1.0, 3.0, 2.0, 2.0, 0.0]])
    settings = RowSettings.code_predictor(
        [Sampling(subtalker_top_k=2), Sampling(subtalker_greedy=True)], "cpu"
    )
    probs = processed_probs(scores, settings)
    assert (probs[0] > 0).tolist() == [False, True, True, True, False]  # the two 2.0s tie for second place
    assert probs[1].tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]


def test_draws_depend_only_on_the_request_seed_frame_and_group():
    torch.manual_seed(1)
    probs = torch.softmax(torch.randn(1, 2048), -1)
    alone = draw(probs, rng.seed_tensor([42], "cpu"), torch.tensor([7]), group=3)
    crowd = probs.expand(5, -1)
    in_batch = draw(crowd, rng.seed_tensor([1, 2, 42, 3, 4], "cpu"), torch.tensor([0, 9, 7, 7, 1]), group=3)
    assert in_batch[2] == alone[0]
    other = [
        draw(probs, rng.seed_tensor([42], "cpu"), torch.tensor([f]), group=g)[0] for f, g in [(8, 3), (7, 4)]
    ]
    assert len({int(alone[0]), *map(int, other)}) > 1  # frame and group are part of the address


def test_draws_follow_the_processed_distribution():
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0]]).expand(4000, -1)
    frames = torch.arange(4000)
    tokens = draw(probs, rng.seed_tensor([7] * 4000, "cpu"), frames, group=0)
    counts = torch.bincount(tokens, minlength=4).float() / 4000
    assert counts[3] == 0  # zero-probability tokens are never drawn
    torch.testing.assert_close(counts[:3], torch.tensor([0.5, 0.3, 0.2]), atol=0.03, rtol=0)


def test_every_uniform_bit_pattern_is_exact_and_strictly_inside_the_unit_interval():
    # A uniform of exactly 1.0 made -log(u) zero, so a zero-probability token scored 0/0 = NaN and
    # argmax drew it: a masked control id reached the codec as a code (a CI failure, 2026-11-29).
    bits = torch.arange(1 << 23, dtype=torch.int64)
    u = rng.bits_to_uniform(bits)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert torch.equal(u.to(torch.float64), (bits.to(torch.float64) + 0.5) / 2**23)  # no rounding at all
    assert bool((-torch.log(u) > 0).all())  # so p / -log(u) is finite and zero-probability tokens score 0


def test_a_zero_probability_token_is_never_drawn_even_at_the_largest_uniform():
    probs = torch.zeros(1, 4)
    probs[0, 1] = 1.0
    top = rng.bits_to_uniform(torch.tensor([[(1 << 23) - 1] * 4]))
    assert int((probs / -torch.log(top)).argmax(-1)) == 1


def test_uniforms_are_in_the_open_unit_interval_and_seeds_wrap_modulo_2_64():
    u = rng.uniforms(rng.seed_tensor([0, -1, 2**70], "cpu"), torch.tensor([0, 1, 2]), 0, 4096)
    assert u.min() > 0 and u.max() < 1
    assert abs(float(u.mean()) - 0.5) < 0.02
    assert torch.equal(rng.seed_tensor([2**64 + 5], "cpu"), rng.seed_tensor([5], "cpu"))
    assert torch.equal(rng.seed_tensor([2**64 - 1], "cpu"), rng.seed_tensor([-1], "cpu"))
