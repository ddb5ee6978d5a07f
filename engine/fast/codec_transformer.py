"""`FastPreTransformer`: the codec's sliding-window pre-transformer step in about a third of the kernels, same results.

A drop-in for `PreTransformer.forward_stream` (same inputs, outputs and rings) that `FastCodecDecoder` runs. At the
engine's shapes (1-32 streams x 1-4 frames) the codec step is launch-bound: the plain layer launches ~47 kernels,
which is over half of a whole codec step's ~650. Per layer here (B streams, N frames, R = B * N rows):

    rms_norm(x + previous MLP out)           1   [R, hidden]   (kernels/rmsnorm.py: residual add folded in)
    q|k|v = one product                      1   [R, (H + 2 H_kv) * D]
    RoPE on q|k together                     5   (the plain op sequence, so the same rounding)
    keys, values = cat(ring, new)            2   [B, H_kv, W-1+N, D]
    attention (SDPA, the plain mask)         1+
    o_proj, its layer scale folded in        2   (heads -> rows copy, product)
    rms_norm(h + attention out)              1
    gate|up product, silu * up, down         3   (down with its layer scale folded in)

With `fused_attention` the RoPE, concatenation, SDPA and copy rows above, and the rings' update, run as one
kernel (kernels/codec_attention.py): 8 launches a layer instead of ~21.

Folding a layer scale s into the product before it (diag(s) W instead of s * (W x)) changes where a bf16 result
rounds, not what it computes; in fp32 / TF32 it is the same to rounding. Weights are read from the plain module at
construction (folded copies for the scaled products, about 30 M parameters).
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.codec.layers import TransformerLayer
from engine.codec.model import PreTransformer, real_frames
from engine.fast.kernels.codec_attention import codec_attention, codec_attention_reference
from engine.fast.kernels.rmsnorm import rms_norm
from engine.fast.kernels.silu_mul import silu_mul


def _scaled(scale: Tensor, weight: Tensor) -> Tensor:
    """diag(scale) @ weight, in at least fp32, rounded once to the weight's dtype."""
    wide = torch.promote_types(weight.dtype, torch.float32)
    return (scale.detach().to(wide)[:, None] * weight.detach().to(wide)).to(weight.dtype)


class _Layer:
    def __init__(self, layer: TransformerLayer) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.heads, self.kv_heads, self.head_dim = attn.heads, attn.kv_heads, attn.head_dim
        self.in_norm = layer.input_layernorm.weight.detach()
        self.post_norm = layer.post_attention_layernorm.weight.detach()
        self.eps = layer.input_layernorm.eps
        self.qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach()
        self.o = _scaled(layer.self_attn_layer_scale.scale, attn.o_proj.weight)
        self.gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach()
        self.down = _scaled(layer.mlp_layer_scale.scale, mlp.down_proj.weight)


class FastPreTransformer:
    """`PreTransformer.forward_stream` with fused norms, joint projections and folded layer scales."""

    def __init__(self, plain: PreTransformer, fused_attention: bool = False) -> None:
        self.plain = plain
        self.attention = codec_attention if fused_attention else codec_attention_reference
        self.layers = [_Layer(layer) for layer in plain.layers]
        self.final_norm = plain.norm.weight.detach()
        self.final_eps = plain.norm.eps

    def forward_stream(
        self, x: Tensor, positions: Tensor, rings: list[tuple[Tensor, Tensor]], valid: Tensor | None = None
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """x [B, N, latent]; positions [B] int64; rings per layer (k, v) [B, H_kv, W-1, D] -> (y [B, N, latent],
        new rings), as `PreTransformer.forward_stream` (`valid`: a ragged batch's real frames per row)."""
        plain = self.plain
        x = plain.input_proj(x)
        batch, n, hidden = x.shape
        if valid is not None and n > plain.window - 1:
            raise ValueError(f"a ragged codec step decodes at most {plain.window - 1} frames, got {n}")
        cos, sin, allowed, slots = plain.stream_layout(positions, n, x.dtype)
        real = None if valid is None else real_frames(valid, n)
        rows = x.reshape(batch * n, hidden)
        pending: Tensor | None = None  # the previous MLP's output, added to `rows` by the next norm
        new_rings = []
        for layer, (k_ring, v_ring) in zip(self.layers, rings, strict=True):
            heads, kv_heads = layer.heads, layer.kv_heads
            normed, rows = rms_norm(pending if pending is not None else rows, layer.in_norm, layer.eps,
                                    residual=rows if pending is not None else None)  # fmt: skip
            qkv = (normed @ layer.qkv.T).view(batch, n, (heads + 2 * kv_heads) * layer.head_dim)
            attn, k_ring, v_ring = self.attention(qkv, cos, sin, allowed, k_ring, v_ring, slots, real, heads, kv_heads)
            attn = attn @ layer.o.T  # attn [B * N, H * D]
            normed, rows = rms_norm(attn, layer.post_norm, layer.eps, residual=rows)
            pending = silu_mul(normed @ layer.gate_up.T) @ layer.down.T
            new_rings.append((k_ring, v_ring))
        normed, _ = rms_norm(pending if pending is not None else rows, self.final_norm, self.final_eps,
                             residual=rows if pending is not None else None)  # fmt: skip
        return plain.output_proj(normed).view(batch, n, -1), new_rings
