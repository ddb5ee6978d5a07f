"""CustomVoice prompt layout: which text id and codec id make up each prefill row, and what text follows.

One promise: `build_prefill` returns, for a speaker / language / text / optional instruction, exactly the
rows and the trailing text queue that the official `Qwen3TTSForConditionalGeneration.generate` builds
(reference section 5.3), expressed as ids so the model side can embed them. Torch-free.

Row embedding (model side): ``P(text_id) + C(codec_id)``, a ``None`` term omitted, where
``P = text_projection(text_embedding[.])`` and ``C = talker.codec_embedding[.]``.

Layout for speaker s (codec id S), explicit language L, m instruct ids u_1..u_m, text ids x_1..x_T:

    row   text_id      codec_id
    ---   ----------   ----------------
    1..m  u_i          -                 instruct rows (text only)
    +1    im_start     -                 role rows (text only)
    +2    assistant    -
    +3    "\\n" (198)   -
    +4    tts_pad      codec_think       (language "auto": codec_nothink, and no L row)
    +5    tts_pad      codec_think_bos
    +6    tts_pad      L
    +7    tts_pad      codec_think_eos
    +8    tts_pad      S                 (omitted when there is no speaker)
    +9    tts_bos      codec_pad
    streaming:      +10 x_1 codec_bos                     trailing = x_2..x_T, tts_eos
    non-streaming:  x_1..x_T codec_pad, tts_eos codec_pad,
                    tts_pad codec_bos                     trailing = tts_pad

Prefill lengths: streaming m+10 (explicit language) / m+9 (auto); non-streaming m+T+11 / m+T+10.
Dialect rule: a speaker whose `spk_is_dialect` names a dialect, asked for `chinese` or `auto`, gets that
dialect's language id in the explicit (think) form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NEWLINE_TEXT_ID = 198  # "\n" in the Qwen2 byte-level vocabulary (not stored in config.json)
DEFAULT_ASSISTANT_TEXT_ID = 77091  # "assistant"; config.json carries it as assistant_token_id
AUTO_LANGUAGE = "auto"


@dataclass(frozen=True)
class PromptIds:
    """Every id the prompt layout needs, read from the checkpoint's `config.json`."""

    tts_pad: int
    tts_bos: int
    tts_eos: int
    im_start: int
    im_end: int
    assistant: int
    newline: int
    codec_pad: int
    codec_bos: int
    codec_eos: int
    codec_think: int
    codec_nothink: int
    codec_think_bos: int
    codec_think_eos: int
    speakers: dict[str, int]  # lower-case speaker name -> codec-vocab row (speaker embedding)
    speaker_dialect: dict[str, str | None]  # lower-case speaker name -> dialect language name or None
    languages: dict[str, int]  # lower-case language name (dialects included) -> codec-vocab row

    @classmethod
    def from_config(cls, config_json: Mapping[str, Any]) -> PromptIds:
        """Read the ids from the top-level `config.json` dict (which contains `talker_config`)."""
        talker = config_json.get("talker_config")
        if not isinstance(talker, Mapping):
            raise ValueError("config.json has no 'talker_config' object; is this a Qwen3-TTS checkpoint?")

        def need(section: Mapping[str, Any], key: str, where: str) -> int:
            if key not in section:
                raise ValueError(f"config.json: missing '{where}{key}'")
            value = section[key]
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"config.json: '{where}{key}' must be an integer, got {value!r}")
            return value

        speakers = {str(k).lower(): int(v) for k, v in (talker.get("spk_id") or {}).items()}
        languages = {str(k).lower(): int(v) for k, v in (talker.get("codec_language_id") or {}).items()}
        raw_dialect = talker.get("spk_is_dialect") or {}
        speaker_dialect: dict[str, str | None] = {}
        for name in speakers:
            dialect = raw_dialect.get(name, False)
            if dialect is False or dialect is None:
                speaker_dialect[name] = None
            elif isinstance(dialect, str) and dialect.lower() in languages:
                speaker_dialect[name] = dialect.lower()
            else:
                raise ValueError(
                    f"config.json: talker_config.spk_is_dialect[{name!r}] = {dialect!r} is not a known language"
                )
        tc = "talker_config."
        return cls(
            tts_pad=need(config_json, "tts_pad_token_id", ""),
            tts_bos=need(config_json, "tts_bos_token_id", ""),
            tts_eos=need(config_json, "tts_eos_token_id", ""),
            im_start=need(config_json, "im_start_token_id", ""),
            im_end=need(config_json, "im_end_token_id", ""),
            assistant=int(config_json.get("assistant_token_id", DEFAULT_ASSISTANT_TEXT_ID)),
            newline=NEWLINE_TEXT_ID,
            codec_pad=need(talker, "codec_pad_id", tc),
            codec_bos=need(talker, "codec_bos_id", tc),
            codec_eos=need(talker, "codec_eos_token_id", tc),
            codec_think=need(talker, "codec_think_id", tc),
            codec_nothink=need(talker, "codec_nothink_id", tc),
            codec_think_bos=need(talker, "codec_think_bos_id", tc),
            codec_think_eos=need(talker, "codec_think_eos_id", tc),
            speakers=speakers,
            speaker_dialect=speaker_dialect,
            languages=languages,
        )


