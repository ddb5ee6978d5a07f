"""Our tokenizer gives the official loader's ids, including its local-directory pre-tokenizer rule."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.text import TextTokenizer
from tests.parity.conftest import Reference

pytestmark = pytest.mark.parity
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")


@pytest.fixture(scope="module")
def official(reference: Reference) -> dict:
    return reference.json("tokenization.json")


@pytest.fixture(scope="module")
def ours(reference: Reference) -> TextTokenizer:
    return TextTokenizer.from_dir(reference.checkpoint("1b7"))


def test_local_dir_load_uses_the_mistral_fix_regex_like_the_official_processor(ours: TextTokenizer) -> None:
    assert ours.pre_tokenizer == "mistral_fix"


def test_plain_text_ids_equal_the_official_processor(ours: TextTokenizer, official: dict) -> None:
    for text, ids in zip(official["texts"], official["plain"], strict=True):
        assert ours.encode(text) == ids, text


def test_target_ids_are_the_official_slice_of_the_wrapped_text(ours: TextTokenizer, official: dict) -> None:
    for text, wrapped in zip(official["texts"], official["target_wrapped"], strict=True):
        if text.startswith(("\n", "\r")):
            continue
        assert ours.target_ids(text) == wrapped[3:-5], text
        assert wrapped[:3] == [ours.im_start, ours.assistant, ours.newline]


def test_instruct_ids_equal_the_official_processor(ours: TextTokenizer, official: dict) -> None:
    for instruct, ids in zip(official["instructs"], official["instruct_wrapped"], strict=True):
        assert ours.instruct_ids(instruct) == ids, instruct


def test_stock_regex_option_equals_an_official_load_without_the_fix(
    reference: Reference, official: dict
) -> None:
    stock = TextTokenizer.from_dir(reference.checkpoint("1b7"), pre_tokenizer="qwen2")
    for text, ids in zip(official["texts"], official["stock_regex_ids"], strict=True):
        assert stock.encode(text) == ids, text


def test_the_two_regexes_really_tokenize_differently(official: dict) -> None:
    pairs = zip(official["texts"], official["plain"], official["stock_regex_ids"], strict=True)
    differing = [text for text, fixed, stock in pairs if fixed != stock]
    assert any("iPhone" in t for t in differing), "the synthetic vocabulary must make the regex trap visible"


def test_pre_tokenizer_rule_follows_the_directory_config_like_transformers(
    reference: Reference, official: dict, tmp_path: Path
) -> None:
    for name, variant in official["rule_variants"].items():
        d = tmp_path / name
        d.mkdir()
        for f in TOKENIZER_FILES:
            shutil.copy(reference.checkpoint("1b7") / f, d / f)
        if variant["config"] is not None:
            (d / "config.json").write_text(json.dumps(variant["config"]))
        ours = TextTokenizer.from_dir(d)
        for text, ids in zip(official["texts"], variant["ids"], strict=True):
            assert ours.encode(text) == ids, (name, text)


def test_model_loader_tokenizes_with_the_checkpoint_tokenizer(reference: Reference, official: dict) -> None:
    model = reference.model("ckpt-1b7")
    assert not model.tokenizer.is_fallback
    for text, wrapped in zip(official["texts"][:5], official["target_wrapped"][:5], strict=True):
        assert model.tokenizer.target_ids(text) == wrapped[3:-5]
