"""Where the served model's files are and what kind of model it is, checked before any engine starts.

`--model` is an engine preset (`engine/model/presets.py`, a torch-free module: `tiny`, `tiny-base`, `1.7b`,
...; matched as the engine matches them), a checkpoint directory, or a Hugging Face id looked up in the
local Hugging Face cache. Missing weights without `--download` stop the gateway with a message that says
how to fix it; the gateway itself only ever reads the tokenizer files and `config.json`.

The model's `tts_model_type` is read where it is known without the weights (a preset, the checkpoint's
`config.json`, a released checkpoint's id): a kind the engine does not serve (anything but CustomVoice,
Base and VoiceDesign) stops the gateway at once with `ModelUnsupported`, instead of a server whose every
request would fail. A kind not known yet (an id still to be downloaded) is left to the engine, which
refuses it before Ready.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.model.presets import CHECKPOINT_PRESETS, PRESETS
from engine.text import TextTokenizer
from gateway.settings import Settings

# What `python -m engine` serves (engine/executors: SERVED_MODEL_TYPES, a torch module; the gateway keeps
# its own copy, and tests/gateway/test_voice_resolution.py checks that the two agree).
SERVED_MODEL_TYPES = ("custom_voice", "base", "voice_design")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
TOKENIZER_FILES = ("vocab.json", "merges.txt")


class ModelMissing(RuntimeError):
    pass


class ModelUnsupported(RuntimeError):
    """The model is of a kind the engine does not serve."""


@dataclass(frozen=True, slots=True)
class ModelSource:
    name: str  # what the user asked for
    directory: Path | None  # the checkpoint directory, when there is one on disk
    model_type: str | None = None  # `tts_model_type` ("custom_voice", "base", "voice_design"); None: not known yet

    @property
    def has_tokenizer(self) -> bool:
        return self.directory is not None and all((self.directory / f).is_file() for f in TOKENIZER_FILES)


def _hub_snapshot(repo_id: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(repo_id, "config.json")
    return Path(found).parent if isinstance(found, str) else None


def preset_name(name: str) -> str | None:
    """The engine preset `name` selects (case-insensitive, unless a path of that name exists), or None."""
    key = name.lower()
    return key if key in PRESETS and not Path(name).exists() else None


def _config_model_type(directory: Path) -> str | None:
    try:
        value = json.loads((directory / "config.json").read_bytes()).get("tts_model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _model_type(name: str, directory: Path | None) -> str | None:
    preset = preset_name(name)
    if preset is not None:
        return str(PRESETS[preset]()[0]["tts_model_type"])
    if directory is not None and (found := _config_model_type(directory)) is not None:
        return found
    if name in CHECKPOINT_PRESETS:
        return str(PRESETS[CHECKPOINT_PRESETS[name]]()[0]["tts_model_type"])
    return None


def locate_model(settings: Settings) -> ModelSource:
    """Find the model's files, or raise ModelMissing with instructions (never downloads); ModelUnsupported
    when it is a kind the engine does not serve."""
    source = _locate(settings)
    if source.model_type is not None and source.model_type not in SERVED_MODEL_TYPES:
        raise ModelUnsupported(
            f"model {source.name!r} is a {source.model_type} model (tts_model_type {source.model_type!r}); the "
            f"engine serves only {', '.join(SERVED_MODEL_TYPES)} models, so the gateway does not start with it.\n"
            "  - CustomVoice (built-in speakers):  python -m gateway --model tiny --device cpu\n"
            "  - Base (saved voices):  python -m gateway --model tiny-base --device cpu --voices-dir DIR\n"
            "  - VoiceDesign (voices described in instructions):  python -m gateway --model tiny-voice-design "
            "--device cpu"
        )
    return source


def _locate(settings: Settings) -> ModelSource:
    name = settings.model
    if settings.fake_engine:
        return ModelSource(name, None)
    if preset_name(name) is not None:
        return ModelSource(name, None, _model_type(name, None))
    path = Path(name).expanduser()
    if path.is_dir():
        return ModelSource(name, path, _model_type(name, path))
    snapshot = _hub_snapshot(name) if name.count("/") == 1 else None
    if snapshot is not None and (
        settings.load_format == "dummy" or any((snapshot / f).exists() for f in WEIGHT_FILES)
    ):
        return ModelSource(name, snapshot, _model_type(name, snapshot))
    if settings.download or settings.load_format == "dummy":
        # The engine fetches (or builds random) weights; the tokenizer is found later.
        return ModelSource(name, None, _model_type(name, None))
    raise ModelMissing(
        f"model {name!r} is neither a directory nor in the local Hugging Face cache.\n"
        f"  - to fetch it from the Hugging Face Hub, add --download:  python -m gateway --model {name} --download\n"
        "  - to run the built-in tiny random-weight model instead:  python -m gateway --model tiny --device cpu"
    )


def load_tokenizer(source: ModelSource, settings: Settings) -> TextTokenizer:
    """The checkpoint's tokenizer; the documented byte fallback for presets and dummy weights."""
    directory = source.directory
    if directory is None and settings.download and not settings.fake_engine:
        directory = _hub_snapshot(source.name)  # the engine has downloaded it by the time it is ready
    if directory is not None and all((directory / f).is_file() for f in TOKENIZER_FILES):
        return TextTokenizer.from_dir(directory)
    if settings.fake_engine or preset_name(source.name) is not None or settings.load_format == "dummy":
        return TextTokenizer.fallback()
    raise ModelMissing(
        f"model {source.name!r} has no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {directory}"
    )