@dataclass(frozen=True)
class PromptRow:
    """One prefill position: embedding = P(text_id) + C(codec_id); a None term is left out."""

    text_id: int | None
    codec_id: int | None


@dataclass(frozen=True)
class Prefill:
    """Prefill rows, then the text ids fed one per decode step (tts_pad forever once exhausted)."""

    rows: tuple[PromptRow, ...]
    trailing: tuple[int, ...]


def speakers(ids: PromptIds) -> tuple[str, ...]:
    """User-facing speaker names (lower case, sorted)."""
    return tuple(sorted(ids.speakers))


def languages(ids: PromptIds) -> tuple[str, ...]:
    """User-facing languages: `auto`, then every language except the dialects (official rule), sorted."""
    return (AUTO_LANGUAGE, *sorted(name for name in ids.languages if "dialect" not in name))


def resolve_language_id(ids: PromptIds, *, speaker: str | None, language: str) -> int | None:
    """The codec language id the control rows carry (None: the `auto` / nothink form), dialect rule applied."""
    lang = language.lower()
    if lang == AUTO_LANGUAGE:
        language_id = None
    elif lang in ids.languages:
        language_id = ids.languages[lang]
    else:
        raise ValueError(f"unknown language {language!r}; supported: {', '.join(languages(ids))}")
    dialect = ids.speaker_dialect.get(speaker.lower()) if speaker else None
    if dialect is not None and lang in ("chinese", AUTO_LANGUAGE):
        language_id = ids.languages[dialect]
    return language_id


def build_prefill(
    ids: PromptIds,
    *,
    speaker: str | None,
    language: str,
    text_ids: Sequence[int],
    instruct_ids: Sequence[int] = (),
    streaming: bool = True,
) -> Prefill:
    """Rows and trailing text for one CustomVoice request (layout in the module docstring).

    `speaker` and `language` are matched case-insensitively; an empty / None speaker omits the speaker
    row (the official "no speaker" form). `text_ids` are x_1..x_T (see `TextTokenizer.target_ids`),
    `instruct_ids` all ids of the tokenized instruction (see `TextTokenizer.instruct_ids`) or empty.
    """
    speaker_id: int | None = None
    if speaker:
        key = speaker.lower()
        if key not in ids.speakers:
            raise ValueError(f"unknown speaker {speaker!r}; supported: {', '.join(speakers(ids))}")
        speaker_id = ids.speakers[key]
    language_id = resolve_language_id(ids, speaker=speaker, language=language)
    text = tuple(int(t) for t in text_ids)
    if not text:
        raise ValueError("text_ids is empty: the prompt needs at least one text token (x_1)")

    rows: list[PromptRow] = [PromptRow(int(u), None) for u in instruct_ids]
    rows += [PromptRow(ids.im_start, None), PromptRow(ids.assistant, None), PromptRow(ids.newline, None)]
    if language_id is None:
        control = [ids.codec_nothink, ids.codec_think_bos, ids.codec_think_eos]
    else:
        control = [ids.codec_think, ids.codec_think_bos, language_id, ids.codec_think_eos]
    if speaker_id is not None:
        control.append(speaker_id)
    rows += [PromptRow(ids.tts_pad, codec) for codec in control]
    rows.append(PromptRow(ids.tts_bos, ids.codec_pad))

    if streaming:
        rows.append(PromptRow(text[0], ids.codec_bos))
        trailing = (*text[1:], ids.tts_eos)
    else:
        rows += [PromptRow(t, ids.codec_pad) for t in text]
        rows.append(PromptRow(ids.tts_eos, ids.codec_pad))
        rows.append(PromptRow(ids.tts_pad, ids.codec_bos))
        trailing = (ids.tts_pad,)
    return Prefill(rows=tuple(rows), trailing=trailing)


# ---------------------------------------------------------------- voice cloning (Base) and VoiceDesign
#
# Base checkpoints take the voice from reference audio instead of a named speaker:
#   x-vector mode:   the CustomVoice layout without a named speaker, plus one row `tts_pad + x-vector`
#                    (the speaker encoder's output) where the speaker row would be; no dialect rule.
#   in-context mode: the same head (with the x-vector row), then the reference transcript, the target text
#                    and the reference codes side by side. With R reference ids r_i, T text ids x_i and K
#                    reference frames F_j (a frame's term is the sum of its 16 code embeddings):
#                      text track  S = r_1..r_R x_1..x_T tts_eos        (n = R+T+1 rows)
#                      codec track C = codec_bos F_1..F_K               (K+1 rows)
#                    non-streaming: rows S_i + C(codec_pad), then tts_pad + C_j; trailing = tts_pad
#                    streaming:     rows S_j + C_j for j <= K+1 (S padded with tts_pad when n <= K+1);
#                                   trailing = S_{K+2}..S_n when n > K+1, else tts_pad
#                    The official code projects r_1..x_T in ONE text-projection call (rows and trailing).
# VoiceDesign checkpoints use the CustomVoice layout with an instruction and no speaker row.


