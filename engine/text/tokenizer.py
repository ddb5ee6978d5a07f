"""Text -> token ids for the prompt, exactly as the official `qwen-tts` loader tokenizes (torch-free).

One promise: `TextTokenizer.from_dir(checkpoint_dir)` produces the ids that
`Qwen3TTSModel.from_pretrained(checkpoint_dir)` (transformers 4.57.3) produces for the same text, and
`target_ids` / `instruct_ids` slice them the way the official generate does (reference section 5.1).

How the official loader builds its tokenizer from a checkpoint directory (no `tokenizer.json` on the Hub):
`Qwen2TokenizerFast` converted from `vocab.json` + `merges.txt` -> byte-level BPE, NFC normaliser,
pre-tokenizer ``Sequence[Split(<Qwen2 regex>, isolated), ByteLevel(add_prefix_space=False, use_regex=False)]``,
added tokens from `tokenizer_config.json` (`added_tokens_decoder`, matched before pre-tokenization).

The regex trap (reference section 9.7): the processor is loaded with ``fix_mistral_regex=True``. For a
*local directory* whose base vocabulary has more than 100 000 entries, transformers 4.57.3 reads the
directory's `config.json` and, unless ``transformers_version <= 4.57.2`` (with a non-Mistral `model_type`)
or ``>= 5.0.0``, replaces ``pre_tokenizer[0]`` with its Mistral-fix split regex. Released Qwen3-TTS
checkpoints say 4.57.3, so a local-directory load uses the Mistral-fix regex: "iPhone" splits i|Phone and
combining marks stay glued to letters. Loading by hub id normally keeps the stock Qwen2 regex.
`from_dir(..., pre_tokenizer="auto")` applies the local-directory rule; "qwen2" / "mistral_fix" force one.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

from engine.text.fallback import QWEN2_SPECIAL_TOKENS, ByteFallback
from engine.text.prompt import DEFAULT_ASSISTANT_TEXT_ID, NEWLINE_TEXT_ID, PromptIds

QWEN2_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# The replacement transformers 4.57.3 installs when it suspects a Mistral tokenizer (see module docstring).
MISTRAL_FIX_SPLIT_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
MISTRAL_MODEL_TYPES = ("mistral", "mistral3", "voxtral", "ministral", "pixtral")
MISTRAL_CHECK_MIN_VOCAB = 100_000  # transformers only considers the patch above this base-vocab size
USER_TEXT_ID = 872  # "user" in the Qwen2 vocabulary (used by the fallback's instruct template)
PRE_TOKENIZER_CHOICES = ("auto", "qwen2", "mistral_fix")


def _version_tuple(text: str) -> tuple[tuple[int, ...], bool]:
    """(release numbers, is_pre_release) of a PEP 440-ish version string, enough for the comparisons below."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)(.*)", text)
    if not match:
        raise ValueError(f"unparsable transformers_version {text!r}")
    release = tuple(int(p) for p in match.group(1).split("."))
    release = release + (0,) * (3 - len(release)) if len(release) < 3 else release
    is_pre = bool(re.match(r"[.\-_]?(a|b|c|rc|alpha|beta|pre|preview|dev)", match.group(2).lower()))
    return release, is_pre


def official_local_dir_uses_mistral_fix(config_json: Mapping[str, Any] | None, base_vocab_size: int) -> bool:
    """Whether transformers 4.57.3 with ``fix_mistral_regex=True`` patches the split regex for a local dir."""
    if base_vocab_size <= MISTRAL_CHECK_MIN_VOCAB or config_json is None:
        return False
    version = config_json.get("transformers_version")
    model_type = config_json.get("model_type")
    if version:
        release, is_pre = _version_tuple(str(version))
        if release <= (4, 57, 2):
            if model_type is not None and model_type not in MISTRAL_MODEL_TYPES:
                return False
        elif release > (5, 0, 0) or (release == (5, 0, 0) and not is_pre):
            return False
    return True


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with path.open(encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def _read_merges(path: Path) -> list[tuple[str, str]]:
    """merges.txt as the slow Qwen2 tokenizer reads it: optional '#version' first line, blank lines skipped."""
    merges: list[tuple[str, str]] = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f):
            line = line.strip()
            if (i == 0 and line.startswith("#version:")) or not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ValueError(f"{path}:{i + 1}: expected two symbols per merge, got {line!r}")
            merges.append((parts[0], parts[1]))
    return merges


def _added_tokens(tokenizer_config: Mapping[str, Any]) -> list[tuple[int, AddedToken]]:
    entries = tokenizer_config.get("added_tokens_decoder") or {}
    out: list[tuple[int, AddedToken]] = []
    for key, spec in entries.items():
        out.append(
            (
                int(key),
                AddedToken(
                    spec["content"],
                    single_word=bool(spec.get("single_word", False)),
                    lstrip=bool(spec.get("lstrip", False)),
                    rstrip=bool(spec.get("rstrip", False)),
                    normalized=bool(spec.get("normalized", False)),
                    special=bool(spec.get("special", False)),
                ),
            )
        )
    return sorted(out, key=lambda item: item[0])


