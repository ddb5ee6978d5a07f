"""Saved voices on disk: one directory per voice under a root, published and removed atomically.

One promise: a voice that `VoiceStore.save` returned is, from then on and across restarts and processes,
either wholly there (its `voice.json`, `embedding.safetensors` and reference audio) or, after `delete`,
wholly gone; a reader never sees a half-written voice. Layout under the root:

    <name>/voice.json               the index entry: name, voice_id (new on every save), model_id, audio
                                    file, bytes, duration, sample rate, transcript, frames, created_at
    <name>/embedding.safetensors    "speaker" [H] float32 (the x-vector), "ref_codes" [K,16] int64 when
                                    a transcript was given (in-context cloning)
    <name>/reference.<ext>          the uploaded audio as received

`save` builds the directory under a hidden staging name (`voice.json` written to a temp file, fsynced and
`os.replace`d into place) and publishes it with one `os.rename`; a name that exists is refused, never
overwritten. `delete` renames the directory to a hidden trash name, then removes it. Names are lower-case
`[a-z0-9][a-z0-9_-]*`, at most 64 characters; a hidden entry (leading dot) is never a voice. Limits
(`VoiceLimits`): reference duration, audio bytes, number of voices, total bytes; the count and total are
checked at save, so two processes saving at once may pass them by one voice each.

`compute_voice` turns decoded float PCM + rate into the stored tensors with a Base model's speaker encoder
(and its codec encoder when a transcript is given), from a whole model or from its encoders alone
(`engine.model.voice_encoders`). Metadata operations import neither torch nor numpy,
so a torch-free process (the gateway) may list, read and delete voices; tensors need torch.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor

    from engine.model.qwen3_tts import Qwen3TTS
    from engine.model.voice_encoders import VoiceEncoders

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
AUDIO_EXTENSION = re.compile(r"[a-z0-9]{1,8}")
INDEX_FILE = "voice.json"
TENSOR_FILE = "embedding.safetensors"
FORMAT_VERSION = 1


class VoiceStoreError(ValueError):
    """A voice operation refused; `code` says why: bad_name, reserved, exists, not_found, bad_audio,
    too_long, too_short, too_large, too_many, full, corrupt, wrong_model."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class VoiceLimits:
    max_voices: int = 200
    max_audio_bytes: int = 10 * 1024 * 1024  # one upload
    max_total_bytes: int = 1024 * 1024 * 1024  # everything under the root
    min_seconds: float = 1.0
    max_seconds: float = 30.0


@dataclass(frozen=True)
class VoiceInfo:
    """One voice's index entry (`voice.json`)."""

    name: str
    voice_id: str  # changes on every save: a reader's cache key
    model_id: str  # the model whose encoders computed the tensors
    audio_file: str
    audio_bytes: int
    duration_s: float
    sample_rate: int
    embedding_dim: int
    transcript: str | None = None
    ref_frames: int | None = None  # reference code frames (in-context cloning), None without a transcript
    created_at: float = 0.0
    format: int = FORMAT_VERSION

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> VoiceInfo:
        try:
            info = cls(**data)
        except TypeError as error:
            raise VoiceStoreError("corrupt", f"{where}: not a voice index entry ({error})") from None
        if info.format != FORMAT_VERSION:
            raise VoiceStoreError("corrupt", f"{where}: format {info.format}, this build reads {FORMAT_VERSION}")
        return info


@dataclass(frozen=True)
class ComputedVoice:
    """What `compute_voice` derives from the reference: the x-vector, and codes when a transcript is given."""

    embedding: Tensor  # [H] float32
    ref_codes: Tensor | None  # [K,16] int64
    duration_s: float
    sample_rate: int


def check_name(name: str, reserved: frozenset[str] | set[str] | tuple[str, ...] = ()) -> str:
    """`name` if it may name a saved voice, else VoiceStoreError (bad_name / reserved)."""
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        raise VoiceStoreError("bad_name", f"voice name {name!r} must match [a-z0-9][a-z0-9_-]* (at most 64 characters)")
    if name in reserved:
        raise VoiceStoreError("reserved", f"{name!r} is a built-in voice of this model; choose another name")
    return name


