"""The talker's draw in one kernel: its scores, its token and the slot state the token updates, exactly what
`TalkerGraphs`' separate steps compute (`model.sampling.talker_scores`, `sampler.sample`, then the seen / generated
/ code0 writes), in one launch instead of ~20 small ones.

One program per row b, at KV slot s = index[b]:

    logits  [B,V] in the head's dtype, read as fp32 (what `talker.logits` upcasts)
    scores  = talker_scores(logits, seen[s], generated[s], penalty[s], eos_id, num_codes, eos_never[b])
    token   = the sampler's draw (`sampler.draw_row`) with slot s's talker settings, seeds[s] and counter frames[b]
    out[b]  = token;  code0[s] = token;  seen[s, token] = True;  generated[s] += 1

    slot state [S, ...]: seen [S,V] bool, generated [S] int64, penalty [S,1] fp32, greedy [S] bool,
    temperature [S,1] fp32, top_k [S] int64, seeds [S] int64, code0 [S] int64

Padded rows repeat the last real row's slot (`graphs.pad_rows`). The separate steps write such a slot once (an
index_put of identical values); here a row whose slot is its predecessor's writes no slot state, and because its
predecessor may already have updated that slot, its own `out` entry can differ: callers read out[:real rows] only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, INTERPRET, use_triton
from engine.fast.kernels.sampler import sample_reference
from engine.model.rng import GROUPS_PER_FRAME
from engine.model.sampling import MIN_NEW_TOKENS, talker_scores

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from engine.fast.kernels.sampler import draw_row, race_exponentials

    @triton.jit(do_not_specialize=["group"])  # (a constant 0 or 1 would compile to a Python int)
    def _talker_draw_kernel(
        logits_ptr, index_ptr, frames_ptr, eos_never_ptr, seen_ptr, generated_ptr, penalty_ptr, greedy_ptr,
        temp_ptr, topk_ptr, seeds_ptr, code0_ptr, out_ptr,
        vocab, stride_logits, stride_seen, eos_id, num_codes, group,
        CAP: tl.constexpr, GROUPS: tl.constexpr, MIN_NEW: tl.constexpr, RADIX_BITS: tl.constexpr,
        PRECISE: tl.constexpr, BLOCK_V: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0)
        v = tl.arange(0, BLOCK_V)
        valid = v < vocab
        slot = tl.load(index_ptr + b)
        previous = tl.load(index_ptr + tl.maximum(b - 1, 0))
        temperature = tl.load(temp_ptr + slot).to(tl.float32)  # (temperature and penalty are [S,1]: one a slot)
        penalty = tl.load(penalty_ptr + slot).to(tl.float32)
        top_k = tl.load(topk_ptr + slot).to(tl.int64)
        greedy = tl.load(greedy_ptr + slot).to(tl.int1)
        generated = tl.load(generated_ptr + slot)
        eos_never = tl.load(eos_never_ptr + b).to(tl.int1)
        seed = tl.load(seeds_ptr + slot).to(tl.uint64, bitcast=True)
        frame = tl.load(frames_ptr + b).to(tl.uint64, bitcast=True)
        exponential = race_exponentials(seed, frame, group, v, GROUPS, PRECISE)

        # talker_scores, op for op: the penalty on this request's codebook-0 history, EOS while it may not end,
        # control / language / speaker ids always out
        logits = tl.load(logits_ptr + b * stride_logits + v, mask=valid, other=0.0).to(tl.float32)
        seen = tl.load(seen_ptr + slot * stride_seen + v, mask=valid, other=0) != 0
        penalised = tl.where(logits < 0, logits * penalty, tl.div_rn(logits, penalty))  # torch's `/` is IEEE
        scores = tl.where(seen, penalised, logits)
        eos_masked = (generated < MIN_NEW) | eos_never
        scores = tl.where((v == eos_id) & eos_masked, float("-inf"), scores)
        scores = tl.where((v >= num_codes) & (v != eos_id), float("-inf"), scores)
        scores = tl.where(valid, scores, float("-inf"))

        token, _ = draw_row(scores, valid, temperature, top_k, greedy, exponential, vocab, out_ptr, CAP,
                            RADIX_BITS, PRECISE, 0)  # fmt: skip  (no timeline: out_ptr stands in, unwritten)
        tl.store(out_ptr + b, token)
        if (b == 0) | (slot != previous):  # a padded duplicate of the row before writes no slot state
            tl.store(code0_ptr + slot, token)
            tl.store(seen_ptr + slot * stride_seen + token, 1)
            tl.store(generated_ptr + slot, generated + 1)


def talker_draw_reference(
    logits: Tensor, index: Tensor, frames: Tensor, eos_never: Tensor, seen: Tensor, generated: Tensor,
    penalty: Tensor, greedy: Tensor, temperature: Tensor, top_k: Tensor, seeds: Tensor, code0: Tensor,
    eos_id: int, num_codes: int, cap: int, out: Tensor,
) -> Tensor:  # fmt: skip
    """The twin: the separate steps the kernel replaces, in their order."""
    scores = talker_scores(logits.to(torch.float32), seen[index], generated[index], penalty[index], eos_id,
                           num_codes, eos_never)  # fmt: skip
    tokens = sample_reference(scores, greedy[index], temperature[index], top_k[index], cap, seeds[index], frames, 0)
    seen.index_put_((index, tokens), torch.ones_like(tokens, dtype=torch.bool))  # no host scalar in a graph
    generated[index] += 1
    code0[index] = tokens
    return out.copy_(tokens)


def talker_draw(
    logits: Tensor, index: Tensor, frames: Tensor, eos_never: Tensor, seen: Tensor, generated: Tensor,
    penalty: Tensor, greedy: Tensor, temperature: Tensor, top_k: Tensor, seeds: Tensor, code0: Tensor, *,
    eos_id: int, num_codes: int, cap: int, out: Tensor, radix_bits: int = 2, num_warps: int | None = None,
) -> Tensor:  # fmt: skip
    """logits [B,V] (last dim contiguous), index [B] int64 KV slots, frames [B] int64 (the draw's counter),
    eos_never [B] bool; the slot state as the module docstring draws it (contiguous) -> out [B] int64, the
    tokens; code0, seen and generated updated at the slots. `cap`: the largest top-k (as `sample`'s). `num_warps`
    of a row's program (None: `row_warps`)."""
    if not use_triton(logits):
        return talker_draw_reference(logits, index, frames, eos_never, seen, generated, penalty, greedy,
                                     temperature, top_k, seeds, code0, eos_id, num_codes, cap, out)  # fmt: skip
    rows, vocab = logits.shape
    assert logits.stride(-1) == 1 and seen.stride(-1) == 1 and out.is_contiguous()
    assert all(t.is_contiguous() for t in (index, frames, eos_never, generated, penalty, greedy, temperature,
                                            top_k, seeds, code0))  # fmt: skip
    _talker_draw_kernel[(rows,)](
        logits, index, frames, eos_never, seen, generated, penalty, greedy, temperature, top_k, seeds, code0, out,
        vocab, logits.stride(0), seen.stride(0), eos_id, num_codes, 0,
        CAP=cap, GROUPS=GROUPS_PER_FRAME, MIN_NEW=MIN_NEW_TOKENS, RADIX_BITS=radix_bits,
        PRECISE=not INTERPRET, BLOCK_V=triton.next_power_of_2(vocab),
        num_warps=num_warps or row_warps(vocab),
    )  # fmt: skip
    return out


def row_warps(vocab: int) -> int:
    """Warps of a row's program: 16 from 4096-wide rows (the talker's 3072 ids), where 8 spill 16 bytes a thread
    compiled for sm_90 by Triton 3.6 (the device's; 3.9 fits them), then 8 from 2048, else 4."""
    width = triton.next_power_of_2(vocab) if HAVE_TRITON else vocab
    return 16 if width >= 4096 else 8 if width >= 2048 else 4
