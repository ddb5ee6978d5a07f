"""Voice and language names users may send, resolved onto what the served model speaks with.

One rule for every route (OpenAI, native WebSocket, ElevenLabs, Cartesia): `ServedVoices.pick` turns the
name a request sends (or none) into a `Voice`, the speaker or saved voice its `Submit` carries, or raises
`UnknownName` with a code and a message listing what is offered.

- A CustomVoice model (its engine's `Ready` lists speakers) speaks with its built-in speakers. Users may
  also send OpenAI's voice names (Pipecat and others refuse any other name client-side), mapped here onto
  the nine CustomVoice speakers, English speakers for the neutral names. Saved voices belong to Base
  models and are not offered.
- A Base model (no built-in speakers) speaks with the saved voices of `--voices-dir` that were computed for
  the served model (`VoiceInfo.model_id` equals the gateway's `--model`, as the engines check). A saved
  voice may carry an OpenAI voice name (`alloy`), so clients that allow only those names can use it. There
  is no default voice: a request must name one. Base models take no instructions (the official
  `generate_voice_clone` has none): `check_instructions` refuses them (`instructions_not_supported`), as it
  does for the 0.6B CustomVoice model, whose instructions the official wrapper drops (`Ready.takes_instructions`).
- A VoiceDesign model speaks with the voice its request's instructions describe: `check_instructions`
  requires them (`missing_instructions`), and any `voice` sent is ignored (`pick` gives `Voice()`).

The kind comes from the engine's `Ready.model_type` (an older engine's "" counts as CustomVoice when it
lists speakers, as Base when it lists none).

Names match case-insensitively. The store is read at each resolution (one small `voice.json`), so a voice
saved or deleted a moment ago is seen at once. Languages may also be given as ISO 639-1 codes (`en`,
`zh-CN`, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.voice_store import NAME_PATTERN, VoiceStore, VoiceStoreError
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
CUSTOM_VOICE, BASE, VOICE_DESIGN = "custom_voice", "base", "voice_design"  # `tts_model_type`s served
VOICE_KINDS = {CUSTOM_VOICE: "built_in", BASE: "saved", VOICE_DESIGN: "described"}  # what `voice_kind` says


class UnknownName(ValueError):
    """What a request named (or left out) does not fit the served model: `code` is the stable error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Voice:
    """What one request speaks with: a built-in speaker (CustomVoice) or a saved voice (Base), never both;
    neither for a VoiceDesign model (its voice is the request's instructions)."""

    speaker: str = ""  # Submit.speaker
    saved: str = ""  # Submit.voice: the saved voice's name in the shared store

    @property
    def name(self) -> str:
        return self.saved or self.speaker


