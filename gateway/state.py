"""What every request handler shares: settings, metrics, the engine pool, tokenizer, voices, drain state."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.ipc.messages import Ready
from engine.text import TextTokenizer
from engine.voice_store import VoiceStore
from gateway.engines import EnginePool, EngineUnavailable
from gateway.metrics import GatewayMetrics
from gateway.model_source import ModelSource, load_tokenizer
from gateway.settings import Settings
from gateway.voices import ServedVoices

if TYPE_CHECKING:
    from gateway.session import Session


@dataclass
class GatewayState:
    settings: Settings
    metrics: GatewayMetrics
    pool: EnginePool
    source: ModelSource
    draining: bool = False
    sessions: set[Session] = field(default_factory=set)
    http_streams: int = 0
    http_idle: asyncio.Event = field(default_factory=asyncio.Event)
    _tokenizer: TextTokenizer | None = None
    _store: VoiceStore | None = None

    def __post_init__(self) -> None:
        self.http_idle.set()

    @property
    def tokenizer(self) -> TextTokenizer:
        """Loaded on first use (after the first Ready: a `--download` engine has fetched the files by then)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.source, self.settings)
        return self._tokenizer

    def engine_info(self) -> Ready:
        info = self.pool.info
        if info is None:
            raise EngineUnavailable("engine_unavailable", "no engine is ready yet; try again shortly")
        return info

    def voices(self) -> ServedVoices:
        """The voices the served model speaks with (gateway/voices.py: the one resolver every route uses);
        EngineUnavailable before any engine said Ready."""
        info = self.engine_info()
        if self._store is None and self.settings.voices_dir:
            self._store = VoiceStore(self.settings.voices_dir)
        return ServedVoices(info.speakers, self.settings.model, self._store, info.model_type,
                            info.takes_instructions)  # fmt: skip

    @contextlib.contextmanager
    def http_stream(self) -> Iterator[None]:
        """Counts live HTTP synthesis responses so a drain can wait for them."""
        self.http_streams += 1
        self.http_idle.clear()
        try:
            yield
        finally:
            self.http_streams -= 1
            if self.http_streams == 0:
                self.http_idle.set()
