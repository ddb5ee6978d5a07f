"""The talker: a Qwen3 decoder over summed text+codec embeddings that predicts codebook 0 of each frame.

Module names mirror the checkpoint (`talker.model.layers.N...`, `talker.text_projection.linear_fc1`,
`talker.codec_head`), so loading weights is a lookup, not a rename. The forward takes embeddings,
never ids: every input row is P(text id) + C(codec id) or a sum of code embeddings (reference 5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.model.config import TalkerConfig
from engine.model.kv_cache import TalkerKVCache
from engine.model.layers import AttentionBatch, DecoderLayer, RMSNorm, RotaryEmbedding


class TextProjection(nn.Module):
    """P(e) = fc2(silu(fc1(e))), both biased: text width -> text width -> talker width."""

    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerModel(nn.Module):
    def __init__(self, config: TalkerConfig) -> None:
        super().__init__()
        c = config
        self.layers = nn.ModuleList(
            DecoderLayer(
                c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.rms_norm_eps
            )
            for _ in range(c.num_layers)
        )
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.codec_embedding = nn.Embedding(c.vocab_size, c.hidden_size)
        self.text_embedding = nn.Embedding(c.text_vocab_size, c.text_hidden_size)


class Talker(nn.Module):
    def __init__(self, config: TalkerConfig) -> None:
        super().__init__()
        self.config = config
        self.model = TalkerModel(config)
        self.text_projection = TextProjection(config.text_hidden_size, config.hidden_size)
        self.codec_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)

    def embed_text(self, ids: Tensor) -> Tensor:
        """ids [...] -> P(ids) [..., hidden]. One call is one GEMM: callers group ids as the official code does."""
        return self.text_projection(self.model.text_embedding(ids))

    def embed_codec(self, ids: Tensor) -> Tensor:
        """ids [...] -> C(ids) [..., hidden]."""
        return self.model.codec_embedding(ids)

    def forward(self, x: Tensor, cache: TalkerKVCache, batch: AttentionBatch) -> Tensor:
        """x [B,T,hidden] at `batch.positions` -> final-norm hidden states [B,T,hidden]."""
        cos, sin = self.rotary(batch.positions, x.dtype)
        for index, layer in enumerate(self.model.layers):
            k_cache, v_cache = cache.layer(index)
            x = layer(x, cos, sin, k_cache, v_cache, batch)
        return self.model.norm(x)

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden [..., hidden] -> fp32 logits [..., vocab] (the head runs in the model dtype, then upcasts)."""
        return self.codec_head(hidden).to(torch.float32)

    def new_cache(self, num_slots: int, max_len: int) -> TalkerKVCache:
        c = self.config
        weight = self.model.norm.weight
        return TalkerKVCache(
            c.num_layers,
            num_slots,
            c.num_kv_heads,
            max_len,
            c.head_dim,
            device=weight.device,
            dtype=weight.dtype,
        )
