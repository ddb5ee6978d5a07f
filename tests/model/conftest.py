"""Shared fixtures: one seeded tiny random-weight model per test session (built once, ~1 s)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from engine.model.qwen3_tts import Qwen3TTS
from engine.model.weights import load_model


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny matrices gain nothing from threads, and threads contend on shared CI cores; restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_model() -> Qwen3TTS:
    return load_model("tiny")
