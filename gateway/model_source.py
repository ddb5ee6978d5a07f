"""Where the served model's files are, checked before any engine starts (torch-free).

`--model` is the preset `tiny`, a checkpoint directory, or a Hugging Face id looked up in the local
Hugging Face cache. Missing weights without `--download` stop the gateway with a message that says
how to fix it; the gateway itself only ever reads the tokenizer files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.text import TextTokenizer
from gateway.settings import Settings

PRESETS = ("tiny",)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
TOKENIZER_FILES = ("vocab.json", "merges.txt")


class ModelMissing(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class ModelSource:
    name: str  # what the user asked for
    directory: Path | None  # the checkpoint directory, when there is one on disk

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


def locate_model(settings: Settings) -> ModelSource:
    """Find the model's files, or raise ModelMissing with instructions (never downloads)."""
    name = settings.model
    if settings.fake_engine or name in PRESETS:
        return ModelSource(name, None)
    path = Path(name).expanduser()
    if path.is_dir():
        return ModelSource(name, path)
    snapshot = _hub_snapshot(name) if name.count("/") == 1 else None
    if snapshot is not None and (
        settings.load_format == "dummy" or any((snapshot / f).exists() for f in WEIGHT_FILES)
    ):
        return ModelSource(name, snapshot)
    if settings.download or settings.load_format == "dummy":
        return ModelSource(name, None)  # the engine fetches (or builds random) weights; tokenizer found later
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
    if settings.fake_engine or source.name in PRESETS or settings.load_format == "dummy":
        return TextTokenizer.fallback()
    raise ModelMissing(
        f"model {source.name!r} has no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {directory}"
    )