def _split(regex: str) -> pre_tokenizers.Split:
    return pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)


class TextTokenizer:
    """Qwen2 byte-level BPE as the official loader builds it, or the documented byte fallback."""

    def __init__(
        self,
        *,
        backend: Tokenizer | ByteFallback,
        source: str,
        pre_tokenizer: str,
        special_strings: Iterable[str],
        im_start: int,
        im_end: int,
        assistant: int = DEFAULT_ASSISTANT_TEXT_ID,
        newline: int = NEWLINE_TEXT_ID,
        user: int = USER_TEXT_ID,
    ) -> None:
        self._backend = backend
        self.source = source
        self.pre_tokenizer = pre_tokenizer  # "qwen2" | "mistral_fix" | "fallback"
        self.special_strings = tuple(sorted(set(special_strings)))
        self.im_start, self.im_end, self.assistant, self.newline, self.user = (
            im_start,
            im_end,
            assistant,
            newline,
            user,
        )
        if not self.is_fallback:
            self._check_role_templates()

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_dir(cls, path: str | Path, *, pre_tokenizer: str = "auto") -> TextTokenizer:
        """Load `vocab.json` + `merges.txt` + `tokenizer_config.json` (or `tokenizer.json`) from a checkpoint dir.

        pre_tokenizer: "auto" reproduces the official local-directory load (Mistral-fix regex when the
        directory's config.json triggers it); "qwen2" keeps the stock regex (official hub-id load);
        "mistral_fix" forces the patched regex.
        """
        if pre_tokenizer not in PRE_TOKENIZER_CHOICES:
            raise ValueError(f"pre_tokenizer must be one of {PRE_TOKENIZER_CHOICES}, got {pre_tokenizer!r}")
        root = Path(path)
        if not root.is_dir():
            raise FileNotFoundError(f"tokenizer directory {root} does not exist")
        config_path = root / "tokenizer_config.json"
        tokenizer_config = _read_json(config_path) if config_path.is_file() else {}
        tokenizer_json = root / "tokenizer.json"
        added = _added_tokens(tokenizer_config)
        if tokenizer_json.is_file():
            tok = Tokenizer.from_file(str(tokenizer_json))
        else:
            vocab_path, merges_path = root / "vocab.json", root / "merges.txt"
            missing = [p.name for p in (vocab_path, merges_path) if not p.is_file()]
            if missing:
                raise FileNotFoundError(
                    f"{root}: missing tokenizer file(s) {', '.join(missing)} (and no tokenizer.json); "
                    "use TextTokenizer.fallback() for random-weight models without tokenizer files"
                )
            vocab = {str(k): int(v) for k, v in _read_json(vocab_path).items()}
            tok = Tokenizer(
                BPE(
                    vocab=vocab,
                    merges=_read_merges(merges_path),
                    dropout=None,
                    unk_token=None,
                    continuing_subword_prefix="",
                    end_of_word_suffix="",
                    fuse_unk=False,
                    byte_fallback=False,
                )
            )
            tok.normalizer = normalizers.NFC()
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [_split(QWEN2_SPLIT_REGEX), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
            )
            tok.decoder = decoders.ByteLevel()
            tok.post_processor = processors.ByteLevel(trim_offsets=False)
        for token_id, token in added:
            tok.add_tokens([token])  # special flag travels with the AddedToken
            got = tok.token_to_id(token.content)
            if got != token_id:
                raise ValueError(
                    f"{root}: added token {token.content!r} should have id {token_id} but lands at {got}; "
                    "the vocabulary size or added-token ids are inconsistent"
                )

        model_config_path = root / "config.json"
        model_config = _read_json(model_config_path) if model_config_path.is_file() else None
        if pre_tokenizer == "auto":
            use_fix = official_local_dir_uses_mistral_fix(
                model_config, tok.get_vocab_size(with_added_tokens=False)
            )
            pre_tokenizer = "mistral_fix" if use_fix else "qwen2"
        if pre_tokenizer == "mistral_fix":
            if not isinstance(tok.pre_tokenizer, pre_tokenizers.Sequence):
                raise ValueError(
                    f"{root}: cannot apply the Mistral-fix regex to a non-Sequence pre-tokenizer"
                )
            tok.pre_tokenizer[0] = _split(MISTRAL_FIX_SPLIT_REGEX)

        def need_id(content: str) -> int:
            token_id = tok.token_to_id(content)
            if token_id is None:
                raise ValueError(f"{root}: tokenizer has no {content!r} token; not a Qwen2-style tokenizer")
            return token_id

        assistant = tok.encode("assistant", add_special_tokens=False).ids
        return cls(
            backend=tok,
            source=str(root),
            pre_tokenizer=pre_tokenizer,
            special_strings=[t.content for _, t in added],
            im_start=need_id("<|im_start|>"),
            im_end=need_id("<|im_end|>"),
            assistant=assistant[0] if len(assistant) == 1 else DEFAULT_ASSISTANT_TEXT_ID,
        )

    @classmethod
    def fallback(cls, ids: PromptIds | None = None) -> TextTokenizer:
        """Byte fallback (see `engine.text.fallback`); `ids` overrides the special ids from a config."""
        specials = dict(QWEN2_SPECIAL_TOKENS)
        if ids is not None:
            specials.update(
                {
                    "<|im_start|>": ids.im_start,
                    "<|im_end|>": ids.im_end,
                    "<tts_pad>": ids.tts_pad,
                    "<tts_text_bos>": ids.tts_bos,
                    "<tts_text_eod>": ids.tts_eos,
                }
            )
        return cls(
            backend=ByteFallback(specials),
            source="fallback",
            pre_tokenizer="fallback",
            special_strings=specials,
            im_start=specials["<|im_start|>"],
            im_end=specials["<|im_end|>"],
            assistant=ids.assistant if ids is not None else DEFAULT_ASSISTANT_TEXT_ID,
            newline=ids.newline if ids is not None else NEWLINE_TEXT_ID,
        )

    # ------------------------------------------------------------------ encoding

    @property
    def is_fallback(self) -> bool:
        return isinstance(self._backend, ByteFallback)

    @property
    def vocab_size(self) -> int:
        """Ids this tokenizer can emit are < vocab_size (base vocabulary plus added tokens)."""
        if isinstance(self._backend, ByteFallback):
            return max(self._backend.special_tokens.values()) + 1
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings inside it become their special ids (as official)."""
        if isinstance(self._backend, ByteFallback):
            return self._backend.encode(text)
        return list(self._backend.encode(text, add_special_tokens=True).ids)

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        if isinstance(self._backend, ByteFallback):
            return self._backend.decode(ids)
        return self._backend.decode(ids, skip_special_tokens=False)

    def target_ids(self, text: str) -> list[int]:
        """x_1..x_T: ids[3:-5] of ``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``.

        Raises ValueError when the text contains special-token strings, or when it merges with the role
        or suffix tokens (e.g. it starts with a newline), since the official slicing would then cut the
        wrong ids (reference section 9.8). Strip leading line breaks before calling.
        """
        self._reject_special_strings(text, "text")
        if self.is_fallback:
            ids = self.encode(text)
        else:
            ids = self._inside_template(text, "<|im_end|>\n<|im_start|>assistant\n", self._role_suffix, "text")
        if not ids:
            raise ValueError("text is empty: nothing to speak")
        return ids

    def reference_ids(self, transcript: str) -> list[int]:
        """r_1..r_R of an in-context voice's transcript: ids[3:-2] of ``<|im_start|>assistant\\n{text}<|im_end|>\\n``
        (the official `generate_voice_clone`: `_build_ref_text`, then `ref_ids[:, 3:-2]`). Same refusals as
        `target_ids` (special-token strings, merging with the template's tokens, nothing left)."""
        self._reject_special_strings(transcript, "transcript")
        if self.is_fallback:
            ids = self.encode(transcript)
        else:
            ids = self._inside_template(transcript, "<|im_end|>\n", [self.im_end, self.newline], "transcript")
        if not ids:
            raise ValueError("transcript is empty")
        return ids

    def _inside_template(self, text: str, suffix: str, suffix_ids: list[int], what: str) -> list[int]:
        """The ids of `text` in ``<|im_start|>assistant\\n{text}{suffix}``, cut as the official code cuts them
        (the 3 role ids in front, `suffix_ids` behind); ValueError when the text merges with those tokens."""
        wrapped = self.encode(f"<|im_start|>assistant\n{text}{suffix}")
        tail = len(suffix_ids)
        if wrapped[:3] != self._role_prefix or wrapped[-tail:] != suffix_ids or len(wrapped) < 3 + tail:
            raise ValueError(
                f"{what} {text[:40]!r} merges with the prompt template's tokens (leading line break?); "
                "the official slicing would misplace it"
            )
        return wrapped[3:-tail]

    def instruct_ids(self, instruct: str) -> list[int]:
        """All ids of ``<|im_start|>user\\n{instruct}<|im_end|>\\n``; empty instruction -> no ids."""
        if not instruct:
            return []
        self._reject_special_strings(instruct, "instruct")
        if self.is_fallback:
            return [self.im_start, self.user, self.newline, *self.encode(instruct), self.im_end, self.newline]
        return self.encode(f"<|im_start|>user\n{instruct}<|im_end|>\n")

    # ------------------------------------------------------------------ internals

    def _reject_special_strings(self, text: str, what: str) -> None:
        normalized = unicodedata.normalize("NFC", text)
        found = [s for s in self.special_strings if s in text or s in normalized]
        if found:
            raise ValueError(
                f"{what} contains special token string(s) {found}; they would break the prompt layout"
            )

    def _check_role_templates(self) -> None:
        self._role_prefix = self.encode("<|im_start|>assistant\n")
        self._role_suffix = self.encode("<|im_end|>\n<|im_start|>assistant\n")
        expected_prefix = [self.im_start, self.assistant, self.newline]
        if self._role_prefix != expected_prefix or len(self._role_suffix) != 5:
            raise ValueError(
                f"{self.source}: '<|im_start|>assistant\\n' tokenizes to {self._role_prefix}, expected "
                f"{expected_prefix}; not a Qwen2-style chat tokenizer"
            )
