"""Engine test fixtures: one seeded tiny random-weight model (and one tiny Base model) per session, torch
single-threaded."""

from __future__ import annotations

import pytest
import torch

from engine.model.qwen3_tts import Qwen3TTS
from engine.model.weights import load_model


@pytest.fixture(scope="session")
def tiny_model() -> Qwen3TTS:
    torch.set_num_threads(1)  # tiny matrices: threads only add contention on shared CI cores
    return load_model("tiny")


@pytest.fixture(scope="session")
def base_model() -> Qwen3TTS:
    torch.set_num_threads(1)
    return load_model("tiny-base")