class VoiceStore:
    def __init__(self, root: str | Path, limits: VoiceLimits = VoiceLimits()) -> None:  # noqa: B008
        self.root = Path(root)
        self.limits = limits
        self.root.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ reading

    def names(self) -> list[str]:
        """Every published voice, sorted."""
        return sorted(p.name for p in self.root.iterdir()
                      if NAME_PATTERN.fullmatch(p.name) and (p / INDEX_FILE).is_file())  # fmt: skip

    def info(self, name: str) -> VoiceInfo:
        check_name(name)
        path = self.root / name / INDEX_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise VoiceStoreError("not_found", f"no saved voice {name!r}") from None
        try:
            data = json.loads(raw)
        except ValueError as error:
            raise VoiceStoreError("corrupt", f"{path}: {error}") from None
        return VoiceInfo.from_json(data, str(path))

    def tensors(self, name: str) -> tuple[VoiceInfo, Tensor, Tensor | None]:
        """-> (index entry, x-vector [H] float32, reference codes [K,16] int64 or None), read together: a
        tensor file from another save than the index entry is refused (corrupt)."""
        from safetensors import safe_open

        info = self.info(name)
        path = self.root / name / TENSOR_FILE
        try:
            with safe_open(str(path), framework="pt") as f:
                if (f.metadata() or {}).get("voice_id") != info.voice_id:
                    raise VoiceStoreError("corrupt", f"{path} belongs to another save of {name!r}")
                embedding = f.get_tensor("speaker")
                codes = f.get_tensor("ref_codes") if "ref_codes" in f.keys() else None  # noqa: SIM118
        except FileNotFoundError:
            raise VoiceStoreError("not_found", f"no saved voice {name!r}") from None
        if tuple(embedding.shape) != (info.embedding_dim,):
            raise VoiceStoreError("corrupt", f"{path}: speaker shape {tuple(embedding.shape)} != ({info.embedding_dim},)")
        return info, embedding, codes

    def total_bytes(self) -> int:
        return sum(f.stat().st_size for d in self.root.iterdir() if d.is_dir() for f in d.iterdir() if f.is_file())

    # ------------------------------------------------------------ writing

    def save(self, name: str, *, model_id: str, audio: bytes, audio_ext: str, voice: ComputedVoice,
             transcript: str | None = None, reserved: frozenset[str] | set[str] | tuple[str, ...] = ()) -> VoiceInfo:  # fmt: skip
        """Publish a new voice; refuses an existing name, a reserved one, and anything over the limits."""
        from safetensors.torch import save_file

        check_name(name, reserved)
        lim = self.limits
        if AUDIO_EXTENSION.fullmatch(audio_ext) is None:
            raise VoiceStoreError("bad_audio", f"audio extension {audio_ext!r} must be 1-8 lower-case letters or digits")
        if len(audio) > lim.max_audio_bytes:
            raise VoiceStoreError("too_large", f"reference audio is {len(audio)} bytes, the limit is {lim.max_audio_bytes}")
        check_duration(voice.duration_s, lim)
        if (voice.ref_codes is None) != (not transcript):
            raise ValueError("reference codes go with a transcript (in-context cloning), and only with one")
        if (self.root / name).exists():
            raise VoiceStoreError("exists", f"a voice named {name!r} exists; delete it first")
        if len(self.names()) >= lim.max_voices:
            raise VoiceStoreError("too_many", f"the store holds its limit of {lim.max_voices} voices")
        tensor_bytes = 4 * voice.embedding.numel() + (0 if voice.ref_codes is None else 8 * voice.ref_codes.numel())
        if self.total_bytes() + len(audio) + tensor_bytes > lim.max_total_bytes:
            raise VoiceStoreError("full", f"the store would exceed its limit of {lim.max_total_bytes} bytes")

        info = VoiceInfo(name=name, voice_id=uuid.uuid4().hex, model_id=model_id, audio_file=f"reference.{audio_ext}",
                         audio_bytes=len(audio), duration_s=float(voice.duration_s), sample_rate=int(voice.sample_rate),
                         embedding_dim=int(voice.embedding.shape[0]), transcript=transcript or None,
                         ref_frames=None if voice.ref_codes is None else int(voice.ref_codes.shape[0]),
                         created_at=time.time())  # fmt: skip
        staging = self.root / f".staging-{info.voice_id}"
        staging.mkdir()
        try:
            _write_file(staging / info.audio_file, audio)
            tensors = {"speaker": voice.embedding.detach().to("cpu").float().contiguous()}
            if voice.ref_codes is not None:
                tensors["ref_codes"] = voice.ref_codes.detach().to("cpu").long().contiguous()
            save_file(tensors, str(staging / TENSOR_FILE), metadata={"voice_id": info.voice_id})
            _fsync(staging / TENSOR_FILE)
            _write_atomic(staging / INDEX_FILE, json.dumps(asdict(info), indent=1).encode())
            _fsync(staging)
            try:
                os.rename(staging, self.root / name)  # fails when the name appeared meanwhile
            except OSError:
                raise VoiceStoreError("exists", f"a voice named {name!r} exists; delete it first") from None
            _fsync(self.root)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        return info

    def delete(self, name: str) -> None:
        """Remove a voice (VoiceStoreError not_found when there is none)."""
        check_name(name)
        trash = self.root / f".trash-{uuid.uuid4().hex}"
        try:
            os.rename(self.root / name, trash)
        except FileNotFoundError:
            raise VoiceStoreError("not_found", f"no saved voice {name!r}") from None
        _fsync(self.root)
        shutil.rmtree(trash, ignore_errors=True)


