"""Every Triton kernel against its PyTorch twin on fresh random inputs: -> {kernel: relative L2 error}.

Used by the GPU check (full-size shapes) and by the CPU tests (tiny shapes, TRITON_INTERPRET=1). Caches
are poisoned with NaN so an unwritten or wrongly addressed read shows up as NaN, never as a small error.
"""

from __future__ import annotations

import traceback

import torch
from torch import Tensor

from engine.fast.kernels import use_triton
from engine.fast.kernels.decode_attention import decode_attention, decode_attention_reference
from engine.fast.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_reference
from engine.fast.kernels.rmsnorm import rms_norm, rms_norm_reference
from engine.fast.kernels.silu_mul import silu_mul, silu_mul_reference
from engine.fast.kernels.talker_draw import talker_draw, talker_draw_reference
from engine.fast.measure import relative_l2
from engine.model.layers import RotaryEmbedding


def check_kernels(device: str, dtype: torch.dtype, *, hidden: int = 2048, heads: int = 16, kv_heads: int = 8,
                  head_dim: int = 128, inter: int = 6144, rows: int = 8, max_len: int = 512,
                  vocab: int = 3072) -> dict[str, float]:  # fmt: skip
    """-> relative L2 errors; "talker_draw" is 1.0 if any of its tokens or slot-state entries differs from the
    twin's, else 0.0 (`vocab`: the talker's, 3072 at full size)."""
    gen = torch.Generator(device="cpu").manual_seed(1234)

    def rand(*shape: int, scale: float = 1.0) -> Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    errors: dict[str, float] = {}
    x, res, w = rand(rows, hidden), rand(rows, hidden), 1.0 + rand(hidden, scale=0.1)
    out, s = rms_norm(x, w, 1e-6, res)
    ref, ref_s = rms_norm_reference(x, w, 1e-6, res)
    errors["rms_norm"] = max(relative_l2(out, ref), relative_l2(s, ref_s))
    errors["rms_norm_no_residual"] = relative_l2(rms_norm(x, w, 1e-6)[0], rms_norm_reference(x, w, 1e-6)[0])

    gate_up = rand(rows, 2 * inter)
    errors["silu_mul"] = relative_l2(silu_mul(gate_up), silu_mul_reference(gate_up))

    slots_total = 4
    qkv = rand(rows, (heads + 2 * kv_heads) * head_dim)
    slot = torch.randint(0, slots_total, (rows,), generator=gen).to(device)
    position = (torch.arange(rows) * (max_len // rows)).to(device)  # distinct positions: no write collides
    rotary = RotaryEmbedding(head_dim, 1_000_000.0).to(device)
    rotary.reset_inv_freq()
    cos, sin = rotary(position[:, None], dtype)
    cos, sin = cos[:, 0, 0].contiguous(), sin[:, 0, 0].contiguous()  # [R,D]
    qw, kw = 1.0 + rand(head_dim, scale=0.1), 1.0 + rand(head_dim, scale=0.1)
    caches = [torch.full((slots_total, kv_heads, max_len, head_dim), float("nan"), dtype=dtype, device=device)
              for _ in range(4)]  # fmt: skip
    q = qk_norm_rope(qkv, cos, sin, qw, kw, 1e-6, caches[0], caches[1], slot, position, heads, kv_heads)
    q_ref = qk_norm_rope_reference(qkv, cos, sin, qw, kw, 1e-6, caches[2], caches[3], slot, position,
                                   heads, kv_heads)  # fmt: skip
    written = ~torch.isnan(caches[2])
    cache_error = max(relative_l2(caches[i][written], caches[i + 2][written]) for i in (0, 1))
    same_holes = bool(torch.equal(torch.isnan(caches[0]), torch.isnan(caches[2])))
    errors["qk_norm_rope"] = max(relative_l2(q, q_ref), cache_error if same_holes else float("inf"))

    batch = rows
    k_cache, v_cache = rand(slots_total + 2, kv_heads, max_len, head_dim), rand(slots_total + 2, kv_heads, max_len, head_dim)
    lengths = torch.randint(1, max_len + 1, (batch,), generator=gen)
    lengths[0], lengths[-1] = 1, max_len  # the extremes: one key, the whole capacity
    slots = torch.randint(0, slots_total + 2, (batch,), generator=gen).to(device)
    reference_keys = k_cache.clone()
    if use_triton(q_in := rand(batch, heads, head_dim)):  # poison keys past each row's length (the twin
        for b in range(batch):  # masks after the product, so it only runs on clean caches)
            if int((slots == slots[b]).sum()) == 1:
                k_cache[slots[b], :, int(lengths[b]):] = float("nan")
    lengths = lengths.to(device)
    errors["decode_attention"] = relative_l2(
        decode_attention(q_in, k_cache, v_cache, slots, lengths),
        decode_attention_reference(q_in, reference_keys, v_cache, slots, lengths),
    )
    try:  # (an option, off by default: a kernel that fails to build is reported as a failed check, not raised)
        errors["talker_draw"] = _talker_draw_mismatch(device, dtype, gen, 64, vocab)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        errors["talker_draw"] = float("inf")
    return errors


def _talker_draw_mismatch(device: str, dtype: torch.dtype, gen: torch.Generator, rows: int, vocab: int) -> float:
    """`talker_draw` against its twin on `rows` rows over distinct slots (the last two padded duplicates), mixed
    settings: 1.0 if any token or seen / generated / code0 entry differs, else 0.0."""
    num_codes = 2 * vocab // 3
    slots = rows + 3
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(device=device, dtype=dtype)
    logits[-2:] = logits[-3]  # padded rows repeat the last real one: its logits, slot and frame
    index = torch.randperm(slots, generator=gen)[:rows]
    index[-2:] = index[-3]
    frames = torch.randint(0, 1000, (rows,), generator=gen)
    frames[-2:] = frames[-3]
    state = {"seen": torch.rand(slots, vocab, generator=gen) < 0.05,
             "generated": torch.randint(0, 4, (slots,), generator=gen),
             "penalty": 1.0 + torch.rand(slots, 1, generator=gen), "greedy": torch.rand(slots, generator=gen) < 0.2,
             "temperature": 0.5 + torch.rand(slots, 1, generator=gen),
             "top_k": torch.tensor([0, 1, 5, 50, 64])[torch.randint(0, 5, (slots,), generator=gen)],
             "seeds": torch.randint(0, 2**62, (slots,), generator=gen), "code0": torch.zeros(slots, dtype=torch.int64)}
    eos_never = torch.rand(rows, generator=gen) < 0.3
    eos_never[-2:] = eos_never[-3]
    outs = []
    for draw in (talker_draw, talker_draw_reference):
        copy = {key: value.clone().to(device) for key, value in state.items()}
        out = torch.zeros(rows, dtype=torch.int64, device=device)
        args = (logits, index.to(device), frames.to(device), eos_never.to(device), *copy.values())
        if draw is talker_draw:
            draw(*args, eos_id=num_codes + 7, num_codes=num_codes, cap=64, out=out)
        else:
            draw(*args, num_codes + 7, num_codes, 64, out)
        outs.append([out[: rows - 2], copy["seen"], copy["generated"], copy["code0"]])
    return 0.0 if all(torch.equal(a, b) for a, b in zip(*outs, strict=True)) else 1.0