class ServedVoices:
    """The voices the served model offers, and the one place a requested name is resolved."""

    def __init__(
        self, speakers: Sequence[str], model_id: str, store: VoiceStore | None, model_type: str = "",
        takes_instructions: bool = True,
    ) -> None:
        """`model_type`: the engine's `Ready.model_type`; "" infers it from `speakers` (older engines).
        `takes_instructions`: the engine's `Ready.takes_instructions` (False for the 0.6B models)."""
        self.speakers = tuple(speakers)
        self.model_id = model_id
        self.store = store
        self.model_type = model_type or (CUSTOM_VOICE if self.speakers else BASE)
        self.takes_instructions = takes_instructions

    @property
    def saved_only(self) -> bool:
        """A Base model: its voices are the saved voices made for it."""
        return self.model_type == BASE

    @property
    def described(self) -> bool:
        """A VoiceDesign model: the voice is described in words (the instructions); `voice` is ignored."""
        return self.model_type == VOICE_DESIGN

    @property
    def voice_kind(self) -> str:
        """What `GET /v1/audio/voices` reports: "built_in", "saved" or "described"."""
        return VOICE_KINDS.get(self.model_type, "built_in")

    def names(self) -> list[str]:
        """Every name a request may send as its voice (OpenAI aliases of built-ins aside; none for VoiceDesign)."""
        if self.described:
            return []
        return self.saved_names() if self.saved_only else list(self.speakers)

    def saved_names(self) -> list[str]:
        """The saved voices this model speaks with (none for a CustomVoice model, or without a store)."""
        if not self.saved_only or self.store is None:
            return []
        names = []
        for name in self.store.names():
            try:
                if self.store.info(name).model_id == self.model_id:
                    names.append(name)
            except VoiceStoreError:  # deleted meanwhile, or unreadable: not offered
                continue
        return names

    def openai_aliases(self) -> dict[str, str]:
        """OpenAI voice name -> the voice it speaks with, for the names that resolve."""
        if self.saved_only:
            return {name: name for name in self.saved_names() if name in OPENAI_VOICES}
        if self.described:
            return {}
        return {name: speaker for name, speaker in OPENAI_VOICES.items() if speaker in self.speakers}

    def default(self) -> Voice | None:
        """"ryan", else the first speaker; None for a Base model (a request must name a saved voice);
        `Voice()` for a VoiceDesign model."""
        if self.saved_only:
            return None
        if self.described:
            return Voice()
        return Voice(speaker=DEFAULT_VOICE if DEFAULT_VOICE in self.speakers else self.speakers[0])

    def pick(self, name: str | None, fallback: Voice | None = None) -> Voice:
        """`name` resolved; without one, `fallback`, else the model's default; UnknownName when none fits. A
        saved fallback is checked again (it may have been deleted since it was chosen). A VoiceDesign model
        ignores the name: `Voice()`."""
        if self.described:
            return Voice()
        if name is not None:
            return self.resolve(name)
        voice = fallback or self.default()
        if voice is not None and voice.saved:
            return self.resolve(voice.saved)
        if voice is None:
            raise UnknownName("missing_voice", f"this model speaks with saved voices only: name one as the voice "
                                               f"({self._saved_offer()})")  # fmt: skip
        return voice

    def resolve(self, name: str) -> Voice:
        """`name` as the voice it speaks with (ignored by a VoiceDesign model: `Voice()`); UnknownName if none."""
        if self.described:
            return Voice()
        key = name.strip().lower()
        if self.saved_only:
            return Voice(saved=self._saved(key, name))
        if key in self.speakers:
            return Voice(speaker=key)
        mapped = OPENAI_VOICES.get(key)
        if mapped is not None and mapped in self.speakers:
            return Voice(speaker=mapped)
        raise UnknownName(
            "unknown_voice",
            f"unknown voice {name[:64]!r}; voices: {', '.join(self.speakers)} (or an OpenAI voice name: "
            f"{', '.join(OPENAI_VOICES)})",
        )

    def check_instructions(self, instructions: str, *, protocol: str = "") -> None:
        """UnknownName when `instructions` do not fit the served model: a VoiceDesign model needs them
        (`missing_instructions`), a Base model takes none (`instructions_not_supported`). `protocol`: the
        name of a compatible protocol with no field for them, named in the VoiceDesign message."""
        if self.described and not instructions.strip():
            if protocol:
                raise UnknownName("missing_instructions", f"this server's VoiceDesign model speaks with a voice "
                                                          f"described in words, and {protocol} requests cannot carry "
                                                          f"a description; use POST /v1/audio/speech "
                                                          f"(instructions) or vivace.speech.v1 (session.update or "
                                                          f"context.create instructions)")  # fmt: skip
            raise UnknownName("missing_instructions", "this VoiceDesign model speaks with a voice described in "
                                                      "words: send the description as instructions (the voice "
                                                      "is ignored)")  # fmt: skip
        if self.saved_only and instructions:
            raise UnknownName("instructions_not_supported", "a Base model takes no instructions: it speaks as the "
                                                            "saved voice was recorded (leave instructions out)")  # fmt: skip
        if not self.takes_instructions and instructions:
            raise UnknownName("instructions_not_supported", f"the served model ({self.model_id}) takes no "
                                                            "instructions: the 0.6B models ignore them in the "
                                                            "official release (leave instructions out, or serve "
                                                            "the 1.7B model)")  # fmt: skip

    def _saved(self, key: str, name: str) -> str:
        if self.store is None:
            raise UnknownName("unknown_voice", f"unknown voice {name[:64]!r}: this model has no built-in voices "
                                               "and this server keeps no saved voices (start it with --voices-dir)")  # fmt: skip
        if NAME_PATTERN.fullmatch(key) is None:
            raise UnknownName("unknown_voice", f"unknown voice {name[:64]!r}; {self._saved_offer()}")
        try:
            info = self.store.info(key)
        except VoiceStoreError as error:
            detail = self._saved_offer() if error.code == "not_found" else str(error)
            raise UnknownName("unknown_voice", f"unknown voice {name[:64]!r}; {detail}") from None
        if info.model_id != self.model_id:
            raise UnknownName("unknown_voice", f"voice {key!r} was saved for model {info.model_id!r}; this server "
                                               f"serves {self.model_id!r} ({self._saved_offer()})")  # fmt: skip
        return key

    def _saved_offer(self) -> str:
        names = self.saved_names()
        listed = f"saved voices: {', '.join(names)}" if names else "no voice is saved for this model yet"
        return f"{listed}; save one with POST /v1/audio/voices"


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