def check_duration(seconds: float, limits: VoiceLimits) -> None:
    if not math.isfinite(seconds) or seconds < limits.min_seconds:
        raise VoiceStoreError("too_short", f"reference audio is {seconds:.2f} s, at least {limits.min_seconds} s needed")
    if seconds > limits.max_seconds:
        raise VoiceStoreError("too_long", f"reference audio is {seconds:.2f} s, at most {limits.max_seconds} s allowed")


def compute_voice(model: Qwen3TTS | VoiceEncoders, pcm: np.ndarray, rate: int, transcript: str | None = None,
                  limits: VoiceLimits = VoiceLimits()) -> ComputedVoice:  # noqa: B008  # fmt: skip
    """Decoded mono float PCM [n] at `rate` -> the voice's tensors, with the official preprocessing
    (`speaker_embedding`: resample to 24 kHz, log-mel, speaker encoder; with a transcript also the codec
    encoder's codes of the 24 kHz reference). Refuses non-Base models and references outside the limits."""
    import numpy as np
    import torch

    from engine.model.reference_audio import SPEAKER_SAMPLE_RATE, resample
    from engine.model.speaker_encoder import speaker_embedding

    if model.speaker_encoder is None:
        raise VoiceStoreError("wrong_model", f"{model.config.source} is not a Base model: it has no speaker encoder")
    samples = np.asarray(pcm, dtype=np.float32)
    if samples.ndim != 1 or rate <= 0:
        raise VoiceStoreError("bad_audio", f"reference audio must be mono PCM at a positive rate, got {samples.shape} at {rate}")
    if not np.isfinite(samples).all():
        raise VoiceStoreError("bad_audio", "reference audio has non-finite samples")
    duration = samples.shape[0] / rate
    check_duration(duration, limits)
    embedding = speaker_embedding(model.speaker_encoder, samples, rate).float().cpu()
    codes = None
    if transcript:
        if model.codec_encoder is None:
            raise VoiceStoreError("wrong_model", f"{model.config.source} was loaded without its codec encoder")
        pcm24 = resample(samples, rate, SPEAKER_SAMPLE_RATE)
        codes = model.codec_encoder.encode(torch.from_numpy(pcm24)).long().cpu()
    return ComputedVoice(embedding=embedding, ref_codes=codes, duration_s=duration, sample_rate=rate)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_atomic(path: Path, data: bytes) -> None:
    """Write to a temp file beside `path`, fsync it, then `os.replace` it over `path`."""
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        _write_file(temp, data)
        os.replace(temp, path)
    finally:
        if temp.exists():
            temp.unlink()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
