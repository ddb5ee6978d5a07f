"""The talker fast path (fused layers, split-KV decode attention over per-row lengths, static-shape
prefill buckets, padding and splitting) matches the plain executor on the CPU twins: same tokens, hidden
states and KV cache within fp32 rounding, same sampler state, and the host lengths advance alike."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.executors.slots import GenerationSlots
from engine.executors.talker import TalkerExecutor
from engine.fast.decoder import ChainTiles
from engine.fast.kernels.gemv import GemvConfig
from engine.fast.talker_graph import TalkerGraphs
from engine.ipc.messages import Sampling
from engine.model.qwen3_tts import Qwen3TTS
from engine.model.weights import load_model

SAMPLINGS = [Sampling(), Sampling(greedy=True), Sampling(temperature=0.6, top_k=4, repetition_penalty=1.3),
             Sampling(top_k=0)]  # fmt: skip
LENGTHS = [5, 11, 8, 3]


@pytest.fixture(scope="module")
def model() -> Qwen3TTS:
    torch.set_num_threads(1)
    return load_model("tiny")


def _pair(model: Qwen3TTS, sizes: tuple[int, ...], gemv_rows: int = 0, fused_rope: bool = False,
          chain_rows: tuple[int, ...] = (), chain_tiles: ChainTiles | dict[int, ChainTiles] | None = None,
          fused_draw: bool = False, text_rows: int = 64) -> tuple[TalkerExecutor, TalkerGraphs]:  # fmt: skip
    c = model.config.talker
    plain_slots = GenerationSlots(6, c.hidden_size, c.vocab_size, device=model.device, dtype=model.dtype)
    fast_slots = copy.deepcopy(plain_slots)
    plain_cache, fast_cache = model.talker.new_cache(6, 64), model.talker.new_cache(6, 64)
    fast = TalkerGraphs(model, fast_slots, fast_cache, sizes, prefill_sizes=(1, 2), prefill_buckets=(8, 16),
                        gemv_max_rows=gemv_rows, fused_rope=fused_rope, chain_rows=chain_rows,
                        chain_tiles=chain_tiles, fused_draw=fused_draw, text_rows=text_rows)  # fmt: skip
    return TalkerExecutor(model, plain_slots, plain_cache), fast


def _prompts(model: Qwen3TTS) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randn(n, model.config.talker.hidden_size, generator=gen) for n in LENGTHS]


def _assert_same_state(plain: TalkerExecutor, fast: TalkerGraphs, kv_slots: list[int]) -> None:
    a, b = plain.slots, fast.slots
    assert torch.equal(a.code0, b.code0) and torch.equal(a.seen, b.seen) and torch.equal(a.generated, b.generated)
    torch.testing.assert_close(b.hidden, a.hidden, rtol=1e-4, atol=1e-4)
    assert plain.cache.lengths == fast.cache.lengths
    for slot in kv_slots:
        n = plain.cache.lengths[slot]
        torch.testing.assert_close(fast.cache.kv[:, :, slot, :, :n], plain.cache.kv[:, :, slot, :, :n],
                                   rtol=1e-4, atol=1e-4)  # fmt: skip


SPLIT_DOWN = GemvConfig(block_n=16, block_k=16, use_dot=True, loop_stages=2, split_k=2)


@pytest.mark.parametrize(("sizes", "gemv_rows", "fused_rope", "chain_rows", "chain_tiles"),
                         [((1, 2), 0, False, (), None), ((4,), 0, False, (), None), ((1, 2), 2, False, (), None),
                          ((1, 2, 4), 2, True, (), None), ((2, 4), 0, True, (4,), None),
                          ((2, 4), 0, True, (4,), ChainTiles(down=SPLIT_DOWN)),
                          ((2, 4), 0, True, (2, 4), {4: ChainTiles(down=SPLIT_DOWN)})],
                         ids=["split", "padded", "streamed", "fused-rope", "chained",
                              "chained-split-down", "chained-tiles-by-rows"])  # fmt: skip
def test_prefill_and_decode_steps_equal_the_plain_executor(model: Qwen3TTS, sizes: tuple[int, ...], gemv_rows: int,
                                                           fused_rope: bool, chain_rows: tuple[int, ...],
                                                           chain_tiles: ChainTiles | dict[int, ChainTiles] | None,
                                                           ) -> None:  # fmt: skip
    """streamed: 1-2 row decode steps with their products in `gemv`; fused-rope: q/k norm and RoPE in the
    attention's split kernel (with 4-row steps in cuBLAS and 1-2 row steps in `gemv`); chained: 4-row steps as
    `run_layers_chained` (products in `gemv`, down in cuBLAS, or in a split-K tile), 2-row steps as before;
    tiles by rows: 2- and 4-row steps chained, each with its own tiles."""
    plain, fast = _pair(model, sizes, gemv_rows, fused_rope, chain_rows, chain_tiles)
    kv_slots = _prefill_then_decode(model, plain, fast, seed=3)
    assert fast.decode(kv_slots, [fast.cache.lengths[s] for s in kv_slots], [9] * 4, [1] * 4, [False] * 4,
                       read_tokens=False) is None  # fmt: skip


def _prefill_then_decode(model: Qwen3TTS, plain: TalkerExecutor, fast: TalkerGraphs, seed: int) -> list[int]:
    """Four requests prefilled, then three decode steps of 4, 3 (padded where 3 is not a captured size) and 4
    rows, EOS allowed from the second: the fast talker's tokens and state equal the plain executor's after each.
    -> the requests' KV slots."""
    kv_slots = [3, 0, 5, 1]
    samplings = [SAMPLINGS[i % len(SAMPLINGS)] for i in range(4)]
    for runner in (plain, fast):
        runner.prefill(kv_slots, _prompts(model), samplings, [7, 8, 9, 10])
    _assert_same_state(plain, fast, kv_slots)
    gen = torch.Generator().manual_seed(seed)
    for step in range(3):
        embed = torch.randn(6, model.config.talker.hidden_size, generator=gen)
        plain.slots.frame_embed.copy_(embed)
        fast.slots.frame_embed.copy_(embed)
        rows = kv_slots[: 4 - step % 2]  # cohorts change between steps
        positions = [plain.cache.lengths[s] for s in rows]
        text_ids = [100 + s + 2 * step for s in rows]  # some ids shared with the step before, some new
        args = (rows, positions, [step] * len(rows), text_ids, [step > 0] * len(rows))
        expected = plain.decode(*args, read_tokens=True)
        assert fast.decode(*args, read_tokens=True) == expected
        assert fast.decode_steps.eager_runs > 0
        _assert_same_state(plain, fast, kv_slots)
    return kv_slots