@dataclass(frozen=True)
class VoiceRow:
    """One prefill position of a voice request: P(text_id) + one codec term (or none).

    The codec term is `C(codec_id)`, the x-vector (`speaker`), or the 16-code sum of reference frame
    `ref_frame` (0-based); at most one of the three is set."""

    text_id: int | None
    codec_id: int | None = None
    speaker: bool = False
    ref_frame: int | None = None


@dataclass(frozen=True)
class VoicePrefill:
    """Rows and trailing text of a voice request. `joint_text`: the text ids of the in-context rows and of
    `trailing` are one projection call (in-context mode), not two."""

    rows: tuple[VoiceRow, ...]
    trailing: tuple[int, ...]
    joint_text: bool = False


def _voice_head(ids: PromptIds, language: str) -> list[VoiceRow]:
    """Role rows, control rows, the x-vector row and `tts_bos + codec_pad` (no dialect rule: no speaker)."""
    head = build_prefill(ids, speaker=None, language=language, text_ids=(0,), streaming=True).rows[:-1]
    rows = [VoiceRow(r.text_id, r.codec_id) for r in head]
    rows.insert(len(rows) - 1, VoiceRow(ids.tts_pad, speaker=True))
    return rows


def build_xvector_prefill(
    ids: PromptIds, *, language: str, text_ids: Sequence[int], streaming: bool = True
) -> VoicePrefill:
    """A Base request in x-vector mode (the official `x_vector_only_mode=True`; its default is streaming)."""
    text = tuple(int(t) for t in text_ids)
    if not text:
        raise ValueError("text_ids is empty: the prompt needs at least one text token (x_1)")
    rows = _voice_head(ids, language)
    if streaming:
        rows.append(VoiceRow(text[0], ids.codec_bos))
        trailing = (*text[1:], ids.tts_eos)
    else:
        rows += [VoiceRow(t, ids.codec_pad) for t in (*text, ids.tts_eos)]
        rows.append(VoiceRow(ids.tts_pad, ids.codec_bos))
        trailing = (ids.tts_pad,)
    return VoicePrefill(rows=tuple(rows), trailing=trailing)


def build_in_context_prefill(
    ids: PromptIds,
    *,
    language: str,
    text_ids: Sequence[int],
    ref_text_ids: Sequence[int],
    ref_frames: int,
    streaming: bool = True,
) -> VoicePrefill:
    """A Base request in in-context mode (official default: streaming): `ref_text_ids` are the transcript's ids (see
    `TextTokenizer.target_ids`), `ref_frames` the number of reference code frames (layout above)."""
    text = tuple(int(t) for t in text_ids)
    ref = tuple(int(t) for t in ref_text_ids)
    if not text or not ref:
        raise ValueError("in-context prompts need text ids and reference-transcript ids")
    if ref_frames < 1:
        raise ValueError("in-context prompts need at least one reference frame")
    rows = _voice_head(ids, language)
    track = (*ref, *text, ids.tts_eos)
    codec = [VoiceRow(None, ids.codec_bos)] + [VoiceRow(None, ref_frame=j) for j in range(ref_frames)]
    if not streaming:
        rows += [VoiceRow(t, ids.codec_pad) for t in track]
        rows += [VoiceRow(ids.tts_pad, c.codec_id, ref_frame=c.ref_frame) for c in codec]
        return VoicePrefill(rows=tuple(rows), trailing=(ids.tts_pad,), joint_text=True)
    padded = track + (ids.tts_pad,) * max(0, len(codec) - len(track))
    rows += [VoiceRow(t, c.codec_id, ref_frame=c.ref_frame) for t, c in zip(padded, codec, strict=False)]
    trailing = track[len(codec) :] or (ids.tts_pad,)
    return VoicePrefill(rows=tuple(rows), trailing=trailing, joint_text=True)


def build_voice_design_prefill(
    ids: PromptIds,
    *,
    language: str,
    text_ids: Sequence[int],
    instruct_ids: Sequence[int] = (),
    streaming: bool = False,
) -> Prefill:
    """A VoiceDesign request: the CustomVoice layout with the instruction and no speaker row (the official
    `generate_voice_design`; its default is non-streaming). Embed it with `embed_prefill`."""
    return build_prefill(
        ids,
        speaker=None,
        language=language,
        text_ids=text_ids,
        instruct_ids=instruct_ids,
        streaming=streaming,
    )
