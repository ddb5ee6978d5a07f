"""Codec encoder weights: the `encoder.*` tensors of `speech_tokenizer/model.safetensors` by name, or random ones.

One promise: `load_codec_encoder(dir)` builds a `CodecEncoder` from `dir/speech_tokenizer/{config.json,
model.safetensors}` (or a standalone tokenizer folder) where checkpoint tensor `encoder.X` is parameter or
buffer `X`; every missing tensor, wrong shape and unexpected `encoder.*` tensor is one error naming them
all (`decoder.*` tensors belong to `engine.codec.weights`). `random_codec_encoder` gives seeded weights of
any shape for presets and dummy loads (codebooks of distinct random codewords, so codes are spread).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import Tensor

from engine.codec.encoder import CodecEncoder
from engine.codec.encoder_config import CodecEncoderConfig
from engine.codec.weights import read_checked_tensors, resolve_codec_dir

PREFIX = "encoder."


def expected_encoder_tensor_table(config: CodecEncoderConfig) -> dict[str, tuple[int, ...]]:
    """Every `encoder.*` tensor of `speech_tokenizer/model.safetensors` with its shape (meta device)."""
    with torch.device("meta"):
        encoder = CodecEncoder(config)
    return {PREFIX + name: tuple(t.shape) for name, t in encoder.state_dict().items()}


def load_codec_encoder(
    dir: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> CodecEncoder:
    codec_dir = resolve_codec_dir(dir)
    config = CodecEncoderConfig.from_dict(json.loads((codec_dir / "config.json").read_text()))
    tensors = read_checked_tensors(codec_dir, expected_encoder_tensor_table(config),
                                   lambda key: key.startswith(PREFIX), PREFIX, "encoder", device, dtype)  # fmt: skip
    with torch.device("meta"):
        encoder = CodecEncoder(config)
    encoder.load_state_dict(tensors, strict=True, assign=True)
    _reset_rotary(encoder)
    return encoder.eval().requires_grad_(False)


def random_codec_encoder(
    config: CodecEncoderConfig,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> CodecEncoder:
    """Seeded random weights made on `device`; deterministic per (seed, device type)."""
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.device("meta"):
        encoder = CodecEncoder(config)
    tensors = {
        name: _random_tensor(name, tuple(t.shape), generator, device).to(dtype)
        for name, t in encoder.state_dict().items()
    }
    encoder.load_state_dict(tensors, strict=True, assign=True)
    _reset_rotary(encoder)
    return encoder.eval().requires_grad_(False)


def _reset_rotary(encoder: CodecEncoder) -> None:
    """The RoPE table is not a checkpoint tensor: recompute it (fp32) on the weights' device."""
    rotary = encoder.encoder_transformer.rotary
    rotary.inv_freq = torch.empty(0, device=encoder.downsample.conv.weight.device)
    rotary.reset_inv_freq()


def _random_tensor(
    name: str, shape: tuple[int, ...], generator: torch.Generator, device: torch.device
) -> Tensor:
    def normal(std: float, mean: float = 0.0) -> Tensor:
        return torch.randn(shape, generator=generator, device=device) * std + mean

    leaf = name.rsplit(".", 1)[-1]
    if leaf == "initialized":
        return torch.ones(shape, device=device)
    if leaf == "cluster_usage":
        return torch.rand(shape, generator=generator, device=device) + 0.5
    if leaf == "embed_sum":
        return normal(0.5)
    if leaf == "scale":  # LayerScale
        return normal(0.02, mean=0.2)
    if leaf == "bias":
        return normal(0.02)
    if len(shape) == 1:  # LayerNorm weights
        return normal(0.05, mean=1.0)
    return normal(1.0 / math.sqrt(math.prod(shape[1:])))  # Linear [out, in], Conv1d [out, in, k]
