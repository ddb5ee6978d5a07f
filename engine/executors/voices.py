"""Saved voices as the executors see them: a name -> that voice's x-vector on the model's device.

One promise: `VoiceBank.resolve(name)` returns the x-vector [H] (model device and dtype) of the voice the
store holds under `name` now, or raises ValueError saying why it cannot be used (no store, unknown name,
computed by another model, wrong width). Each voice's tensor file is read once per save: `resolve` reads
only the small `voice.json` and reuses the cached tensor while its `voice_id` is unchanged. `cached(name)`
returns the last resolved tensor without touching the disk (the engine resolves at Submit, then uses the
tensor at prefill). `pin` adds an in-memory voice no store holds (the engine's warm-up).
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.voice_store import VoiceStore, VoiceStoreError


class VoiceBank:
    def __init__(self, store: VoiceStore | None, *, model_id: str, hidden: int, device: torch.device,
                 dtype: torch.dtype) -> None:  # fmt: skip
        self.store = store
        self.model_id = model_id
        self.hidden = hidden
        self.device = device
        self.dtype = dtype
        self._cache: dict[str, tuple[str, Tensor]] = {}  # name -> (voice_id, x-vector on the device)
        self._pinned: dict[str, Tensor] = {}

    def pin(self, name: str, embedding: Tensor) -> None:
        self._pinned[name] = self._place(embedding)

    def unpin(self, name: str) -> None:
        self._pinned.pop(name, None)

    def resolve(self, name: str) -> Tensor:
        pinned = self._pinned.get(name)
        if pinned is not None:
            return pinned
        if self.store is None:
            raise ValueError(f"voice {name!r}: this engine has no voice store (--voices-dir)")
        try:
            info = self.store.info(name)
            cached = self._cache.get(name)
            if cached is not None and cached[0] == info.voice_id:
                return cached[1]
            info, embedding, _ = self.store.tensors(name)
        except VoiceStoreError as error:
            raise ValueError(str(error)) from None
        if info.model_id != self.model_id:
            raise ValueError(f"voice {name!r} was computed by model {info.model_id!r}; this engine serves "
                             f"{self.model_id!r}")  # fmt: skip
        if info.embedding_dim != self.hidden:
            raise ValueError(f"voice {name!r} has a {info.embedding_dim}-wide x-vector; this model needs {self.hidden}")
        tensor = self._place(embedding)
        self._cache[name] = (info.voice_id, tensor)
        return tensor

    def cached(self, name: str) -> Tensor:
        """The tensor the last `resolve(name)` returned (KeyError if it never succeeded)."""
        pinned = self._pinned.get(name)
        return pinned if pinned is not None else self._cache[name][1]

    def _place(self, embedding: Tensor) -> Tensor:
        return embedding.to(device=self.device, dtype=self.dtype)
