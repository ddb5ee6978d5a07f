"""Write a synthetic Qwen2-style byte-level BPE tokenizer (vocab.json, merges.txt, tokenizer_config.json).

One promise: a deterministic tokenizer directory that the official loader treats exactly like the real
Qwen3-TTS one: base vocabulary of 151 643 entries (over the 100 000 threshold of transformers' Mistral
regex check), ids 0..255 = the 256 bytes in GPT-2 order ("\\n" = 198), "assistant" = 77091, "user" = 872,
added tokens at their real ids 151643..151673 (`<tts_pad>` 151671, `<tts_text_bos>` 151672,
`<tts_text_eod>` 151673). Merges are learned by the `tokenizers` BPE trainer from a small built-in corpus
so that camelCase words, combining marks, CJK and emoji get multi-byte tokens (which makes the
pre-tokenizer regex visible in the ids); the remaining ids are unreachable filler entries.
Runs in the oracle venv (uses only `tokenizers`).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

BASE_VOCAB_SIZE = 151_643
ASSISTANT_ID, USER_ID = 77_091, 872
QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# (content, special) for ids 151643.. in order; names beyond the documented ones are placeholders.
ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
]

CORPUS_LINES = [
    "assistant\n",
    "user\n",
    "<|im_start|>assistant\nHello world.<|im_end|>\n",
    "The quick brown fox jumps over the lazy dog. Hello, world! How are you today?",
    "iPhone iPad MacBook camelCase getHTTPResponse XMLHttpRequest JavaScript TypeScript OpenAI",
    "Please speak calmly and warmly, like a friendly narrator reading a bedtime story.",
    "naïve café résumé coöperate Zürich Größe Übermaß façade piñata",
    "नमस्ते दुनिया हिन्दी भाषा",
    "q\u0301 x\u0308 n\u0303o\u0300",
    "مرحبا بالعالم",
    "Привет, мир! Как дела?",
    "你好，世界。今天天气很好！我们一起去公园散步吧。",
    "こんにちは、世界。カタカナとひらがな。",
    "안녕하세요 세계",
    "I ❤️ emoji 😀👍🏽 🎉🎉 and flags 🇺🇸",
    "In 2024, 3.14159 and 1,000,000 people... wait?! (yes) — “quoted” 'single'",
    "don't we'll they're I'm you've it's",
    "tabs\tand  double  spaces\n\nnew paragraph\r\n",
    "x²+y²=z² ½ ¼ № ™",
]


def bytes_to_unicode_order() -> list[int]:
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    return printable + [b for b in range(256) if b not in printable]


def byte_unicode_map() -> dict[int, str]:
    order = bytes_to_unicode_order()
    extra = 0
    out: dict[int, str] = {}
    for b in order:
        if (
            b in range(ord("!"), ord("~") + 1)
            or b in range(ord("¡"), ord("¬") + 1)
            or b in range(ord("®"), 256)
        ):
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def train_merges() -> tuple[list[str], list[tuple[str, str]]]:
    """Learned tokens (in merge order) and merges, from the built-in corpus."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=4000,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [line for line in CORPUS_LINES for _ in range(8)]
    corpus += [
        line.replace("assistant", "assistant assistant") for line in CORPUS_LINES[:3] for _ in range(30)
    ]
    tok.train_from_iterator(corpus, trainer=trainer)
    data = json.loads(tok.to_str())
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in data["model"]["merges"]]
    learned = ["".join(m) for m in merges]
    return learned, merges  # type: ignore[return-value]


def write_tokenizer(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    byte_map = byte_unicode_map()
    order = bytes_to_unicode_order()
    vocab: dict[str, int] = {byte_map[b]: i for i, b in enumerate(order)}
    learned, merges = train_merges()
    for needed in ("assistant", "user"):
        if needed not in learned:
            raise RuntimeError(
                f"synthetic tokenizer: the trainer did not learn {needed!r}; enlarge the corpus"
            )
    fixed = {"assistant": ASSISTANT_ID, "user": USER_ID}
    next_id = 256
    taken = set(vocab.values()) | set(fixed.values())
    for token in learned:
        if token in vocab:
            continue
        if token in fixed:
            vocab[token] = fixed[token]
            continue
        while next_id in taken:
            next_id += 1
        vocab[token] = next_id
        taken.add(next_id)
    free = (i for i in range(BASE_VOCAB_SIZE) if i not in taken)
    for filler_index, token_id in enumerate(free):
        vocab[f"<|filler_{filler_index}|>"] = token_id
    if sorted(vocab.values()) != list(range(BASE_VOCAB_SIZE)):
        raise RuntimeError("synthetic tokenizer: vocabulary ids are not 0..151642")
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (directory / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8"
    )
    added = {
        str(BASE_VOCAB_SIZE + i): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, (content, special) in enumerate(ADDED_TOKENS)
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [c for c, s in ADDED_TOKENS if s and c not in ("<|endoftext|>",)],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (directory / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8"
    )
