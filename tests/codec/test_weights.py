"""Loading the official speech_tokenizer layout by name; random weights; the tensor table."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.codec.config import codec_preset
from engine.codec.model import CodecDecoder
from engine.codec.weights import expected_codec_tensor_table, load_codec, random_codec
from tests.codec.helpers import random_codes


def write_checkpoint(root: Path, decoder: CodecDecoder, *, extra: dict | None = None, drop: str = "") -> Path:
    """The official layout: root/speech_tokenizer/{config.json, model.safetensors} with decoder.* and encoder.*."""
    folder = root / "speech_tokenizer"
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {
        f"decoder.{k}": v.contiguous() for k, v in decoder.state_dict().items() if f"decoder.{k}" != drop
    }
    tensors["encoder.encoder.layers.0.conv.weight"] = torch.zeros(4, 1, 7)  # voice-cloning only: ignored
    tensors.update(extra or {})
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(decoder.config.to_dict()))
    return root


def test_full_tensor_table_is_the_released_one():
    table = expected_codec_tensor_table(codec_preset("full"))
    assert len(table) == 271
    assert sum(math.prod(shape) for shape in table.values()) == 114_323_137
    assert table["decoder.decoder.1.block.1.conv.weight"] == (1536, 768, 16)  # transposed conv [in, out, k]
    assert table["decoder.quantizer.rvq_first.vq.layers.0._codebook.embedding_sum"] == (2048, 256)
    assert table["decoder.quantizer.rvq_rest.vq.layers.14._codebook.cluster_usage"] == (2048,)
    assert table["decoder.pre_transformer.layers.7.self_attn.q_proj.weight"] == (1024, 512)
    assert table["decoder.upsample.1.1.gamma"] == (1024,)
    assert table["decoder.decoder.6.conv.weight"] == (1, 96, 7)
    assert all(name.startswith("decoder.") for name in table)


def test_loaded_checkpoint_decodes_exactly_like_the_saved_model(tmp_path, tiny):
    loaded = load_codec(write_checkpoint(tmp_path, tiny), device="cpu", dtype=torch.float32)
    codes = random_codes(1, 9, seed=1)
    assert torch.equal(loaded.decode(codes), tiny.decode(codes))
    standalone = load_codec(tmp_path / "speech_tokenizer")  # a Qwen3-TTS-Tokenizer-12Hz folder works too
    assert torch.equal(standalone.decode(codes), tiny.decode(codes))


def test_bf16_load_down_casts_every_tensor_codebook_statistics_included(tmp_path, tiny):
    loaded = load_codec(write_checkpoint(tmp_path, tiny), dtype=torch.bfloat16)
    assert {p.dtype for p in loaded.state_dict().values()} == {torch.bfloat16}
    usage = loaded.state_dict()["quantizer.rvq_rest.vq.layers.3._codebook.cluster_usage"]
    assert torch.equal(
        usage, tiny.state_dict()["quantizer.rvq_rest.vq.layers.3._codebook.cluster_usage"].bfloat16()
    )


def test_missing_misshapen_and_unknown_tensors_are_named(tmp_path, tiny):
    missing = "decoder.pre_transformer.layers.1.mlp.up_proj.weight"
    with pytest.raises(ValueError, match=rf"1 missing tensor\(s\): {missing}"):
        load_codec(write_checkpoint(tmp_path / "a", tiny, drop=missing))
    wrong = {"decoder.pre_conv.conv.bias": torch.zeros(5)}
    with pytest.raises(ValueError, match=r"decoder.pre_conv.conv.bias: file \(5,\), expected \(64,\)"):
        load_codec(write_checkpoint(tmp_path / "b", tiny, extra=wrong))
    with pytest.raises(ValueError, match="unexpected tensor.*decoder.extra.weight"):
        load_codec(write_checkpoint(tmp_path / "c", tiny, extra={"decoder.extra.weight": torch.zeros(1)}))
    with pytest.raises(FileNotFoundError, match="no 12 Hz codec"):
        load_codec(tmp_path / "nowhere")


def test_random_codec_is_deterministic_per_seed_and_differs_across_seeds(tiny):
    again = random_codec(codec_preset("tiny"), seed=11)
    other = random_codec(codec_preset("tiny"), seed=12)
    codes = random_codes(1, 3, seed=2)
    assert torch.equal(again.decode(codes), tiny.decode(codes))
    assert not torch.allclose(other.decode(codes), tiny.decode(codes))
    assert not any(p.requires_grad for p in tiny.parameters())
