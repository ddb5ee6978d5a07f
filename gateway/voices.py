"""Voice and language names users may send, resolved onto what the engine serves.

The engine's `Ready` message lists its speakers and languages (lower case). Users may also send
OpenAI's voice names (Pipecat and others refuse any other name client-side), mapped here onto the
nine CustomVoice speakers, English speakers for the neutral names. Matching is case-insensitive.
Languages may also be given as ISO 639-1 codes (`en`, `zh-CN`, ...).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.compat.languages import ISO_639_1, iso_language

OPENAI_VOICES: dict[str, str] = {
    "alloy": "ryan",
    "ash": "aiden",
    "ballad": "eric",
    "coral": "serena",
    "echo": "aiden",
    "fable": "dylan",
    "onyx": "uncle_fu",
    "nova": "vivian",
    "sage": "sohee",
    "shimmer": "serena",
    "verse": "ryan",
    "marin": "ono_anna",
    "cedar": "aiden",
}
DEFAULT_VOICE = "ryan"
DEFAULT_LANGUAGE = "auto"


class UnknownName(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def resolve_voice(name: str, speakers: Sequence[str]) -> str:
    if not speakers:  # a Base model: it speaks with saved voices, which requests cannot name here yet
        raise UnknownName(
            "unknown_voice",
            f"unknown voice {name[:64]!r}: this model has no built-in voices, and speaking with saved voices "
            "is not available through the gateway yet",
        )
    key = name.strip().lower()
    if key in speakers:
        return key
    mapped = OPENAI_VOICES.get(key)
    if mapped is not None and mapped in speakers:
        return mapped
    raise UnknownName(
        "unknown_voice",
        f"unknown voice {name[:64]!r}; voices: {', '.join(speakers)} (or an OpenAI voice name: "
        f"{', '.join(OPENAI_VOICES)})",
    )


def resolve_language(name: str, languages: Sequence[str]) -> str:
    """A language name the engine serves, "auto", or an ISO 639-1 code for one (gateway/compat/languages.py)."""
    key = name.strip().lower()
    if key in languages or key == DEFAULT_LANGUAGE:
        return key
    mapped = iso_language(key)
    if mapped is not None and mapped in languages:
        return mapped
    raise UnknownName(
        "unknown_language",
        f"unknown language {name[:64]!r}; languages: {', '.join(languages)}, or their ISO 639-1 codes "
        f"({', '.join(code for code, lang in ISO_639_1.items() if lang in languages)})",
    )


def default_voice(speakers: Sequence[str]) -> str:
    """"ryan", else the first speaker; "" for a model without built-in voices (the engine then refuses the
    request with its reason)."""
    if not speakers:
        return ""
    return DEFAULT_VOICE if DEFAULT_VOICE in speakers else speakers[0]
