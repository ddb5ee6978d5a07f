"""The code predictor: a small Qwen3 decoder that fills codebooks 1..15 of a frame, one group per step.

Per frame (reference 6.2): a 2-token causal prefill [h_k, C(c_k^0)] at positions 0,1 predicts group 1;
then the embedding of group g-1's code at position g predicts group g, for g = 2..15. Inputs are
talker-width embeddings, mapped to the predictor width by `small_to_mtp_projection` (identity for the
0.6B model). Group g has its own input table `codec_embedding[g-1]` and head `lm_head[g-1]`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from engine.model.config import CodePredictorConfig
from engine.model.kv_cache import CodePredictorCache
from engine.model.layers import DecoderLayer, RMSNorm, RotaryEmbedding


class CodePredictorModel(nn.Module):
    def __init__(self, config: CodePredictorConfig) -> None:
        super().__init__()
        c = config
        self.layers = nn.ModuleList(
            DecoderLayer(
                c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.rms_norm_eps
            )
            for _ in range(c.num_layers)
        )
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        # Input tables for groups 1..15 are talker-width (group 0 uses the talker's codec embedding).
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(c.vocab_size, c.input_size) for _ in range(c.num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    def __init__(self, config: CodePredictorConfig) -> None:
        super().__init__()
        self.config = config
        self.model = CodePredictorModel(config)
        self.lm_head = nn.ModuleList(
            nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            for _ in range(config.num_code_groups - 1)
        )
        self.small_to_mtp_projection: nn.Module = (
            nn.Linear(config.input_size, config.hidden_size, bias=True)
            if config.has_input_projection
            else nn.Identity()
        )
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)

    def embed_code(self, group: int, codes: Tensor) -> Tensor:
        """codes [...] of group `group` (1..15) -> talker-width embeddings E_group(codes) [..., input_size]."""
        return self.model.codec_embedding[group - 1](codes)

    def forward(self, x: Tensor, cache: CodePredictorCache, start: int) -> Tensor:
        """x [B,T,input_size] at positions start.. -> final-norm hidden [B,T,hidden] (T=2 at start 0, else 1)."""
        rows, new_tokens = x.shape[0], x.shape[1]
        batch = cache.batch(rows, start, new_tokens)
        h = self.small_to_mtp_projection(x)
        cos, sin = self.rotary(batch.positions, h.dtype)
        for index, layer in enumerate(self.model.layers):
            k_cache, v_cache = cache.layer(index)
            h = layer(h, cos, sin, k_cache, v_cache, batch)
        return self.model.norm(h)

    def logits(self, group: int, hidden: Tensor) -> Tensor:
        """Head of group `group` (1..15): hidden [..., hidden] -> fp32 logits [..., vocab]."""
        return self.lm_head[group - 1](hidden).to(torch.float32)

    def new_cache(self, batch: int) -> CodePredictorCache:
        c = self.config
        weight = self.lm_head[0].weight
        return CodePredictorCache(
            c.num_layers,
            batch,
            c.num_kv_heads,
            c.num_code_groups,
            c.head_dim,
            device=weight.device,
            dtype=weight.dtype,
        )
