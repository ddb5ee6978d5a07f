"""ISO 639-1 language codes (`en`, `zh`, `de`, ...) mapped onto the model's language names.

Cartesia's `language` and ElevenLabs' `language_code` are ISO 639-1 codes, sometimes with a region
(`en-US`, `pt_BR`, `zh-Hans`): the region is dropped. `resolve_language` in gateway/voices.py
accepts these codes everywhere a language may be given, so the native protocol and the OpenAI
endpoint take them too.
"""

from __future__ import annotations

ISO_639_1: dict[str, str] = {
    "zh": "chinese",
    "en": "english",
    "de": "german",
    "it": "italian",
    "pt": "portuguese",
    "es": "spanish",
    "ja": "japanese",
    "ko": "korean",
    "fr": "french",
    "ru": "russian",
}


def iso_language(code: str) -> str | None:
    """The model language for an ISO 639-1 code (region ignored), or None when it is not one we map."""
    base = code.strip().lower().replace("_", "-").split("-", 1)[0]
    return ISO_639_1.get(base)
