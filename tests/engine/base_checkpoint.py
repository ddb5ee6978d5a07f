"""Write a loaded Base model back to disk in the official Hugging Face layout, for loader tests.

`write_base_checkpoint(root, model, shards)` writes `config.json` (the model's preset), the
`model.safetensors` tensors (one file, or shards named by `shards`: {file: key predicate} with a
`model.safetensors.index.json`) and `speech_tokenizer/{config.json, model.safetensors}` (decoder and
encoder tensors), so `load_model(root, voice_models=True)` reads back the same weights.
`sharded_without_the_talker` writes one whose talker shard is then deleted, and
`forbid_building_the_generation_modules` makes constructing the talker, code predictor or codec decoder
raise: together they show a loader touches neither.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors.torch import save_file

from engine.codec.model import CodecDecoder
from engine.model.code_predictor import CodePredictor
from engine.model.presets import PRESETS
from engine.model.qwen3_tts import Qwen3TTS
from engine.model.talker import Talker

TALKER_SHARD = "model-00001-of-00002.safetensors"
SPEAKER_SHARD = "model-00002-of-00002.safetensors"


def forbid_building_the_generation_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: object, *args: object, **kwargs: object) -> None:
        raise AssertionError(f"{type(self).__name__} was built")

    for cls in (Talker, CodePredictor, CodecDecoder):
        monkeypatch.setattr(cls, "__init__", refuse)


def sharded_without_the_talker(root: Path, model: Qwen3TTS) -> Path:
    """A Base checkpoint sharded as talker+predictor | speaker encoder, the first shard then deleted."""
    write_base_checkpoint(root, model, shards={TALKER_SHARD: lambda k: not k.startswith("speaker_encoder."),
                                               SPEAKER_SHARD: lambda k: k.startswith("speaker_encoder.")})  # fmt: skip
    (root / TALKER_SHARD).unlink()
    return root


def write_base_checkpoint(root: Path, model: Qwen3TTS, preset: str = "tiny-base",
                          shards: dict[str, Callable[[str], bool]] | None = None) -> Path:  # fmt: skip
    assert (
        model.codec is not None and model.codec_encoder is not None and model.config.codec_encoder is not None
    )
    (root / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(PRESETS[preset]()[0]))
    tensors = {name: t.detach().clone().contiguous() for name, t in model.checkpoint_tensors()}
    if shards is None:
        save_file(tensors, str(root / "model.safetensors"))
    else:
        weight_map = {}
        for file, belongs in shards.items():
            part = {k: v for k, v in tensors.items() if belongs(k)}
            save_file(part, str(root / file))
            weight_map.update(dict.fromkeys(part, file))
        assert set(weight_map) == set(tensors), "every tensor in exactly one shard"
        (root / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map})
        )
    encoder_config = dataclasses.asdict(model.config.codec_encoder)
    encoder_config["upsampling_ratios"] = list(encoder_config["upsampling_ratios"])
    codec_config = model.config.codec.to_dict() | {
        "encoder_config": encoder_config,
        "encoder_valid_num_quantizers": model.config.codec_encoder.valid_quantizers,
    }
    (root / "speech_tokenizer" / "config.json").write_text(json.dumps(codec_config))
    codec = {"decoder." + k: v.contiguous() for k, v in model.codec.state_dict().items()}
    codec |= {"encoder." + k: v.contiguous() for k, v in model.codec_encoder.state_dict().items()}
    save_file(codec, str(root / "speech_tokenizer" / "model.safetensors"))
    return root
