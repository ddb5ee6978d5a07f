"""Saved voices as the executors see them: a name -> that voice's tensors on the model's device.

One promise: `VoiceBank.resolve(name)` returns the `SavedVoice` the store holds under `name` now (its
x-vector [H] in the model's device and dtype; for a voice saved with a transcript also its reference codes
[K,16] int64 on the device and the transcript's token ids, tokenized as the official reference text), or
raises ValueError saying why it cannot be used (no store, unknown name, computed by another model, wrong
width, a transcript that cannot be tokenized). Each voice is read and tokenized once per save: `resolve`
reads only the small `voice.json` and reuses the cached voice while its `voice_id` is unchanged.
`cached(name)` returns the last resolved voice without touching the disk (the engine resolves at Submit,
then uses the voice at open and prefill). `pin` adds an in-memory x-vector voice no store holds (the
engine's warm-up).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.text.tokenizer import TextTokenizer
from engine.voice_store import VoiceStore, VoiceStoreError


@dataclass(frozen=True)
class SavedVoice:
    """One voice, ready for the executors. `key` identifies this save (the store's `voice_id`): caches of
    anything derived from the voice (the codec executor's primed state) key on it."""

    key: str
    embedding: Tensor  # [H] model dtype, model device: the x-vector
    ref_codes: Tensor | None = None  # [K,16] int64, model device (voices saved with a transcript)
    ref_text_ids: tuple[int, ...] = ()  # r_1..r_R, `TextTokenizer.reference_ids` of the transcript

    @property
    def in_context(self) -> bool:
        """Whether the voice can speak in in-context mode (it has reference codes and a transcript)."""
        return self.ref_codes is not None and bool(self.ref_text_ids)


class VoiceBank:
    def __init__(self, store: VoiceStore | None, *, model_id: str, hidden: int, device: torch.device,
                 dtype: torch.dtype, tokenizer: TextTokenizer | None = None) -> None:  # fmt: skip
        """`tokenizer`: the model's text tokenizer, for transcripts (None: the executors set the model's)."""
        self.store = store
        self.model_id = model_id
        self.hidden = hidden
        self.device = device
        self.dtype = dtype
        self.tokenizer = tokenizer
        self._cache: dict[str, SavedVoice] = {}  # name -> the voice of its last save resolved
        self._pinned: dict[str, SavedVoice] = {}

    def pin(self, name: str, embedding: Tensor) -> None:
        self._pinned[name] = SavedVoice(f"pinned:{name}", self._place(embedding))

    def unpin(self, name: str) -> None:
        self._pinned.pop(name, None)

    def resolve(self, name: str) -> SavedVoice:
        pinned = self._pinned.get(name)
        if pinned is not None:
            return pinned
        if self.store is None:
            raise ValueError(f"voice {name!r}: this engine has no voice store (--voices-dir)")
        try:
            info = self.store.info(name)
            cached = self._cache.get(name)
            if cached is not None and cached.key == info.voice_id:
                return cached
            info, embedding, codes = self.store.tensors(name)
        except VoiceStoreError as error:
            raise ValueError(str(error)) from None
        if info.model_id != self.model_id:
            raise ValueError(f"voice {name!r} was computed by model {info.model_id!r}; this engine serves "
                             f"{self.model_id!r}")  # fmt: skip
        if info.embedding_dim != self.hidden:
            raise ValueError(f"voice {name!r} has a {info.embedding_dim}-wide x-vector; this model needs {self.hidden}")
        ref_text_ids: tuple[int, ...] = ()
        if codes is not None and info.transcript:
            if codes.ndim != 2 or codes.shape[0] < 1:
                raise ValueError(f"voice {name!r}: reference codes of shape {tuple(codes.shape)}, expected [K,16]")
            if self.tokenizer is None:
                raise ValueError(f"voice {name!r} has a transcript but this engine has no text tokenizer")
            try:
                ref_text_ids = tuple(self.tokenizer.reference_ids(info.transcript))
            except ValueError as error:
                raise ValueError(f"voice {name!r}: its transcript cannot be used: {error}") from None
        voice = SavedVoice(info.voice_id, self._place(embedding),
                           None if not ref_text_ids else codes.to(device=self.device, dtype=torch.int64),
                           ref_text_ids)  # fmt: skip
        self._cache[name] = voice
        return voice

    def cached(self, name: str) -> SavedVoice:
        """The voice the last `resolve(name)` returned (KeyError if it never succeeded)."""
        pinned = self._pinned.get(name)
        return pinned if pinned is not None else self._cache[name]

    def _place(self, embedding: Tensor) -> Tensor:
        return embedding.to(device=self.device, dtype=self.dtype)