def test_a_fused_draw_equals_the_plain_executor(model: Qwen3TTS) -> None:
    """`fused_draw`: each step's scores, draw and slot-state writes in one kernel (`kernels.talker_draw`), with
    cohorts of 3 rows padded to 4 (a duplicate slot), EOS allowed from the second step: the plain executor's
    tokens and state at every step (under Triton's interpreter in test_code_predictor_interpreted)."""
    plain, fast = _pair(model, (1, 2, 4), fused_draw=True)
    _prefill_then_decode(model, plain, fast, seed=5)


def test_a_text_table_smaller_than_the_steps_ids_starts_over_and_still_equals_the_plain_executor(
        model: Qwen3TTS) -> None:  # fmt: skip
    """Room for 4 projected text ids, steps of 3-4 ids with new ones each step: the table refills, and every
    step's tokens and state still equal the plain executor's (which projects each step's ids in its own product)."""
    plain, fast = _pair(model, (1, 2, 4), text_rows=4)
    _prefill_then_decode(model, plain, fast, seed=9)
    assert fast.text.refills >= 1


def test_the_rope_tables_hold_what_each_step_computed_for_its_positions(model: Qwen3TTS) -> None:
    """`TalkerGraphs.rope` (every cache position's cos and sin, computed once) gathered at a step's positions is
    bitwise what computing them for those positions gives, in the model's dtype and in bf16."""
    from engine.fast.decoder import rope_tables

    _, fast = _pair(model, (1, 2))
    positions = torch.tensor([0, 5, 63, 17, 17])
    rotary = model.talker.rotary
    for got, want in zip(fast.rope, rope_tables(rotary, positions, model.dtype), strict=True):
        assert got.shape[0] == fast.cache.max_len and torch.equal(got[positions], want)
    everything = rope_tables(rotary, torch.arange(4096), torch.bfloat16)
    for got, want in zip(everything, rope_tables(rotary, torch.tensor([4095, 1, 2048, 77]), torch.bfloat16),
                         strict=True):  # fmt: skip
        assert torch.equal(got[torch.tensor([4095, 1, 2048, 77])], want)


def test_chained_steps_take_their_own_row_counts_tiles(model: Qwen3TTS) -> None:
    """`chain_tiles` as a mapping: each chained row count its own tiles, `ChainTiles()` where it names none; one
    `ChainTiles` (or None) serves every chained count."""
    _, by_rows = _pair(model, (2, 4), fused_rope=True, chain_rows=(2, 4), chain_tiles={4: ChainTiles(down=SPLIT_DOWN)})
    assert by_rows.chain_tiles == {2: ChainTiles(), 4: ChainTiles(down=SPLIT_DOWN)}
    _, shared = _pair(model, (2, 4), fused_rope=True, chain_rows=(2, 4), chain_tiles=ChainTiles(down=SPLIT_DOWN))
    assert shared.chain_tiles == dict.fromkeys((2, 4), ChainTiles(down=SPLIT_DOWN))
    _, unchained = _pair(model, (2, 4), chain_rows=(2, 4))  # (chains need the fused rope)
    assert unchained.chain_tiles == {}


def test_decode_refuses_a_plan_whose_positions_disagree_with_the_cache(model: Qwen3TTS) -> None:
    _, fast = _pair(model, (1, 2))
    fast.prefill([0], _prompts(model)[:1], [Sampling()], [1])
    with pytest.raises(AssertionError, match="plan expects"):
        fast.decode([0], [LENGTHS[0] + 1], [0], [5], [False], read_tokens=False)


def test_prompts_longer_than_the_largest_bucket_are_refused(model: Qwen3TTS) -> None:
    _, fast = _pair(model, (1, 2))
    too_long = torch.zeros(17, model.config.talker.hidden_size)
    with pytest.raises(ValueError, match="largest captured size"):
        fast.prefill([0], [too_long], [Sampling()], [1])
