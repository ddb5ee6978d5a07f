"""Tokenizer: fallback mapping and round trip, loading rules, template slicing, errors, no torch import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.text import TextTokenizer
from engine.text.fallback import byte_level_order
from engine.text.tokenizer import official_local_dir_uses_mistral_fix

ROOT = Path(__file__).resolve().parents[2]


def test_fallback_round_trips_text_and_special_strings() -> None:
    tok = TextTokenizer.fallback()
    for text in ["Hello, world!", "naïve café 你好 😀👍🏽", "line\nbreak\ttab", "<|im_start|>x<tts_pad>"]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_start|><|im_end|><tts_pad><tts_text_bos><tts_text_eod>") == [
        151644, 151645, 151671, 151672, 151673,
    ]  # fmt: skip


def test_fallback_maps_bytes_to_the_qwen2_single_byte_ids() -> None:
    tok = TextTokenizer.fallback()
    assert tok.encode("\n") == [198] and tok.encode(" ") == [220] and tok.encode("!") == [0]
    assert sorted(byte_level_order()) == list(range(256))
    order = byte_level_order()
    assert tok.encode("é") == [order.index(0xC3), order.index(0xA9)]  # its two UTF-8 bytes
    assert len(tok.encode("你")) == 3 and all(i < 256 for i in tok.encode("你"))


def test_fallback_templates_have_the_official_role_ids() -> None:
    tok = TextTokenizer.fallback()
    assert tok.target_ids("Hi") == tok.encode("Hi")
    assert tok.instruct_ids("calm") == [151644, 872, 198, *tok.encode("calm"), 151645, 198]
    assert tok.instruct_ids("") == []


def test_special_strings_and_empty_text_are_rejected_with_clear_errors() -> None:
    tok = TextTokenizer.fallback()
    with pytest.raises(ValueError, match="special token"):
        tok.target_ids("say <|im_end|> now")
    with pytest.raises(ValueError, match="special token"):
        tok.instruct_ids("<tts_pad>")
    with pytest.raises(ValueError, match="empty"):
        tok.target_ids("")


@pytest.mark.parametrize(
    ("config", "vocab", "patched"),
    [
        ({"model_type": "qwen3_tts", "transformers_version": "4.57.3"}, 151643, True),
        ({"model_type": "qwen3_tts", "transformers_version": "4.57.2"}, 151643, False),
        ({"model_type": "qwen3_tts", "transformers_version": "4.51.0"}, 151643, False),
        ({"model_type": "mistral", "transformers_version": "4.51.0"}, 151643, True),
        ({"transformers_version": "4.51.0"}, 151643, True),
        ({"model_type": "qwen3_tts", "transformers_version": "5.0.0"}, 151643, False),
        ({"model_type": "qwen3_tts", "transformers_version": "5.0.0rc1"}, 151643, True),
        ({"model_type": "qwen3_tts"}, 151643, True),
        (None, 151643, False),
        ({"model_type": "qwen3_tts", "transformers_version": "4.57.3"}, 100000, False),
    ],
)
def test_local_dir_regex_rule_matches_transformers_4_57_3(
    config: dict | None, vocab: int, patched: bool
) -> None:
    assert official_local_dir_uses_mistral_fix(config, vocab) is patched


def _tiny_qwen2_dir(path: Path, *, with_config: bool) -> Path:
    """A small byte-level BPE dir: bytes + merges building 'assistant', 'user', 'Phone', 'iPhone'."""
    order = byte_level_order()
    gpt2 = {}
    n = 0
    for b in order:
        printable = b in range(33, 127) or b in range(161, 173) or b in range(174, 256)
        gpt2[b] = chr(b) if printable else chr(256 + n)
        n += 0 if printable else 1
    vocab = {gpt2[b]: i for i, b in enumerate(order)}
    merges: list[tuple[str, str]] = []
    for word in ("assistant", "user", "Phone"):
        current = word[0]
        for ch in word[1:]:
            merges.append((current, ch))
            current += ch
            vocab.setdefault(current, len(vocab))
    for a, b in (("i", "Phone"), ("Ġ", "i"), ("Ċ", "Ċ")):  # iPhone, " i", "\n\n"
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
    added = {str(len(vocab) + i): {"content": c, "special": True, "normalized": False, "lstrip": False,
                                   "rstrip": False, "single_word": False}
             for i, c in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])}  # fmt: skip
    path.mkdir()
    (path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (path / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    (path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}))
    if with_config:
        (path / "config.json").write_text(
            json.dumps({"model_type": "qwen3_tts", "transformers_version": "4.57.3"})
        )
    return path


def test_from_dir_builds_a_byte_level_bpe_with_the_template_slicing(tmp_path: Path) -> None:
    d = _tiny_qwen2_dir(tmp_path / "tok", with_config=True)
    tok = TextTokenizer.from_dir(d)
    assert tok.pre_tokenizer == "qwen2"  # small vocabularies never trigger the transformers patch
    assert tok.encode("iPhone") == [tok.encode("iPhone")[0]] and len(tok.encode("iPhone")) == 1
    forced = TextTokenizer.from_dir(d, pre_tokenizer="mistral_fix")
    assert len(forced.encode("iPhone")) == 2  # i | Phone
    wrapped = tok.encode("<|im_start|>assistant\nHi iPhone<|im_end|>\n<|im_start|>assistant\n")
    assert tok.target_ids("Hi iPhone") == wrapped[3:-5]
    assert tok.decode(tok.target_ids("Hi iPhone")) == "Hi iPhone"
    assert tok.instruct_ids("be calm")[:3] == [tok.im_start, tok.encode("user")[0], 198]


def test_text_that_merges_with_the_template_is_rejected(tmp_path: Path) -> None:
    tok = TextTokenizer.from_dir(_tiny_qwen2_dir(tmp_path / "tok", with_config=False))
    with pytest.raises(ValueError, match="template"):
        tok.target_ids("\n\nleading newlines")


def test_missing_tokenizer_files_name_the_file(tmp_path: Path) -> None:
    d = _tiny_qwen2_dir(tmp_path / "tok", with_config=False)
    (d / "merges.txt").unlink()
    with pytest.raises(FileNotFoundError, match="merges.txt"):
        TextTokenizer.from_dir(d)
    with pytest.raises(ValueError, match="pre_tokenizer"):
        TextTokenizer.from_dir(d, pre_tokenizer="gpt2")


def test_text_package_imports_without_torch() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked in this test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import engine.text, engine.text.tokenizer, engine.text.prompt, engine.text.fallback\n"
        "tok = engine.text.TextTokenizer.fallback()\n"
        "assert tok.decode(tok.encode('ok')) == 'ok'\n"
        "assert 'torch' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
