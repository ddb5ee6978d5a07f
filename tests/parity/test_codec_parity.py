"""Codec waveforms equal the official decoder's in fp32 (full forward and the official chunked decode)."""

from __future__ import annotations

import pytest
import torch

from engine.codec.weights import load_codec
from tests.parity.conftest import Reference, relative_l2

pytestmark = pytest.mark.parity
REL_L2 = 1e-4


@pytest.fixture(scope="module")
def codec_reference(reference: Reference) -> tuple[dict, dict[str, torch.Tensor]]:
    return reference.json("codec.json"), reference.tensors("codec.safetensors")


def test_full_decode_equals_one_official_decoder_forward(reference: Reference, codec_reference) -> None:
    meta, tensors = codec_reference
    codec = load_codec(reference.root / meta["checkpoint"], dtype=torch.float32)
    for length in meta["lengths"]:
        wav = codec.decode(tensors[f"{length}.codes"])
        assert wav.shape == (1, length * 1920) and wav.dtype == torch.float32
        assert relative_l2(wav, tensors[f"{length}.full"]) <= REL_L2, f"{length} frames"


def test_decode_official_equals_the_official_chunked_decode(reference: Reference, codec_reference) -> None:
    meta, tensors = codec_reference
    codec = load_codec(reference.root / meta["checkpoint"], dtype=torch.float32)
    assert max(meta["lengths"]) > 300, "the reference must exercise the 300/25 chunking"
    for length in meta["lengths"]:
        wav = codec.decode_official(tensors[f"{length}.codes"])
        assert wav.shape == (1, length * 1920)
        assert relative_l2(wav, tensors[f"{length}.official"]) <= REL_L2, f"{length} frames"


def test_official_chunking_really_differs_from_a_full_forward_past_300_frames(codec_reference) -> None:
    meta, tensors = codec_reference
    longest = max(meta["lengths"])
    assert relative_l2(tensors[f"{longest}.official"], tensors[f"{longest}.full"]) > 10 * REL_L2
