"""The code predictor's token draw in one kernel: the tokens of `engine.fast.sampling.sample_tokens`, exactly.

One program per row b draws from scores [B,V] (any float dtype; read as fp32, as `logits.to(float32)` is):

    warped = scores / temperature[b]                         (round-to-nearest division, like torch's)
    kth    = the top_k[b]-th largest warped value             (counting ties; -inf unless 0 < top_k <= cap)
    probs  = softmax(warped masked to warped >= kth)
    race   = probs / -log(u)      u = rng.uniforms(seeds, frames, group, V)[b]  (the SplitMix64 hash, in uint64)
    token  = argmax(scores) if greedy[b] else argmax(race)    (first index on ties, as torch.argmax)

The k-th largest value is found without sorting: a radix search over the order-preserving integer image of
the fp32 values (2^RADIX_BITS candidate thresholds per round, one counting pass each), which lands exactly
on a value of the row, so ties at the threshold are kept as `topk(...).values[k-1]` keeps them; it stops early
once exactly k values lie at or above its lower bound (the same kept set). RADIX_BITS 8 searches byte by byte
instead (`_kth_largest_key`: at most 4 passes, each one 256-bin histogram), landing on the same value.

Optionally (the frame's running code-embedding sum) the drawn token's row of `table` [V',H] is added to
`acc` [B,H] fp32 and the token is written to a strided `out` [B] int64 (e.g. one column of the frame codes).
Same scores and counters give the same tokens as the twin up to exp/log rounding of the last ulp, which can
only matter when two race values tie to within an ulp.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, INTERPRET, use_triton
from engine.fast.kernels.pdl import enabled as pdl_enabled
from engine.fast.kernels.pdl import launch_options
from engine.fast.sampling import sample_tokens
from engine.model.rng import GROUPS_PER_FRAME

# A timeline row per program (`sample(timeline=...)`, CUDA only): %globaltimer ns after the PDL wait, after the
# loads, before the top-k search, after it, after the softmax, after the token's store, after the embedding
# accumulate; then the search's round count.
TIMELINE_STAGES = 8
TIMELINE_NAMES = ("loads", "min/max/count", "top-k search", "softmax", "race + argmax", "accumulate")

if HAVE_TRITON:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import libdevice

    from engine.fast.kernels.clock import globaltimer
    from engine.fast.kernels.pdl import wait_for_producer

    @triton.jit
    def _mix64(z):
        # SplitMix64 finaliser on uint64 (wrapping products, logical shifts): engine.model.rng.mix64.
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        return z ^ (z >> 31)

    @triton.jit
    def _kth_largest_key(key, valid, top_k):
        """The top_k-th largest of the int32 `key`s where `valid` (ties counted), or a bound with exactly top_k keys
        at or above it (the same kept set), and the passes it took. Radix select, most significant byte first: a
        pass takes one 256-bin histogram of the keys whose bytes above it match the ones chosen so far, and reads
        the k-th key's next byte off the histogram's running count from the top; at most 4 passes."""
        bins = tl.arange(0, 256)
        remaining = top_k  # how many of the top-k lie inside the matching keys
        matching = valid
        bound = tl.zeros([], dtype=tl.int32)  # the bytes chosen so far, the ones below zero
        shift = 24
        exact = tl.zeros([], dtype=tl.int1)
        rounds = 0
        while (shift >= 0) & (exact == 0):
            rounds += 1
            flip = tl.where(shift == 24, 128, 0)  # the top byte's sign bit flipped: signed order as unsigned
            digit = ((key >> shift) & 255) ^ flip
            histogram = tl.histogram(digit, 256, mask=matching)  # [256] int32
            from_top = tl.cumsum(histogram, axis=0, reverse=True)  # [256]: matching keys with digit >= d
            chosen = tl.max(tl.where(from_top >= remaining, bins, 0), axis=0)  # from_top[0] >= remaining
            at_or_above = tl.sum(tl.where(bins == chosen, from_top, 0), axis=0)
            above = at_or_above - tl.sum(tl.where(bins == chosen, histogram, 0), axis=0)
            bound = bound | ((chosen ^ flip) << shift)
            matching = matching & (digit == chosen)
            # keys >= bound: (top_k - remaining) above the prefix and at_or_above inside it; exactly top_k: done
            exact = at_or_above == remaining
            remaining -= above
            shift -= 8
        return bound.to(tl.int64), rounds

    @triton.jit
    def race_exponentials(seed, frame, group, v, GROUPS: tl.constexpr, PRECISE: tl.constexpr):
        """-log u of the row's uniforms u [BLOCK_V] (`rng.uniforms`: the SplitMix64 hash of seed, counter
        frame * GROUPS + group + 1 and the vocabulary id v + 1, top 23 bits, in (0, 1)); seed and frame uint64."""
        counter = frame * GROUPS + group.to(tl.uint64) + 1
        row_key = _mix64(_mix64(seed) + counter * 0x9E3779B97F4A7C15)
        hashed = _mix64(row_key + (v + 1).to(tl.uint64) * 0x9E3779B97F4A7C15)
        uniform = ((hashed >> 41).to(tl.int32).to(tl.float32) + 0.5) * (1.0 / 8388608.0)  # 23 bits: (0,1)
        if PRECISE:  # noqa: SIM108 (constexpr: the interpreter has no libdevice)
            exponential = -libdevice.log(uniform)
        else:
            exponential = -tl.log(uniform)
        return exponential

    @triton.jit
    def draw_row(scores, valid, temperature, top_k, greedy, exponential, vocab, stamps_row, CAP: tl.constexpr,
              RADIX_BITS: tl.constexpr, PRECISE: tl.constexpr, TIMELINE: tl.constexpr):  # fmt: skip
        """One row's token (int64) from its fp32 scores [BLOCK_V] (-inf past `valid`) and settings, as the module
        docstring says, and the top-k search's rounds; with TIMELINE, stamps 1-4 of the row at `stamps_row`."""
        warped = tl.div_rn(scores, temperature)  # torch divides with IEEE rounding; Triton's `/` does not
        warped = tl.where(valid, warped, float("-inf"))

        # Order-preserving int image of fp32: negative values get their magnitude bits flipped; -0.0 joins +0.0.
        # Keys stay int32 (the counting passes are [2^bits, V] compares); bounds and candidates are int64.
        bits = warped.to(tl.int32, bitcast=True)
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
        key = tl.where(warped == 0.0, 0, key)
        limited = (top_k > 0) & (top_k <= tl.minimum(vocab, CAP))
        rounds = 0
        if RADIX_BITS == 8:  # radix select by bytes (`_kth_largest_key`): no min / max pass
            if TIMELINE:
                tl.store(stamps_row + 1, globaltimer())
                tl.store(stamps_row + 2, globaltimer())
            if limited:
                lo, rounds = _kth_largest_key(key, valid, top_k.to(tl.int32))
                keep = valid & (key >= lo)
            else:
                keep = valid
        else:
            # Invariant: count(key >= lo) >= k and count(key > hi) < k; lo ends on the k-th largest key.
            if TIMELINE:
                tl.store(stamps_row + 1, globaltimer())
            lo = tl.min(tl.where(valid, key, 2147483647), axis=0).to(tl.int64)
            hi = tl.max(tl.where(valid, key, -2147483647), axis=0).to(tl.int64)
            if limited:
                digits = tl.arange(0, 1 << RADIX_BITS).to(tl.int64)  # candidate j: lo + ceil(j * width / 2^bits)
                # The search stops as soon as exactly top_k keys are >= lo: {key >= lo} is then the top-k set
                # itself (a tie at the k-th value would make that count exceed k), so the tokens are those of the
                # full search, which needs all 32 / RADIX_BITS rounds only when lo must land on a tied k-th value.
                count_lo = tl.sum(valid.to(tl.int32), axis=0)  # keys >= lo (= the row's minimum)
                if TIMELINE:
                    tl.store(stamps_row + 2, globaltimer())
                while (count_lo > top_k) & (lo < hi):
                    rounds += 1
                    width = hi - lo + 1
                    cand = lo + ((digits * width + (1 << RADIX_BITS) - 1) >> RADIX_BITS)  # [2^bits], ascending
                    # every candidate <= hi + 1 <= key(+inf) + 1 fits int32: compare in 32 bits
                    above = (key[None, :] >= cand.to(tl.int32)[:, None]) & valid[None, :]
                    counts = tl.sum(above.to(tl.int32), axis=1)  # [2^bits], descending
                    ok = counts >= top_k  # true for j = 0, then monotone
                    next_hi = tl.min(tl.where(ok, hi, cand - 1), axis=0)
                    lo = tl.max(tl.where(ok, cand, lo), axis=0)
                    count_lo = tl.min(tl.where(ok, counts, 2147483647), axis=0)
                    hi = next_hi
                keep = valid & (key >= lo)
            else:
                keep = valid
                if TIMELINE:  # (no search: its stage takes no time)
                    tl.store(stamps_row + 2, globaltimer())
        if TIMELINE:
            tl.store(stamps_row + 3, globaltimer())

        top = tl.max(warped, axis=0)  # the largest value is always kept: the softmax's max
        if PRECISE:  # libdevice expf/logf, as torch's kernels call them (the interpreter has no libdevice)
            e = tl.where(keep, libdevice.exp(warped - top), 0.0)
        else:
            e = tl.where(keep, tl.exp(warped - top), 0.0)
        probs = tl.div_rn(e, tl.sum(e, axis=0))
        if TIMELINE:
            tl.store(stamps_row + 4, globaltimer())

        race = tl.where(valid, tl.div_rn(probs, exponential), -1.0)
        drawn = tl.argmax(race, axis=0)
        token = tl.where(greedy, tl.argmax(scores, axis=0), drawn).to(tl.int64)
        return token, rounds

    @triton.jit(do_not_specialize=["group"])  # one compiled kernel for every group
    def _sample_kernel(
        scores_ptr, greedy_ptr, temp_ptr, topk_ptr, seeds_ptr, frames_ptr, out_ptr, table_ptr, acc_ptr,
        vocab, hidden, stride_scores, stride_temp, stride_out, group,
        CAP: tl.constexpr, GROUPS: tl.constexpr, RADIX_BITS: tl.constexpr, ACCUMULATE: tl.constexpr,
        PRECISE: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
        stamps_ptr, TIMELINE: tl.constexpr, index_ptr, INDEXED: tl.constexpr = False,
    ):  # fmt: skip
        b = tl.program_id(0)
        v = tl.arange(0, BLOCK_V)
        valid = v < vocab
        # Before the PDL wait: the row's settings and its uniforms' exponentials, which only the frame's first
        # kernels wrote (long complete: a kernel of the chain starts only once the one two back has finished).
        # INDEXED: the settings are per slot [S], read at the row's slot index[b]; else per row [B].
        row = tl.load(index_ptr + b) if INDEXED else b
        temperature = tl.load(temp_ptr + row * stride_temp).to(tl.float32)
        top_k = tl.load(topk_ptr + row).to(tl.int64)
        greedy = tl.load(greedy_ptr + row).to(tl.int1)
        seed = tl.load(seeds_ptr + row).to(tl.uint64, bitcast=True)
        frame = tl.load(frames_ptr + b).to(tl.uint64, bitcast=True)
        exponential = race_exponentials(seed, frame, group, v, GROUPS, PRECISE)
        wait_for_producer(PDL)
        stamps_row = stamps_ptr + b * TIMELINE  # the row's stamps: TIMELINE (`TIMELINE_STAGES`, 0: none) a program
        if TIMELINE:
            tl.store(stamps_row, globaltimer())
        scores = tl.load(scores_ptr + b * stride_scores + v, mask=valid, other=float("-inf")).to(tl.float32)
        token, rounds = draw_row(scores, valid, temperature, top_k, greedy, exponential, vocab, stamps_row, CAP,
                                 RADIX_BITS, PRECISE, TIMELINE)  # fmt: skip
        tl.store(out_ptr + b * stride_out, token)
        if TIMELINE:
            tl.store(stamps_row + 5, globaltimer())
        if ACCUMULATE:
            h = tl.arange(0, BLOCK_H)
            h_mask = h < hidden
            row = tl.load(table_ptr + token * hidden + h, mask=h_mask, other=0.0).to(tl.float32)
            total = tl.load(acc_ptr + b * hidden + h, mask=h_mask, other=0.0)
            tl.store(acc_ptr + b * hidden + h, total + row, mask=h_mask)
        if TIMELINE:
            tl.store(stamps_row + 6, globaltimer())
            tl.store(stamps_row + 7, rounds)


