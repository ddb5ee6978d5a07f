"""The 12 Hz speech tokenizer's encoder: 24 kHz PCM -> codes [T, 16] (the in-context reference codes).

One promise: `CodecEncoder(config)` with the checkpoint's `encoder.*` tensors (names unchanged, prefix
stripped) computes the codes the official `Qwen3TTSTokenizerV2Model.encode` returns: the transformers
`MimiModel` encoder (SEANet convs -> transformer -> x2 downsample -> split RVQ), keeping the first
`encoder_valid_num_quantizers` (16) codebooks and ceil(samples / 1920) frames.

    pcm [B,1,N] -> SEANet (causal convs, ELU, strides 4,5,6,8)           -> [B,H,ceil(N/960)]  25 Hz
                -> transformer (LayerNorm, RoPE, full causal attention, GELU MLP, LayerScale)
                -> downsample conv k4 s2 (replicate padding)             -> [B,H,ceil(N/1920)] 12.5 Hz
                -> semantic RVQ (1 codebook) and acoustic RVQ (15 kept) on the same latent, each with its
                   own 1x1 input projection; nearest codeword by `torch.cdist`, residual subtracted.

Causal conv (Mimi): left padding `(k-1)*dilation + 1 - stride`, right padding up to a whole number of
strides (`ceil(L/stride)*stride - L`), then the strided conv. The transformer applies no sliding window:
see `CodecEncoderConfig.sliding_window`. Layers, composition and loading (`encoder_weights.py`) are separate.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.codec.encoder_config import CodecEncoderConfig
from engine.model.layers import RotaryEmbedding, apply_rope

_USAGE_EPSILON = 1e-5

# ---------------------------------------------------------------- layers


class CausalConv1d(nn.Module):
    """Mimi's causal conv: `conv` holds the checkpoint's `<name>.conv.{weight,bias}`."""

    def __init__(
        self, in_ch: int, out_ch: int, kernel: int, *, stride: int = 1, dilation: int = 1,
        bias: bool = True, pad_mode: str = "constant",
    ) -> None:  # fmt: skip
        super().__init__()
        self.conv = nn.Conv1d(in_ch, out_ch, kernel, stride=stride, dilation=dilation, bias=bias)
        self.stride = stride
        self.left = (kernel - 1) * dilation + 1 - stride
        self.pad_mode = pad_mode

    def forward(self, x: Tensor) -> Tensor:
        """x [B,C,L] -> [B,C_out,ceil(L/stride)]."""
        length = x.shape[-1]
        right = math.ceil(length / self.stride) * self.stride - length
        x = F.pad(x, (self.left, right), mode=self.pad_mode) if self.left or right else x
        return self.conv(x)


class ResnetBlock(nn.Module):
    """x + conv1x1(elu(conv_k(elu(x)))): `block.1` and `block.3` are the convs (ELUs at 0 and 2)."""

    def __init__(self, dim: int, hidden: int, kernel: int, dilation: int, pad_mode: str) -> None:
        super().__init__()
        self.block = nn.ModuleList([
            nn.ELU(), CausalConv1d(dim, hidden, kernel, dilation=dilation, pad_mode=pad_mode),
            nn.ELU(), CausalConv1d(hidden, dim, 1, pad_mode=pad_mode),
        ])  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        h = x
        for layer in self.block:
            h = layer(h)
        return x + h


class SEANetEncoder(nn.Module):
    """`layers`: conv, then per stride (4,5,6,8): residual blocks, ELU, strided conv (x2 channels); ELU, conv."""

    def __init__(self, c: CodecEncoderConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            CausalConv1d(c.audio_channels, c.num_filters, c.kernel_size, pad_mode=c.pad_mode)
        ]
        width = c.num_filters
        for ratio in reversed(c.upsampling_ratios):
            for j in range(c.num_residual_layers):
                layers.append(ResnetBlock(width, width // c.compress, c.residual_kernel_size,
                                          c.dilation_growth_rate**j, c.pad_mode))  # fmt: skip
            layers += [nn.ELU(), CausalConv1d(width, width * 2, ratio * 2, stride=ratio, pad_mode=c.pad_mode)]
            width *= 2
        layers += [nn.ELU(), CausalConv1d(width, c.hidden_size, c.last_kernel_size, pad_mode=c.pad_mode)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor) -> Tensor:
        """pcm [B,1,N] -> latent [B,H,ceil(N/prod(ratios))]."""
        for layer in self.layers:
            x = layer(x)
        return x


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


class EncoderAttention(nn.Module):
    """Multi-head causal self-attention with RoPE, no biases, no q/k norm (GQA when kv heads < heads)."""

    def __init__(self, c: CodecEncoderConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x [B,T,H] -> [B,T,H]; cos/sin [B,1,T,D]."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)  # [B,h,T,D]
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)  # [B,h,T,D]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class EncoderMLP(nn.Module):
    def __init__(self, c: CodecEncoderConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.fc2 = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class EncoderTransformerLayer(nn.Module):
    def __init__(self, c: CodecEncoderConfig) -> None:
        super().__init__()
        self.self_attn = EncoderAttention(c)
        self.mlp = EncoderMLP(c)
        self.input_layernorm = nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
        self.self_attn_layer_scale = LayerScale(c.hidden_size)
        self.mlp_layer_scale = LayerScale(c.hidden_size)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class EncoderTransformer(nn.Module):
    def __init__(self, c: CodecEncoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderTransformerLayer(c) for _ in range(c.num_hidden_layers))
        self.rotary = RotaryEmbedding(c.head_dim, c.rope_theta)

    def forward(self, x: Tensor) -> Tensor:
        """x [B,T,H] -> [B,T,H] (positions 0..T-1; no final norm)."""
        positions = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        cos, sin = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class Codebook(nn.Module):
    """Euclidean codebook: codewords = embed_sum / clamp(cluster_usage, 1e-5) (all three are buffers)."""

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    def codewords(self) -> Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=_USAGE_EPSILON)[:, None]  # [size, dim]


class VectorQuantizer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.codebook = Codebook(size, dim)


class ResidualVectorQuantizer(nn.Module):
    """input_proj (1x1, no bias) -> K nearest-codeword steps on the running residual. `output_proj` is
    decode-only (loaded, unused here)."""

    def __init__(self, count: int, c: CodecEncoderConfig) -> None:
        super().__init__()
        dim = c.vector_quantization_hidden_dimension
        self.input_proj = nn.Conv1d(c.hidden_size, dim, 1, bias=False) if dim != c.hidden_size else None
        self.output_proj = nn.Conv1d(dim, c.hidden_size, 1, bias=False) if dim != c.hidden_size else None
        self.layers = nn.ModuleList(VectorQuantizer(c.codebook_size, c.codebook_dim) for _ in range(count))

    def encode(self, latent: Tensor, count: int) -> Tensor:
        """latent [B,H,T] -> codes [B,count,T] of the first `count` quantizers."""
        x = self.input_proj(latent) if self.input_proj is not None else latent  # [B,D,T]
        residual = x.permute(0, 2, 1)  # [B,T,D]
        codes = []
        for layer in self.layers[:count]:
            words = layer.codebook.codewords()  # [size, D]
            flat = residual.reshape(-1, residual.shape[-1])  # [B*T, D]
            nearest = torch.cdist(flat[None].float(), words[None].float(), p=2)[0].argmin(dim=-1)  # [B*T]
            nearest = nearest.view(residual.shape[:-1])  # [B,T]
            residual = residual - F.embedding(nearest, words)
            codes.append(nearest)
        return torch.stack(codes, dim=1)


class SplitResidualVectorQuantizer(nn.Module):
    def __init__(self, c: CodecEncoderConfig) -> None:
        super().__init__()
        self.semantic_residual_vector_quantizer = ResidualVectorQuantizer(c.num_semantic_quantizers, c)
        self.acoustic_residual_vector_quantizer = ResidualVectorQuantizer(
            c.num_quantizers - c.num_semantic_quantizers, c
        )

    def encode(self, latent: Tensor, count: int) -> Tensor:
        """latent [B,H,T] -> codes [B,count,T]: semantic codebook(s) first, then acoustic ones."""
        semantic = self.semantic_residual_vector_quantizer
        first = semantic.encode(latent, len(semantic.layers))
        rest = self.acoustic_residual_vector_quantizer.encode(latent, count - first.shape[1])
        return torch.cat((first, rest), dim=1)


# ---------------------------------------------------------------- composition


class CodecEncoder(nn.Module):
    """Module names equal the checkpoint's `encoder.*` names minus the prefix."""

    def __init__(self, config: CodecEncoderConfig) -> None:
        super().__init__()
        c = self.config = config
        self.encoder = SEANetEncoder(c)
        self.encoder_transformer = EncoderTransformer(c)
        self.downsample = CausalConv1d(c.hidden_size, c.hidden_size, c.downsample_kernel,
                                       stride=c.downsample_stride, bias=False, pad_mode="replicate")  # fmt: skip
        self.quantizer = SplitResidualVectorQuantizer(c)

    def latent(self, pcm: Tensor) -> Tensor:
        """pcm [B,N] at 24 kHz -> pre-quantisation latent [B,H,ceil(N/1920)]."""
        x = self.encoder(pcm[:, None])  # [B,H,T25]
        x = self.encoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        return self.downsample(x)

    @torch.inference_mode()
    def encode(self, pcm: Tensor) -> Tensor:
        """pcm [N] float at 24 kHz (in the module's dtype) -> codes [ceil(N/1920), valid_quantizers] int64."""
        if pcm.ndim != 1:
            raise ValueError(f"encode expects mono PCM [samples], got shape {tuple(pcm.shape)}")
        weight = self.downsample.conv.weight
        pcm = pcm.to(device=weight.device, dtype=weight.dtype)
        codes = self.quantizer.encode(self.latent(pcm[None]), self.config.valid_quantizers)  # [1,16,T]
        frames = -(-pcm.shape[0] // self.config.downsample_rate)
        return codes[0, :, :frames].T.contiguous()
