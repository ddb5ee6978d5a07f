"""Codec decoder weights: load the official `speech_tokenizer/` files by name, or build seeded random ones.

Loading is a rename: checkpoint tensor `decoder.X` is `CodecDecoder` parameter `X`. `encoder.*` tensors (voice
cloning only) are skipped by name; any other unknown tensor, any missing `decoder.*` tensor and any wrong shape
is an error that names it. bf16 loading down-casts every F32 tensor, codebook statistics included, as the
official package does when given `dtype=torch.bfloat16`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from engine.codec.config import MODEL_TYPE, CodecConfig
from engine.codec.model import CodecDecoder
from engine.tensor_table import table_problems

PREFIX = "decoder."
IGNORED_PREFIXES = ("encoder.",)
SPEECH_TOKENIZER_DIR = "speech_tokenizer"


def expected_codec_tensor_table(config: CodecConfig) -> dict[str, tuple[int, ...]]:
    """Every `decoder.*` tensor of `speech_tokenizer/model.safetensors` with its shape (built on the meta device)."""
    with torch.device("meta"):
        decoder = CodecDecoder(config)
    return {PREFIX + name: tuple(tensor.shape) for name, tensor in decoder.state_dict().items()}


def resolve_codec_dir(path: str | Path) -> Path:
    """The folder holding the codec's config.json + model.safetensors: `path/speech_tokenizer` of a Qwen3-TTS
    checkpoint, or `path` itself when it is a standalone Qwen3-TTS-Tokenizer-12Hz folder."""
    path = Path(path)
    for candidate in (path / SPEECH_TOKENIZER_DIR, path):
        config_file = candidate / "config.json"
        if config_file.is_file():
            try:
                model_type = json.loads(config_file.read_text()).get("model_type")
            except (OSError, ValueError):
                model_type = None
            if model_type == MODEL_TYPE:
                return candidate
    raise FileNotFoundError(
        f"no 12 Hz codec found under {path}: expected {path / SPEECH_TOKENIZER_DIR / 'config.json'} "
        f"(or {path / 'config.json'}) with model_type {MODEL_TYPE!r}"
    )


def load_codec(
    dir: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> CodecDecoder:
    """Build the decoder from `dir/speech_tokenizer/{config.json, model.safetensors}` (or a standalone codec dir)."""
    codec_dir = resolve_codec_dir(dir)
    config = CodecConfig.from_dict(json.loads((codec_dir / "config.json").read_text()))
    tensors = read_checked_tensors(codec_dir, expected_codec_tensor_table(config),
                                   lambda key: not key.startswith(IGNORED_PREFIXES), PREFIX, "codec", device,
                                   dtype)  # fmt: skip
    with torch.device("meta"):
        decoder = CodecDecoder(config)
    decoder.load_state_dict(tensors, strict=True, assign=True)
    return decoder.eval().requires_grad_(False)


def read_checked_tensors(codec_dir: Path, expected: dict[str, tuple[int, ...]], keep: Callable[[str], bool],
                         prefix: str, what: str, device: str | torch.device,
                         dtype: torch.dtype) -> dict[str, Tensor]:  # fmt: skip
    """The `keep` tensors of `codec_dir/model.safetensors`, checked name by name and shape by shape against
    `expected` (checkpoint keys) before any is read, -> {module name (`prefix` removed): tensor on device}.
    A missing file or a mismatch raises with every problem listed (`what`: "codec", "encoder")."""
    weights_file = codec_dir / "model.safetensors"
    if not weights_file.is_file():
        raise FileNotFoundError(f"codec weights missing: {weights_file}")
    with safe_open(str(weights_file), framework="pt", device="cpu") as handle:
        found = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys() if keep(key)}  # noqa: SIM118
        problems = table_problems(expected, found)
        if problems:
            raise ValueError(f"{weights_file} does not match the {what} config in {codec_dir}: " + "; ".join(problems))
        return {key[len(prefix) :]: handle.get_tensor(key).to(device=device, dtype=dtype) for key in found}


def random_codec(
    config: CodecConfig,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> CodecDecoder:
    """A decoder with seeded random weights, made directly on `device` (no CPU copy of a full-size model).

    The scales keep every branch alive (layer scales and ConvNeXt gammas ~0.2, not the trained-from-scratch
    1e-2 / 1e-6, so the transformer and the convolutions' histories visibly shape the output) and give a
    waveform of std ~0.1-0.3 that is rarely clipped. Deterministic for a given (seed, device type).
    """
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.device("meta"):
        decoder = CodecDecoder(config)
    final_conv = f"decoder.{len(config.upsample_rates) + 2}.conv.weight"
    tensors = {
        name: _random_tensor(name, tuple(param.shape), generator, device, final_conv).to(dtype)
        for name, param in decoder.state_dict().items()
    }
    decoder.load_state_dict(tensors, strict=True, assign=True)
    return decoder.eval().requires_grad_(False)


def _random_tensor(
    name: str, shape: tuple[int, ...], generator: torch.Generator, device: torch.device, final_conv: str
) -> Tensor:
    def normal(std: float, mean: float = 0.0) -> Tensor:
        return torch.randn(shape, generator=generator, device=device) * std + mean

    def uniform(low: float, high: float) -> Tensor:
        return torch.rand(shape, generator=generator, device=device) * (high - low) + low

    leaf = name.rsplit(".", 1)[-1]
    if leaf == "cluster_usage":
        return uniform(0.5, 2.0)
    if leaf == "embedding_sum":
        return normal(1.0)
    if leaf in ("alpha", "beta"):  # SnakeBeta logs
        return normal(0.2)
    if leaf in ("scale", "gamma"):  # LayerScale, ConvNeXt gamma
        return uniform(0.1, 0.3)
    if leaf == "bias":
        return normal(0.02) if "norm" not in name else normal(0.05)
    if len(shape) == 1:  # RMSNorm / LayerNorm weights
        return normal(0.05, mean=1.0)
    if _is_transposed_conv(name):  # ConvTranspose1d [in, out, k]: each output sums in * k / stride terms
        in_channels, _, kernel = shape
        return normal(1.0 / math.sqrt(in_channels * max(1, kernel // 2)))
    fan_in = math.prod(shape[1:])  # Linear [out, in], Conv1d [out, in / groups, k]
    gain = 1.0
    if name.endswith("conv2.conv.weight"):
        gain = 0.4  # residual branches of the vocoder: without this the std doubles per block
    elif name == final_conv:
        gain = 0.15  # bring the waveform to std ~0.2 so the final clamp rarely bites
    return normal(gain / math.sqrt(fan_in))


def _is_transposed_conv(name: str) -> bool:
    return (name.startswith("upsample.") and ".0.conv." in name) or (
        name.startswith("decoder.") and ".block.1.conv." in name
    )

