"""The code predictor's kernels (gemv, cp_attention, sampler) against their twins: -> {check: error}.

Used by `tools/cp_kernels_check.py` (full-size shapes, bf16, CUDA) and the CPU tests (tiny shapes, fp32,
TRITON_INTERPRET=1). Every output buffer starts as NaN (tokens as -1) and the caches hold NaN past the
positions a step may read, so an unwritten or misaddressed element shows up as inf, never as a small error.

    "<kernel>_r<rows>"        relative L2 of the kernel against its twin (sampler: fraction of tokens that
                              differ, which must be 0)
    "<kernel>_r<rows>_ratio"  (low-precision dtypes only) the kernel's relative L2 against an fp32 twin run on
                              the same inputs, divided by the twin's own: issue 13's rule wants <= 1.1
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.fast.kernels import use_triton
from engine.fast.kernels.cp_attention import cp_attention, cp_attention_reference
from engine.fast.kernels.gemv import GemvConfig, gemv, gemv_reference
from engine.fast.kernels.sampler import sample, sample_reference
from engine.fast.measure import relative_l2
from engine.model.layers import RotaryEmbedding
from engine.model.rng import seed_tensor

# Split-K tile of the checks (`configs["split"]` overrides): 4 slices of the full-size products' K.
SPLIT_TILE = GemvConfig(block_n=16, block_k=128, use_dot=True, loop_stages=2, split_k=4)


def sampler_case(scores: Tensor, group: int, top_k_cap: int) -> tuple[Tensor, Tensor, Tensor, int, Tensor, Tensor]:
    """Per-row sampler settings for a check over scores [R,V], as `sample` takes them after the scores:
    (greedy, temperature, top_k, cap, seeds, frames). Every 7th row greedy; top-k cycling through off, 1, 2, 5,
    50, the cap, the whole vocabulary and 3; temperatures 0.4-1.6; distinct seeds and frames per row and group.
    Plants a tie some thresholds fall on: columns 5-8 of `scores` get column 5's value (in place)."""
    rows, vocab = scores.shape
    device = scores.device
    scores[:, 5:9] = scores[:, 5:6]
    row = torch.arange(rows, device=device)
    top_k = torch.tensor([0, 1, 2, 5, 50, top_k_cap, vocab, 3], device=device)[row % 8]
    temperature = (0.4 + (row % 5).float() * 0.3)[:, None]
    seeds = seed_tensor([2**64 - 1 - 7919 * i - group for i in range(rows)], device)
    return row % 7 == 3, temperature, top_k, top_k_cap, seeds, row * 37 + group


