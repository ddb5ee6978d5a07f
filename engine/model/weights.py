"""Build a Qwen3TTS: official checkpoint weights by name, or seeded random weights made on the device.

Sources: a checkpoint directory; a Hugging Face repo id resolved from the local HF cache (the network
only with `download=True`); or a preset name (`tiny`, `1.7b`, `0.6b`) for random weights. Random weights
(`load_format="dummy"`) of a released checkpoint's id need no files at all: its preset gives the shapes.
Loading checks the whole `model.safetensors` table first and fails naming every missing tensor,
wrong shape and unexpected extra tensor (every tensor of the file must be consumed). Modules are
built on the meta device and materialised directly on the target device, so a full-size model never
has a CPU copy. Random weights (`load_format="dummy"`, presets) are filled in place with a seeded
generator on that device: deterministic per (seed, device type), never zero, scaled so activations
stay O(1) through every layer; such models use the length model instead of EOS (generate.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from engine.codec.encoder_weights import load_codec_encoder, random_codec_encoder
from engine.codec.weights import load_codec, random_codec
from engine.model.config import ModelConfig, load_config, preset
from engine.model.layers import RotaryEmbedding
from engine.model.presets import CHECKPOINT_PRESETS, PRESETS
from engine.model.qwen3_tts import Qwen3TTS
from engine.tensor_table import table_problems
from engine.text.tokenizer import TextTokenizer

LOAD_FORMATS = ("auto", "safetensors", "dummy")
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")


class CheckpointError(ValueError):
    """A checkpoint whose tensors do not match its config."""


def expected_tensor_table(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of `model.safetensors` (official key -> shape) for this config."""
    with torch.device("meta"):
        model = Qwen3TTS(config, codec=None, tokenizer=None)
    return {name: tuple(t.shape) for name, t in model.checkpoint_tensors()}


def load_model(
    source: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    load_format: str = "auto",
    download: bool = False,
    codec_dtype: torch.dtype | None = None,
    seed: int = 0,
    voice_models: bool = False,
) -> Qwen3TTS:
    """Load a model for inference. `codec_dtype` defaults to float32 (cleaner audio than the official bf16
    codec; pass `dtype` to reproduce the official bf16 run). `seed` seeds random weights only.
    `voice_models=True` also loads Base (speaker encoder included) and VoiceDesign checkpoints."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"unknown load_format {load_format!r}; choose one of {LOAD_FORMATS}")
    device = torch.device(device)
    codec_dtype = codec_dtype or torch.float32
    config, root = model_config(source, load_format=load_format, download=download, voice_models=voice_models)
    if config.random_weights:
        tokenizer = _tokenizer(root, config) if root is not None else None
        return _random_model(config, device, dtype, codec_dtype, seed, tokenizer=tokenizer)
    assert root is not None
    tokenizer = _tokenizer(root, config)
    model = _materialise(config, device, dtype, tokenizer, codec=None)
    _load_checkpoint(model, root)
    model.codec = load_codec(root, device=device, dtype=codec_dtype)
    if config.codec_encoder is not None:
        model.codec_encoder = load_codec_encoder(root, device=device, dtype=codec_dtype)
    return model


def model_config(
    source: str | Path, *, load_format: str = "auto", download: bool = False, voice_models: bool = False
) -> tuple[ModelConfig, Path | None]:
    """The config to build and the checkpoint directory it came from (None: a preset, no files).

    Presets are random weights. With `load_format="dummy"` a directory or a locally cached checkpoint
    gives its config and tokenizer; a known Hugging Face id that is not cached gives its preset's exact
    shapes (`CHECKPOINT_PRESETS`): random weights never download anything.
    """
    name = str(source)
    if name.lower() in PRESETS and not Path(name).exists():
        return preset(name), None
    if load_format == "dummy":
        root = _local_checkpoint_dir(source)
        if root is None and name in CHECKPOINT_PRESETS:
            return dataclasses.replace(preset(CHECKPOINT_PRESETS[name]), source=name), None
        if root is None:
            known = ", ".join([*sorted(PRESETS), *CHECKPOINT_PRESETS])
            raise FileNotFoundError(
                f"--load-format dummy needs the model's shapes: {name!r} is neither a checkpoint directory, "
                f"a locally cached Hugging Face checkpoint nor a known model ({known})"
            )
        return dataclasses.replace(load_config(root, voice_models=voice_models), random_weights=True), root
    root = resolve_checkpoint_dir(source, download=download)
    return load_config(root, voice_models=voice_models), root


def _local_checkpoint_dir(source: str | Path) -> Path | None:
    """A checkpoint directory with a config, or the local HF cache's snapshot of a repo id; never downloads."""
    try:
        root = resolve_checkpoint_dir(source, download=False)
    except FileNotFoundError:
        return None
    complete = (root / "config.json").is_file() and (root / "speech_tokenizer" / "config.json").is_file()
    return root if complete else None


