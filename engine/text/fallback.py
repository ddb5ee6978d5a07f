"""The fallback text tokenizer for random-weight models shipped without tokenizer files.

One promise: a fixed, documented, dependency-free mapping from text to ids that live in the same id space
as the real Qwen2 vocabulary, so a random-weight model (preset `tiny`, `--load-format dummy`) gets
deterministic, reversible ids without any tokenizer files:

- text is NFC-normalised (as the Qwen2 tokenizer does), then split on the special-token strings below;
- each special string maps to its real id (`<|im_start|>` -> 151644, ...);
- every other UTF-8 byte b maps to the id the Qwen2 byte-level vocabulary gives the single byte b: ids
  0..255 in GPT-2's `bytes_to_unicode` order (printable bytes first), so "\\n" -> 198 exactly as in the
  real vocabulary. No merges are applied: one id per byte.

There is no word "assistant" / "user" in this vocabulary; `TextTokenizer` writes the role ids (77091, 872)
directly when it builds the role templates.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping

QWEN2_SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<tts_pad>": 151671,
    "<tts_text_bos>": 151672,
    "<tts_text_eod>": 151673,
}


def byte_level_order() -> list[int]:
    """Bytes in the order GPT-2 / Qwen2 byte-level BPE numbers its 256 single-byte tokens."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    return printable + [b for b in range(256) if b not in printable]


class ByteFallback:
    """UTF-8 bytes -> ids 0..255 (Qwen2 byte order); special strings -> their real ids."""

    def __init__(self, special_tokens: Mapping[str, int] | None = None) -> None:
        self.special_tokens = dict(QWEN2_SPECIAL_TOKENS if special_tokens is None else special_tokens)
        order = byte_level_order()
        self._id_of_byte = {b: i for i, b in enumerate(order)}
        self._byte_of_id = dict(enumerate(order))
        self._string_of_special = {v: k for k, v in self.special_tokens.items()}
        pattern = "|".join(re.escape(s) for s in sorted(self.special_tokens, key=len, reverse=True))
        self._split = re.compile(f"({pattern})") if pattern else None

    def encode(self, text: str) -> list[int]:
        text = unicodedata.normalize("NFC", text)
        pieces = self._split.split(text) if self._split else [text]
        ids: list[int] = []
        for piece in pieces:
            if piece in self.special_tokens:
                ids.append(self.special_tokens[piece])
            else:
                ids.extend(self._id_of_byte[b] for b in piece.encode("utf-8"))
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        out = bytearray()
        for i in ids:
            i = int(i)
            if i in self._byte_of_id:
                out.append(self._byte_of_id[i])
            elif i in self._string_of_special:
                out += self._string_of_special[i].encode("utf-8")
            else:
                raise ValueError(f"id {i} is not in the fallback tokenizer's vocabulary")
        return out.decode("utf-8", errors="replace")
