"""Building blocks of the 12 Hz codec decoder, each with a stateless and an exact streaming forward.

Attribute names match the official modules so `state_dict()` keys equal the checkpoint's (reference section 8).
Every stateful block offers `forward(x)` (whole sequence, zero left padding, the official arithmetic) and
`forward_stream(x, state) -> (y, new_state)` (only the new samples, the past carried in `state`). A zero state
is exactly the zero padding of `forward`, so a stream's first chunk needs no state built beforehand.

Shapes: conv-side activations are [B, C, L] (L samples at the block's rate); the transformer works on
[B, N, hidden] (N frames).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# ------------------------------------------------------------------------------------------ convolutions


def take_window(x: Tensor, starts: Tensor, length: int) -> Tensor:
    """x [B, C, L], starts [B] int64 -> x[b, :, starts[b] : starts[b] + length] for every row, [B, C, length]
    (one gather): where a ragged batch's rows end is a per-row offset."""
    index = starts[:, None] + torch.arange(length, device=x.device)[None, :]
    return torch.gather(x, 2, index[:, None, :].expand(x.shape[0], x.shape[1], length))


def zero_padding(x: Tensor, valid: Tensor) -> Tensor:
    """x [B, C, N] with row b's samples from valid[b] on set to zero (a ragged batch's padding)."""
    real = torch.arange(x.shape[-1], device=x.device)[None, :] < valid[:, None]  # [B, N]
    return x * real[:, None, :].to(x.dtype)


class CausalConv1d(nn.Module):
    """Stride-1 Conv1d padded only on the left by (k - 1) * dilation; the weights live in `.conv`."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1
    ):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.history = (kernel_size - 1) * dilation  # input samples of the past each output needs

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (self.history, 0)))

    def forward_stream(self, x: Tensor, history: Tensor, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x [B, C_in, L], history [B, C_in, history] -> (y [B, C_out, L], the last `history` inputs).
        `valid` [B]: only the first valid[b] samples of row b are real (a ragged batch); the history then ends
        there, and y past them is padding. Causal: the real outputs never see the padding."""
        if self.history == 0:
            return self.conv(x), history
        padded = torch.cat([history, x], dim=-1)
        if valid is None:
            return self.conv(padded), padded[..., padded.shape[-1] - self.history :]
        return self.conv(padded), take_window(padded, valid, self.history)


class CausalTransposedConv1d(nn.Module):
    """ConvTranspose1d(k, stride s) whose last k - s output samples are dropped (they belong to the future)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.stride = stride
        self.overlap = kernel_size - stride  # tail samples the next input frame still adds to

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.overlap] if self.overlap else y

    def forward_stream(self, x: Tensor, overlap: Tensor, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x [B, C_in, N] -> (y [B, C_out, N * s], new overlap [B, C_out, k - s]).

        The bias-free output of the new inputs is [B, C_out, N*s + k - s]; the carried overlap (bias-free tail of
        the previous call) adds onto its head, the first N*s samples are final (bias added once, here), and the
        tail waits for the next call.

        `valid` [B] (0..N): only row b's first valid[b] inputs are real. The padding inputs are zeroed, so they
        add nothing, and the tail is taken where the real output ends (valid[b] * s; at 0 it is the carried
        overlap itself); that needs k - s <= s, which every codec stage has (k = 2s, or k = s and no tail).
        """
        if self.overlap == 0:
            return self.conv(x), overlap
        if valid is not None:
            x = zero_padding(x, valid)
        y = F.conv_transpose1d(x, self.conv.weight, None, stride=self.stride)
        y = torch.cat([y[..., : self.overlap] + overlap, y[..., self.overlap :]], dim=-1)
        emitted = x.shape[-1] * self.stride
        out = y[..., :emitted] + self.conv.bias[:, None]
        if valid is None:
            return out, y[..., emitted:]
        return out, take_window(y, valid * self.stride, self.overlap)


