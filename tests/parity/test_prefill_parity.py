"""Prefill rows and trailing text rows equal the official ones for every speaker/language/instruct/layout."""

from __future__ import annotations

import json

import pytest
import torch

from engine.model.generate import embed_prefill, embed_trailing
from engine.text import PromptIds, TextTokenizer, build_prefill
from tests.parity.conftest import Reference

pytestmark = pytest.mark.parity


@pytest.mark.parametrize("size", ["1b7", "0b6"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_prefill_rows_equal_the_official_rows(reference: Reference, size: str, dtype: torch.dtype) -> None:
    ckpt = reference.checkpoint(size)
    variants = reference.json(f"prefill-{size}.json")
    official = reference.tensors(f"prefill-{size}.safetensors")
    model = reference.model(f"ckpt-{size}", dtype)
    ids = PromptIds.from_config(json.loads((ckpt / "config.json").read_text()))
    tokenizer = TextTokenizer.from_dir(ckpt)
    tag = "fp32" if dtype == torch.float32 else "bf16"
    assert len(variants) >= 40
    for k, v in enumerate(variants):
        text_ids = v["input_ids"][3:-5]
        assert tokenizer.target_ids(v["text"]) == text_ids
        if v["instruct_ids"]:
            assert tokenizer.instruct_ids(v["instruct"]) == v["instruct_ids"]
        prefill = build_prefill(
            ids, speaker=v["speaker"], language=v["language"], text_ids=text_ids,
            instruct_ids=v["instruct_ids"], streaming=v["streaming"],
        )  # fmt: skip
        where = f"variant {k}: {v['speaker']}/{v['language']}/instruct={bool(v['instruct'])}/streaming={v['streaming']}"
        assert len(prefill.rows) == v["prefill_len"], where
        rows = embed_prefill(model, prefill)
        assert rows.dtype == dtype, where
        torch.testing.assert_close(rows.float(), official[f"{k}.{tag}.rows"], rtol=0, atol=0, msg=where)
        trailing, _pad = embed_trailing(model, prefill)
        torch.testing.assert_close(
            trailing.float(), official[f"{k}.{tag}.trailing"], rtol=0, atol=0, msg=where
        )
