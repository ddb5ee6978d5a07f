"""Only the two modules a saved voice needs: the Base model's speaker encoder and its codec encoder.

One promise: `load_voice_encoders(source, ...)` returns a speaker encoder and a codec encoder whose weights
equal, bit for bit, those `load_model(source, voice_models=True, ...)` gives with the same arguments, without
building the talker, the code predictor or the codec decoder:

- From a checkpoint (official layout): only the `speaker_encoder.*` tensors of `model.safetensors` are read,
  and of a sharded checkpoint (`model.safetensors.index.json`) only the shards the index names for them;
  their table is checked against the config first (every missing, misshapen or unexpected
  `speaker_encoder.*` tensor named at once). The codec encoder reads only the `encoder.*` tensors of
  `speech_tokenizer/model.safetensors` (`engine.codec.encoder_weights`).
- Random weights (presets, `load_format="dummy"`): `load_model` fills the talker, the code predictor and then
  the speaker encoder from one seeded generator, so the speaker encoder's values depend on how much the
  fills before it drew. They are replayed, the same in-place fill on a tensor of the same shape and dtype,
  into one scratch buffer the size of the largest such tensor (the talker's shapes come from a build on the
  meta device, which allocates nothing): memory is one tensor instead of the whole model, and the generator
  stands where `load_model`'s stood. The codec encoder has its own generator (`random_codec_encoder`).

A model without a speaker encoder (CustomVoice, VoiceDesign) gives `speaker_encoder=None`, as `load_model`
does; `compute_voice` refuses it (wrong_model).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from engine.codec.encoder import CodecEncoder
from engine.codec.encoder_weights import load_codec_encoder, random_codec_encoder
from engine.model.config import ModelConfig
from engine.model.speaker_encoder import SpeakerEncoder
from engine.model.weights import (
    INDEX_FILE,
    LOAD_FORMATS,
    WEIGHTS_FILE,
    CheckpointError,
    expected_tensor_table,
    fill_random,
    model_config,
)
from engine.tensor_table import table_problems

PREFIX = "speaker_encoder."


@dataclass(frozen=True)
class VoiceEncoders:
    """What `engine.voice_store.compute_voice` reads of a model: its config and its two encoders."""

    config: ModelConfig
    speaker_encoder: SpeakerEncoder | None
    codec_encoder: CodecEncoder | None


def load_voice_encoders(
    source: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    load_format: str = "auto",
    download: bool = False,
    codec_dtype: torch.dtype | None = None,
    seed: int = 0,
) -> VoiceEncoders:
    """The encoders of `source` (arguments as `load_model`'s, which they equal)."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"unknown load_format {load_format!r}; choose one of {LOAD_FORMATS}")
    device = torch.device(device)
    codec_dtype = codec_dtype or torch.float32
    config, root = model_config(source, load_format=load_format, download=download, voice_models=True)
    speaker: SpeakerEncoder | None = None
    codec: CodecEncoder | None = None
    if config.random_weights:
        if config.speaker_encoder is not None:
            speaker = _random_speaker_encoder(config, device, dtype, seed)
        if config.codec_encoder is not None:
            codec = random_codec_encoder(config.codec_encoder, device=device, dtype=codec_dtype, seed=seed)
    else:
        assert root is not None
        if config.speaker_encoder is not None:
            speaker = _checkpoint_speaker_encoder(config, root, device, dtype)
        if config.codec_encoder is not None:
            codec = load_codec_encoder(root, device=device, dtype=codec_dtype)
    return VoiceEncoders(config=config, speaker_encoder=speaker, codec_encoder=codec)


# ---------------------------------------------------------------- from a checkpoint


def _checkpoint_speaker_encoder(
    config: ModelConfig, root: Path, device: torch.device, dtype: torch.dtype
) -> SpeakerEncoder:
    assert config.speaker_encoder is not None
    with torch.device("meta"):
        encoder = SpeakerEncoder(config.speaker_encoder)
    expected = {PREFIX + k: tuple(t.shape) for k, t in encoder.state_dict().items()}
    files = speaker_encoder_files(root)
    found: dict[str, tuple[int, ...]] = {}
    for path, keys in files.items():
        with safe_open(str(path), framework="pt") as handle:
            found.update({key: tuple(handle.get_slice(key).get_shape()) for key in keys})
    problems = table_problems(expected, found)
    if problems:
        raise CheckpointError(
            f"the speaker encoder tensors of {root} do not match {root / 'config.json'}: "
            + "; ".join(problems)
        )
    # Copied into freshly allocated parameters, as load_model does: a tensor viewing the file's buffer may
    # be aligned differently, and the CPU kernels then round differently (the x-vector would differ).
    encoder = encoder.to(dtype=dtype).to_empty(device=device)
    targets = encoder.state_dict(prefix=PREFIX, keep_vars=True)
    with torch.no_grad():
        for path, keys in files.items():
            with safe_open(str(path), framework="pt", device=str(device)) as handle:
                for key in keys:
                    targets[key].copy_(handle.get_tensor(key))  # casts to `dtype`
    return encoder.eval().requires_grad_(False)


def speaker_encoder_files(root: Path) -> dict[Path, list[str]]:
    """{weights file: its `speaker_encoder.*` keys}: the one `model.safetensors` (its header only is read),
    or the shards `model.safetensors.index.json` maps those keys to; other shards are never opened."""
    single, index = root / WEIGHTS_FILE, root / INDEX_FILE
    if single.is_file():
        with safe_open(str(single), framework="pt") as handle:
            return {single: [k for k in handle.keys() if k.startswith(PREFIX)]}  # noqa: SIM118
    if not index.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_FILE} or {INDEX_FILE} in {root}")
    weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
    files: dict[Path, list[str]] = {}
    for key, shard in sorted(weight_map.items()):
        if key.startswith(PREFIX):
            files.setdefault(root / shard, []).append(key)
    missing = sorted(str(p.name) for p in files if not p.is_file())
    if missing:
        raise FileNotFoundError(
            f"{index} maps the speaker encoder to missing shard file(s): {', '.join(missing)}"
        )
    return files


# ---------------------------------------------------------------- random weights


def _random_speaker_encoder(
    config: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int
) -> SpeakerEncoder:
    """`load_model`'s random speaker encoder: the fills before it replayed into a scratch buffer."""
    assert config.speaker_encoder is not None
    table = list(expected_tensor_table(config).items())  # checkpoint order, as load_model fills
    before = [(name, shape) for name, shape in table if not name.startswith(PREFIX)]
    if [name for name, _ in table[len(before) :]] != [name for name, _ in table if name.startswith(PREFIX)]:
        raise AssertionError("the speaker encoder's tensors must come last in the checkpoint order")
    generator = torch.Generator(device=device).manual_seed(seed)
    scratch = torch.empty(max(math.prod(s) for _, s in before), dtype=dtype, device=device)
    with torch.no_grad():
        for name, shape in before:
            fill_random(name, scratch[: math.prod(shape)].view(shape), generator)
        del scratch
        with torch.device("meta"):
            encoder = SpeakerEncoder(config.speaker_encoder)
        encoder = encoder.to(dtype=dtype).to_empty(device=device)
        for name, tensor in encoder.state_dict(prefix=PREFIX, keep_vars=True).items():
            fill_random(name, tensor, generator)
    return encoder.eval().requires_grad_(False)
