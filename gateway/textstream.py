"""Streamed text to stable token ids: only text that later input cannot change is tokenized.

Qwen2's byte-level BPE pre-tokenizer never joins a letter or digit with a following space or
punctuation mark into one pre-token, but it does attach a space or punctuation mark to the word
that follows it (" world", ",Hello"), and a word is only complete once something follows it. So
the stable prefix ends where the last run of non-word characters before the trailing word begins:
"Hello wor" releases "Hello" and holds " wor"; "Hello, world " releases "Hello, world" and holds
" ". Tokenizing released pieces one by one gives the ids of tokenizing the whole text at once.
`flush()` and the end of text release the rest. (Runs of CJK characters without punctuation are
one pre-token, so they wait for punctuation, a flush or the end.)
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Protocol


class Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class Piece:
    ids: tuple[int, ...]
    chars: int  # characters of text these ids cover (the engine's length model counts them)


def _is_word_char(char: str) -> bool:
    # Combining marks count as word characters: NFC normalisation may fuse them with the letter.
    return char.isalnum() or unicodedata.category(char).startswith("M")


def stable_split(text: str) -> int:
    """Index where the held-back tail starts (0: nothing is stable yet)."""
    end = len(text)
    while end > 0 and _is_word_char(text[end - 1]):
        end -= 1  # skip the trailing, possibly incomplete, word
    while end > 0 and not _is_word_char(text[end - 1]):
        end -= 1  # and the spaces/punctuation before it, which may attach to it
    return end


class TextStream:
    """Pending text of one context; returns the pieces that became stable.

    `forbidden` strings (the tokenizer's special-token strings such as "<|im_end|>") are refused
    with ValueError even when split across appends: they would break the prompt layout. Leading
    line breaks of the whole text are dropped (they would merge with the prompt's "assistant\n").
    """

    def __init__(self, tokenizer: Encoder, forbidden: tuple[str, ...] = ()) -> None:
        self._tokenizer = tokenizer
        self._forbidden = forbidden
        self._overlap = max((len(s) for s in forbidden), default=1) - 1
        self._tail = ""  # last characters received, to catch a forbidden string split across appends
        self._pending = ""
        self._started = False  # whether any text was released
        self.chars_received = 0

    @property
    def pending(self) -> str:
        return self._pending

    def append(self, text: str) -> Piece | None:
        window = self._tail + text
        found = [s for s in self._forbidden if s in window]
        if found:
            raise ValueError(f"text contains reserved token string(s) {found}")
        self._tail = window[-self._overlap :] if self._overlap else ""
        self.chars_received += len(text)
        self._pending += text
        cut = stable_split(self._pending)
        return self._release(cut)

    def flush(self) -> Piece | None:
        """Release everything, including a word that may still be growing."""
        return self._release(len(self._pending))

    def _release(self, cut: int) -> Piece | None:
        stable, self._pending = self._pending[:cut], self._pending[cut:]
        if not self._started:
            stable = stable.lstrip("\r\n")
        if not stable:
            return None
        self._started = True
        return Piece(tuple(self._tokenizer.encode(stable)), len(stable))
