"""Shared codec fixtures: seeded random decoders (built once per session) and a single-thread torch.

The codec tests run many tiny ops; with two threads on a busy 2-core CI machine, OpenMP contention makes each
small op ~20x slower, so this package runs torch single-threaded and restores the setting afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from engine.codec.config import codec_preset
from engine.codec.model import CodecDecoder
from engine.codec.weights import random_codec
from tests.codec.helpers import hybrid_config


@pytest.fixture(scope="package", autouse=True)
def single_thread_torch() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny() -> CodecDecoder:
    return random_codec(codec_preset("tiny"), seed=11)


@pytest.fixture(scope="session")
def tiny64() -> CodecDecoder:
    return random_codec(codec_preset("tiny"), dtype=torch.float64, seed=11)


@pytest.fixture(scope="session")
def full() -> CodecDecoder:
    return random_codec(codec_preset("full"), seed=5)


@pytest.fixture(scope="session")
def hybrid() -> CodecDecoder:
    return random_codec(hybrid_config(), seed=7)