def sample_reference(
    scores: Tensor, greedy: Tensor, temperature: Tensor, top_k: Tensor, cap: int, seeds: Tensor,
    frames: Tensor, group: int, *, out: Tensor | None = None, table: Tensor | None = None,
    acc: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """The twin: the graph sampler on fp32 scores, then the optional token write and embedding accumulate."""
    tokens = sample_tokens(scores.to(torch.float32), greedy, temperature, top_k, cap, seeds, frames, group)
    if out is not None:
        out.copy_(tokens)
    if table is not None and acc is not None:
        acc += table[tokens].to(torch.float32)
    return tokens


def sample(
    scores: Tensor, greedy: Tensor, temperature: Tensor, top_k: Tensor, cap: int, seeds: Tensor,
    frames: Tensor, group: int, *, out: Tensor | None = None, table: Tensor | None = None,
    acc: Tensor | None = None, radix_bits: int = 2, num_warps: int | None = None, pdl: bool = False,
    timeline: Tensor | None = None, index: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """scores [B,V] (last dim contiguous), greedy [B] bool, temperature [B,1] fp32, top_k/seeds/frames [B]
    int64 -> tokens [B] int64 (written into `out` [B] int64, any stride, when given). With `index` [B] int64, the
    settings greedy / temperature / top_k / seeds are per slot ([S], [S,1]) and row b's are at index[b] (no gathers
    before the call); frames stay per row. With `table` [V',H]
    and `acc` [B,H] fp32 contiguous, acc[b] += table[token[b]]. `num_warps` of a row's program (None: 8 for a
    vocabulary of 2048 or more, else 4). `pdl`: launched as a programmatic dependent of
    the kernel before it (`kernels.pdl`). `timeline` [B, TIMELINE_STAGES] int64 (CUDA only, a diagnostic): each
    program's stage stamps and search rounds."""
    if (table is None) != (acc is None):
        raise ValueError("sample: table and acc come together")
    if timeline is not None and (INTERPRET or timeline.shape != (scores.shape[0], TIMELINE_STAGES)):
        raise ValueError(f"sample: a timeline is [rows, {TIMELINE_STAGES}] int64, on CUDA only")
    if not use_triton(scores):
        if index is not None:
            greedy, temperature, top_k, seeds = greedy[index], temperature[index], top_k[index], seeds[index]
        return sample_reference(scores, greedy, temperature, top_k, cap, seeds, frames, group, out=out,
                                table=table, acc=acc)  # fmt: skip
    rows, vocab = scores.shape
    assert scores.stride(-1) == 1 and (acc is None or acc.is_contiguous() and acc.dtype == torch.float32)
    if out is None:
        out = torch.empty(rows, dtype=torch.int64, device=scores.device)
    greedy, top_k, seeds, frames = (t.contiguous() for t in (greedy, top_k, seeds, frames))
    hidden = table.shape[1] if table is not None else 1
    _sample_kernel[(rows,)](
        scores, greedy, temperature, top_k, seeds, frames, out,
        table if table is not None else scores, acc if acc is not None else scores,
        vocab, hidden, scores.stride(0), temperature.stride(0), out.stride(0), group,
        CAP=cap, GROUPS=GROUPS_PER_FRAME, RADIX_BITS=radix_bits, ACCUMULATE=table is not None, PRECISE=not INTERPRET,
        BLOCK_V=triton.next_power_of_2(vocab), BLOCK_H=triton.next_power_of_2(hidden), PDL=pdl_enabled(pdl),
        stamps_ptr=timeline if timeline is not None else out, TIMELINE=TIMELINE_STAGES if timeline is not None else 0,
        index_ptr=index if index is not None else out, INDEXED=index is not None,
        num_warps=num_warps or (8 if vocab >= 2048 else 4), **launch_options(pdl),
    )  # fmt: skip
    return out