# ------------------------------------------------------------------------------------------ activations


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / (e^beta + 1e-9), per channel; alpha and beta are stored as logs."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        # Same operation order as the official module (it matters for bf16 parity).
        alpha = torch.exp(self.alpha[None, :, None])
        beta = torch.exp(self.beta[None, :, None])
        return x + (1.0 / (beta + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)


# ------------------------------------------------------------------------------------------ conv blocks


class ConvNeXtBlock(nn.Module):
    """Causal depthwise k7 conv -> LayerNorm over channels -> Linear x4 -> GELU -> Linear -> x gamma, residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, kernel_size=7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def _pointwise(self, x: Tensor, mixed: Tensor) -> Tensor:
        h = self.pwconv2(self.act(self.pwconv1(self.norm(mixed.permute(0, 2, 1)))))
        return x + (self.gamma * h).permute(0, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self._pointwise(x, self.dwconv(x))

    def forward_stream(self, x: Tensor, history: Tensor, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        mixed, history = self.dwconv.forward_stream(x, history, valid)
        return self._pointwise(x, mixed), history


class ResidualUnit(nn.Module):
    """x + conv2_k1(Snake(conv1_k7_dilated(Snake(x)))); only conv1 needs the past."""

    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, kernel_size=7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, kernel_size=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv2(self.act2(self.conv1(self.act1(x)))) + x

    def forward_stream(self, x: Tensor, history: Tensor, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        h, history = self.conv1.forward_stream(self.act1(x), history, valid)
        return self.conv2(self.act2(h)) + x, history


class DecoderBlock(nn.Module):
    """SnakeBeta -> causal transposed conv (k 2r, stride r, halves channels) -> residual units d = 1, 3, 9."""

    DILATIONS = (1, 3, 9)

    def __init__(self, in_dim: int, out_dim: int, rate: int):
        super().__init__()
        units: list[nn.Module] = [ResidualUnit(out_dim, d) for d in self.DILATIONS]
        self.block = nn.ModuleList(
            [SnakeBeta(in_dim), CausalTransposedConv1d(in_dim, out_dim, 2 * rate, rate), *units]
        )

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.block:
            x = layer(x)
        return x

    def forward_stream(
        self, x: Tensor, states: list[Tensor], valid: Tensor | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        """states = [transposed-conv overlap, conv1 history of unit d=1, d=3, d=9]; `valid` [B]: real input
        samples per row (a ragged batch), so the units see valid * rate real samples."""
        x = self.block[0](x)
        transposed, units = self.block[1], self.block[2:]
        x, overlap = transposed.forward_stream(x, states[0], valid)
        valid = None if valid is None else valid * transposed.stride
        new_states = [overlap]
        for layer, state in zip(units, states[1:], strict=True):
            x, state = layer.forward_stream(x, state, valid)
            new_states.append(state)
        return x, new_states


# ------------------------------------------------------------------------------------------ transformer


class RMSNorm(nn.Module):
    """Official arithmetic: normalise in fp32, cast back to the input dtype, then multiply by the weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int, initial: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), initial))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


class SwiGLU(nn.Module):
    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, inner, bias=False)
        self.up_proj = nn.Linear(dim, inner, bias=False)
        self.down_proj = nn.Linear(inner, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_tables(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions [B, N] (int) -> cos, sin [B, N, head_dim]: angles in fp32, then cast to the activation dtype."""
    angles = positions.to(torch.float32)[..., None] * inv_freq.to(torch.float32)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


class Attention(nn.Module):
    """Multi-head attention without q/k norm; RoPE on all head dims; keys/values may be grouped (GQA)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, N, hidden] -> q [B, H, N, D], post-RoPE k and v [B, H_kv, N, D]."""
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos[:, None], sin[:, None]
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
        """q [B, H, N, D], k/v [B, H_kv, S, D], allowed [B or 1, N, S] bool -> [B, N, H * D] (after o_proj)."""
        if self.kv_heads != self.heads:
            repeat = self.heads // self.kv_heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], scale=self.head_dim**-0.5)
        b, _, n, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))


class TransformerLayer(nn.Module):
    """h = x + s_attn * Attn(RMSNorm(x)); y = h + s_mlp * SwiGLU(RMSNorm(h))."""

    def __init__(
        self, hidden: int, heads: int, kv_heads: int, head_dim: int, inner: int, eps: float, scale: float
    ):
        super().__init__()
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim)
        self.mlp = SwiGLU(hidden, inner)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.self_attn_layer_scale = LayerScale(hidden, scale)
        self.mlp_layer_scale = LayerScale(hidden, scale)

    def _mlp(self, h: Tensor) -> Tensor:
        return h + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(h)))

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, window: int, block: int = 512) -> Tensor:
        """Whole sequence from position 0. Queries go in blocks so memory stays O(N * (block + window)); up to
        `block` frames (every official 300+25-frame chunk) it is one attention call, as the official."""
        q, k, v = self.self_attn.project(self.input_layernorm(x), cos, sin)
        n = x.shape[1]
        pieces = []
        for start in range(0, n, block):
            end = min(start + block, n)
            first_key = max(0, start - (window - 1))
            query_pos = torch.arange(start, end, device=x.device)[:, None]
            key_pos = torch.arange(first_key, end, device=x.device)[None, :]
            allowed = (key_pos <= query_pos) & (key_pos > query_pos - window)
            pieces.append(
                self.self_attn.attend(
                    q[:, :, start:end], k[:, :, first_key:end], v[:, :, first_key:end], allowed[None]
                )
            )
        attn = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)
        return self._mlp(x + self.self_attn_layer_scale(attn))

    def forward_stream(
        self, x: Tensor, cos: Tensor, sin: Tensor, k_ring: Tensor, v_ring: Tensor, allowed: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, N, hidden]; rings [B, H_kv, W-1, D]; allowed [B, N, W-1+N] -> (y, new k, new v [B, H_kv, N, D])."""
        q, k, v = self.self_attn.project(self.input_layernorm(x), cos, sin)
        attn = self.self_attn.attend(q, torch.cat([k_ring, k], dim=2), torch.cat([v_ring, v], dim=2), allowed)
        return self._mlp(x + self.self_attn_layer_scale(attn)), k, v