def check_cp_kernels(
    device: str, dtype: torch.dtype, *, hidden: int = 1024, input_size: int = 2048, heads: int = 16,
    kv_heads: int = 8, head_dim: int = 128, inter: int = 3072, vocab: int = 2048, positions: int = 16,
    rows: tuple[int, ...] = (1, 4, 16, 64), configs: dict[str, GemvConfig] | None = None, top_k_cap: int = 64,
) -> dict[str, float]:  # fmt: skip
    gen = torch.Generator(device="cpu").manual_seed(4321)
    configs = configs or {}

    def rand(*shape: int, scale: float = 1.0) -> Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    def nan(*shape: int) -> Tensor:
        return torch.full(shape, float("nan"), device=device, dtype=dtype)

    low_precision = dtype != torch.float32
    errors: dict[str, float] = {}
    qkv_width = (heads + 2 * kv_heads) * head_dim
    weights = {
        "proj": rand(hidden, input_size, scale=input_size**-0.5), "qkv": rand(qkv_width, hidden, scale=hidden**-0.5),
        "o": rand(hidden, heads * head_dim, scale=(heads * head_dim) ** -0.5),
        "gate_up": rand(2 * inter, hidden, scale=hidden**-0.5), "down": rand(hidden, inter, scale=inter**-0.5),
        "head": rand(vocab, hidden, scale=hidden**-0.5),
    }  # fmt: skip
    bias, norm = rand(hidden, scale=0.1), 1.0 + rand(hidden, scale=0.1)
    table = rand(vocab, input_size)

    def run_gemv(name: str, r: int, x: Tensor, weight: Tensor, **kw: object) -> None:
        n_out = weight.shape[0] // 2 if kw.get("silu_mul") else weight.shape[0]
        out = nan(r, n_out)
        sum_out = nan(r, x.shape[1]) if kw.get("residual") is not None else None
        y, s = gemv(x, weight, config=configs.get(name), out=out, sum_out=sum_out, **kw)  # type: ignore[arg-type]
        y_ref, s_ref = gemv_reference(x, weight, **kw)  # type: ignore[arg-type]
        error = relative_l2(y, y_ref)
        if s_ref is not None:
            error = max(error, relative_l2(s, s_ref) if s is not None else float("inf"))
        errors[f"gemv_{name}_r{r}"] = error
        if low_precision:
            wide = {
                k: v.float() if isinstance(v, Tensor) and v.is_floating_point() else v for k, v in kw.items()
            }
            y32, _ = gemv_reference(x.float(), weight.float(), **wide)  # type: ignore[arg-type]
            errors[f"gemv_{name}_r{r}_ratio"] = relative_l2(y, y32) / max(relative_l2(y_ref, y32), 1e-30)

    for r in rows:
        x, res = rand(r, hidden), rand(r, hidden)
        index = torch.randint(0, vocab, (r, 3), generator=gen).to(device)
        run_gemv("proj", r, table, weights["proj"], index=index[:, 1], bias=bias)  # a strided index column
        run_gemv("qkv", r, x, weights["qkv"], residual=res, norm_weight=norm)
        run_gemv("qkv_first", r, x, weights["qkv"], norm_weight=norm)  # layer 0: no residual yet
        run_gemv("o", r, rand(r, heads * head_dim), weights["o"])
        run_gemv("gate_up", r, x, weights["gate_up"], residual=res, norm_weight=norm, silu_mul=True)
        run_gemv("down", r, rand(r, inter, scale=0.3), weights["down"])
        pairs = rand(r, 2, hidden)  # the frame's first step: the head reads every second token row
        run_gemv("head", r, pairs[:, 1], weights["head"], residual=rand(r, 2, hidden)[:, 1], norm_weight=norm)

        # Split K (`GemvConfig.split_k`): the slices' partials summed by the last program in, under each epilogue;
        # twice on other inputs, so a count the first launch left nonzero shows (stores masked off: NaN stays, or
        # a slice summed before it was written: the first launch's partial).
        split = configs.get("split", SPLIT_TILE)
        for repeat in (1, 2):
            attended = rand(r, heads * head_dim)
            y, _ = gemv(attended, weights["o"], config=split, out=nan(r, hidden))
            errors[f"gemv_split_o{repeat}_r{r}"] = relative_l2(y, gemv_reference(attended, weights["o"])[0])
        y, _ = gemv(x, weights["gate_up"], silu_mul=True, config=split, out=nan(r, inter))
        errors[f"gemv_split_gate_up_r{r}"] = relative_l2(y, gemv_reference(x, weights["gate_up"], silu_mul=True)[0])

    rotary = RotaryEmbedding(head_dim, 1_000_000.0).to(device)
    rotary.reset_inv_freq()
    cos, sin = rotary(torch.arange(positions, device=device)[None], dtype)
    cos, sin = cos[0, 0].contiguous(), sin[0, 0].contiguous()  # [L,D]
    qw, kw = 1.0 + rand(head_dim, scale=0.1), 1.0 + rand(head_dim, scale=0.1)
    for r in rows:
        cases = ((0, 2, ""), (7, 1, ""), (positions - 1, 1, ""), (7, 1, "early"), (0, 2, "per_head"),
                 (positions - 1, 1, "per_head"), (0, 2, "query_split"), (7, 1, "query_split"))
        for start, tokens, variant in cases:
            caches = [rand(r + 1, kv_heads, positions, head_dim) for _ in range(2)]
            clean = [c.clone() for c in caches]
            qkv = rand(r * tokens, qkv_width)
            for c, c_clean in zip(caches, clean, strict=True):
                if use_triton(qkv):  # never read before this step writes it (off the kernels, the twin runs)
                    c[:, :, start:] = float("nan")
                c_clean[:, :, start:] = 0.0  # the twin masks after the product: it needs finite keys
            out = cp_attention(qkv, cos, sin, qw, kw, 1e-6, *caches, start, tokens, heads, kv_heads,
                               out=nan(r * tokens, heads * head_dim), early_cache=variant == "early",
                               pdl=variant == "early", per_head=variant in ("per_head", "query_split"),
                               query_split=2 if variant == "query_split" else 1)  # fmt: skip
            ref = cp_attention_reference(qkv, cos, sin, qw, kw, 1e-6, *clean, start, tokens, heads, kv_heads)
            written = slice(start, start + tokens)
            cache_error = max(relative_l2(c[:r, :, written], c_ref[:r, :, written])
                              for c, c_ref in zip(caches, clean, strict=True))  # fmt: skip
            name = f"cp_attention{'_' if variant else ''}{variant}_p{start}_r{r}"
            errors[name] = max(relative_l2(out, ref), cache_error)
            if low_precision:
                wide = [c.float() for c in clean]
                for c in wide:
                    c[:, :, start:] = 0.0
                ref32 = cp_attention_reference(qkv.float(), cos.float(), sin.float(), qw.float(), kw.float(), 1e-6,
                                               *wide, start, tokens, heads, kv_heads)  # fmt: skip
                errors[name + "_ratio"] = relative_l2(out, ref32) / max(relative_l2(ref, ref32), 1e-30)

    embed = rand(vocab, input_size)
    for r in rows:
        mismatches, acc_error = 0, 0.0
        searches = ((1, 2), (8, 4), (15, 3), (4, 1), (11, 8))  # groups with their own search widths (8: by bytes)
        for group, radix_bits in searches:
            scores = rand(r, vocab, scale=2.0)
            settings = sampler_case(scores, group, top_k_cap)
            codes = torch.full((r, 16), -1, dtype=torch.int64, device=device)
            acc = torch.randn(r, input_size, generator=gen).to(device)
            acc_ref = acc.clone()
            sample(scores, *settings, group, out=codes[:, group], table=embed, acc=acc, radix_bits=radix_bits)
            tokens = sample_reference(scores, *settings, group, table=embed, acc=acc_ref)
            mismatches += int((codes[:, group] != tokens).sum())
            acc_error = max(acc_error, relative_l2(acc, acc_ref))
        errors[f"sampler_r{r}"] = mismatches / (len(searches) * r)
        errors[f"sampler_acc_r{r}"] = acc_error
    return errors
