"""`FastPreTransformer` computes what the plain codec pre-transformer's streaming step computes (CPU twins).

fp64 on the tiny codec, with layer scales far from their initial 0.01 so that folding them into the products
would show if it were wrong; shapes from one frame to more than the attention window, fresh and long streams.
"""

from __future__ import annotations

import pytest
import torch

from engine.codec.config import codec_preset
from engine.codec.weights import random_codec
from engine.fast.codec_transformer import FastPreTransformer


@pytest.fixture(scope="module")
def plain():
    decoder = random_codec(codec_preset("tiny"), dtype=torch.float64, seed=5)
    generator = torch.Generator().manual_seed(6)
    for layer in decoder.pre_transformer.layers:
        for scale in (layer.self_attn_layer_scale.scale, layer.mlp_layer_scale.scale):
            scale.data.copy_(0.5 + torch.rand(scale.shape, generator=generator, dtype=torch.float64))
    return decoder


@pytest.mark.parametrize(("positions", "frames"), [([0], 1), ([0, 5, 100], 4), ([3, 200], 80)])
def test_fast_pre_transformer_step_equals_the_plain_step(plain, positions, frames):
    config = plain.config
    generator = torch.Generator().manual_seed(len(positions) * 100 + frames)
    batch = len(positions)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    ring_shape = (batch, config.num_key_value_heads, config.sliding_window - 1, config.head_dim)
    rings = [(rand(*ring_shape), rand(*ring_shape)) for _ in plain.pre_transformer.layers]
    x = rand(batch, frames, config.latent_dim)
    with torch.no_grad():
        want, want_rings = plain.pre_transformer.forward_stream(x, torch.tensor(positions), rings)
        got, got_rings = FastPreTransformer(plain.pre_transformer).forward_stream(
            x, torch.tensor(positions), rings
        )
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for (want_k, want_v), (got_k, got_v) in zip(want_rings, got_rings, strict=True):
        torch.testing.assert_close(got_k, want_k, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got_v, want_v, rtol=1e-10, atol=1e-12)
