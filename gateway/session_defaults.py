"""A session's defaults for new contexts, and the checks a client's voice/language/format/instructions pass.

`session.update` changes the defaults; `context.create` may override them for one context. Voices
are resolved by the served model's one resolver (gateway/voices.py: built-in speakers, or a Base model's
saved voices, which have no default; a VoiceDesign model ignores them), languages against what the engine
announced, Opus needs libopus on this server, and instructions must tokenize and fit the served model (a
Base model takes none; a VoiceDesign model's contexts need them, its session defaults may leave them
empty); anything else is a `ProtocolError`.
"""

from __future__ import annotations

from gateway import protocol as p
from gateway.audio import opus_available
from gateway.state import GatewayState
from gateway.voices import ServedVoices, UnknownName, Voice, resolve_language


class SessionDefaults:
    def __init__(self, state: GatewayState, voices: ServedVoices, languages: tuple[str, ...]) -> None:
        self.state = state
        self.voices = voices
        self.languages = languages
        # None: a Base model, whose requests name a saved voice; Voice() for a VoiceDesign model
        self.voice: Voice | None = voices.default()
        self.language = "auto"
        self.instructions = ""
        self.audio_format = "pcm16"
        self.sample_rate = p.SAMPLE_RATE
        self.word_timings = False  # word.timing events (approximate) for new contexts
        self.max_lead_ms: int | None = state.settings.max_lead_ms or None  # the server's --max-lead-ms

    def update(self, event: p.SessionUpdate) -> None:
        voice, language, audio_format = self.resolve(
            event.voice, event.language, event.audio_format, event.event_id
        )
        sample_rate = self.resolve_rate(event.sample_rate, audio_format, event.event_id)
        if event.instructions:  # "" clears the default (a VoiceDesign model's contexts then need their own)
            self.check_instructions(event.instructions, event.event_id, None)
        self.voice, self.language, self.audio_format = voice, language, audio_format
        self.sample_rate = sample_rate
        if event.instructions is not None:
            self.instructions = event.instructions
        if event.word_timings is not None:
            self.word_timings = event.word_timings
        if event.max_lead_ms is not None:
            self.max_lead_ms = event.max_lead_ms

    def resolve(
        self,
        voice: str | None,
        language: str | None,
        audio_format: str | None,
        event_id: str | None,
        context_id: str | None = None,
    ) -> tuple[Voice | None, str, str]:
        """The voice, language and audio format a client asked for, each defaulting to the session's (the
        voice stays None on a Base model while none was named)."""
        try:
            chosen = self.voice if voice is None else self.voices.resolve(voice)
            language = self.language if language is None else resolve_language(language, self.languages)
        except UnknownName as exc:
            raise p.ProtocolError(exc.code, str(exc), event_id=event_id, context_id=context_id) from None
        audio_format = audio_format or self.audio_format
        if audio_format == "opus" and not opus_available():
            raise p.ProtocolError(
                "opus_unavailable",
                "Opus is not available on this server (libopus missing); use pcm16",
                event_id=event_id,
                context_id=context_id,
            )
        return chosen, language, audio_format

    def context_voice(self, voice: Voice | None, event_id: str | None, context_id: str) -> Voice:
        """What a new context speaks with: `voice` (from `resolve`), else `missing_voice`."""
        try:
            return self.voices.pick(None, voice)
        except UnknownName as exc:
            raise p.ProtocolError(exc.code, str(exc), event_id=event_id, context_id=context_id) from None

    def resolve_rate(
        self, sample_rate: int | None, audio_format: str, event_id: str | None, context_id: str | None = None
    ) -> int:
        """The output rate: the one asked for, else the default (Opus is always 24 kHz here)."""
        if audio_format == "opus":
            if sample_rate not in (None, p.SAMPLE_RATE):
                raise p.ProtocolError(
                    "unsupported_sample_rate",
                    "opus is sent at 24 kHz (decoders output 48 kHz); choose a sample_rate for pcm16 only",
                    event_id=event_id,
                    context_id=context_id,
                )
            return p.SAMPLE_RATE
        return sample_rate or self.sample_rate

    def check_instructions(
        self, instructions: str, event_id: str | None, context_id: str | None
    ) -> tuple[int, ...]:
        """The instruct ids of `instructions` ("" gives none), checked against the served model."""
        try:
            self.voices.check_instructions(instructions)
        except UnknownName as exc:
            raise p.ProtocolError(exc.code, str(exc), event_id=event_id, context_id=context_id) from None
        try:
            return tuple(self.state.tokenizer.instruct_ids(instructions))
        except ValueError as exc:
            raise p.ProtocolError(
                "invalid_text", str(exc), event_id=event_id, context_id=context_id
            ) from None

    def describe(self) -> dict[str, object]:
        """The `defaults` shape of `session.created` and `session.updated`."""
        return {
            "voice": self.voice.name if self.voice is not None and self.voice.name else None,
            "language": self.language,
            "instructions": self.instructions,
            "audio": p.audio_description(
                self.audio_format, samples_per_packet=None, pre_skip=None, sample_rate=self.sample_rate
            ),
            "max_lead_ms": self.max_lead_ms,
            "word_timings": self.word_timings,
        }