def resolve_checkpoint_dir(source: str | Path, *, download: bool = False) -> Path:
    """A local directory as is; otherwise a HF repo id from the local cache (or fetched when download)."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists() or str(source).startswith((".", "/")) or str(source).count("/") != 1:
        raise FileNotFoundError(
            f"model source {str(source)!r} is neither a checkpoint directory, a Hugging Face repo id "
            f"(owner/name) nor a preset ({', '.join(sorted(PRESETS))})"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(str(source), local_files_only=not download))
    except LocalEntryNotFoundError as error:
        raise FileNotFoundError(
            f"{source} is not in the local Hugging Face cache; download it first or pass download=True "
            f"(--download)"
        ) from error


def _tokenizer(root: Path, config: ModelConfig) -> TextTokenizer:
    if all((root / f).is_file() for f in TOKENIZER_FILES):
        return TextTokenizer.from_dir(root)
    return TextTokenizer.fallback(config.prompt_ids)


# ---------------------------------------------------------------- materialising modules


def _materialise(
    config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    tokenizer: TextTokenizer | None,
    codec: torch.nn.Module | None,
) -> Qwen3TTS:
    """Modules on the meta device -> uninitialised storage on `device` (nothing touches the CPU)."""
    with torch.device("meta"):
        model = Qwen3TTS(config, codec=None, tokenizer=None)
    model = model.to(dtype=dtype).to_empty(device=device)
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.reset_inv_freq()  # fp32 table, recomputed on the device
    model.codec = codec
    model.tokenizer = tokenizer or TextTokenizer.fallback(config.prompt_ids)
    return model.eval().requires_grad_(False)


def _random_model(
    config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    codec_dtype: torch.dtype,
    seed: int,
    tokenizer: TextTokenizer | None,
) -> Qwen3TTS:
    codec = random_codec(config.codec, device=device, dtype=codec_dtype, seed=seed)
    model = _materialise(config, device, dtype, tokenizer, codec)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.checkpoint_tensors():
            fill_random(name, tensor, generator)
    if config.codec_encoder is not None:
        model.codec_encoder = random_codec_encoder(
            config.codec_encoder, device=device, dtype=codec_dtype, seed=seed
        )
    return model


def fill_random(name: str, tensor: Tensor, generator: torch.Generator) -> None:
    """In-place init that keeps activations O(1): unit-variance Linear outputs, O(1) embeddings. Public for
    `engine.model.voice_encoders`, which replays these fills to reproduce the speaker encoder's values."""
    if name.endswith("norm.weight"):
        tensor.uniform_(0.5, 1.5, generator=generator)
    elif name.endswith(".bias"):
        tensor.normal_(0.0, 0.02, generator=generator)
    elif "embedding" in name:
        tensor.normal_(0.0, 1.0, generator=generator)
    else:  # Linear [out, in]
        tensor.normal_(0.0, 1.0 / math.sqrt(tensor.shape[1]), generator=generator)


# ---------------------------------------------------------------- loading a checkpoint


def _weight_files(root: Path) -> list[Path]:
    single, index = root / WEIGHTS_FILE, root / INDEX_FILE
    if single.is_file():
        return [single]
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (root / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names missing shard file(s): {', '.join(missing)}")
        return [root / s for s in shards]
    raise FileNotFoundError(f"no {WEIGHTS_FILE} or {INDEX_FILE} in {root}")


def _load_checkpoint(model: Qwen3TTS, root: Path) -> None:
    targets = dict(model.checkpoint_tensors())
    files = _weight_files(root)
    found: dict[str, tuple[int, ...]] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                found[key] = tuple(handle.get_slice(key).get_shape())
    _check_table({k: tuple(t.shape) for k, t in targets.items()}, found, root)
    device = next(iter(targets.values())).device
    for path in files:
        with safe_open(str(path), framework="pt", device=str(device)) as handle:
            for key in handle.keys():  # noqa: SIM118
                targets[key].copy_(handle.get_tensor(key))  # casts to the model dtype on the device


def _check_table(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], root: Path) -> None:
    problems = table_problems(expected, found)
    if problems:
        raise CheckpointError(
            f"{root / WEIGHTS_FILE} does not match {root / 'config.json'}: " + "; ".join(problems)
        )
