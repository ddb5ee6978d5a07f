"""Prompt layout (reference section 5.3): row counts, ids per row, dialect rule, names, errors."""

from __future__ import annotations

import pytest

from engine.text import PromptIds, PromptRow, build_prefill, languages, speakers

CONFIG = {
    "im_start_token_id": 151644, "im_end_token_id": 151645, "assistant_token_id": 77091,
    "tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
    "talker_config": {
        "codec_eos_token_id": 2150, "codec_think_id": 2154, "codec_nothink_id": 2155, "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157, "codec_pad_id": 2148, "codec_bos_id": 2149,
        "spk_id": {"aiden": 2861, "sohee": 2864, "ono_anna": 2873, "eric": 2875, "dylan": 2878,
                   "uncle_fu": 3010, "ryan": 3061, "vivian": 3065, "serena": 3066},
        "spk_is_dialect": {"aiden": False, "sohee": False, "ono_anna": False, "eric": "sichuan_dialect",
                           "dylan": "beijing_dialect", "uncle_fu": False, "ryan": False, "vivian": False,
                           "serena": False},
        "codec_language_id": {"english": 2050, "german": 2053, "spanish": 2054, "chinese": 2055,
                              "japanese": 2058, "french": 2061, "sichuan_dialect": 2062, "korean": 2064,
                              "russian": 2069, "italian": 2070, "portuguese": 2071, "beijing_dialect": 2074},
    },
}  # fmt: skip
IDS = PromptIds.from_config(CONFIG)
TEXT = [9707, 11, 1879, 0]  # x_1..x_4
INSTRUCT = [151644, 872, 198, 50, 51, 52, 151645, 198]  # m = 8


@pytest.mark.parametrize("instruct", [(), INSTRUCT], ids=["m=0", "m=8"])
def test_prefill_lengths_follow_the_reference_formulas(instruct: list[int]) -> None:
    m, t = len(instruct), len(TEXT)
    lengths = {
        (lang, streaming): len(build_prefill(IDS, speaker="ryan", language=lang, text_ids=TEXT,
                                             instruct_ids=instruct, streaming=streaming).rows)
        for lang in ("english", "auto") for streaming in (True, False)
    }  # fmt: skip
    assert lengths == {
        ("english", True): m + 10, ("auto", True): m + 9,
        ("english", False): m + t + 11, ("auto", False): m + t + 10,
    }  # fmt: skip


def test_streaming_rows_and_trailing_text_are_exactly_the_official_layout() -> None:
    p = build_prefill(IDS, speaker="vivian", language="german", text_ids=TEXT, instruct_ids=INSTRUCT[:3])
    assert p.rows == (
        PromptRow(151644, None), PromptRow(872, None), PromptRow(198, None),
        PromptRow(151644, None), PromptRow(77091, None), PromptRow(198, None),
        PromptRow(151671, 2154), PromptRow(151671, 2156), PromptRow(151671, 2053), PromptRow(151671, 2157),
        PromptRow(151671, 3065), PromptRow(151672, 2148), PromptRow(9707, 2149),
    )  # fmt: skip
    assert p.trailing == (11, 1879, 0, 151673)


def test_non_streaming_rows_hold_all_text_and_trail_tts_pad() -> None:
    p = build_prefill(IDS, speaker="ryan", language="auto", text_ids=TEXT, streaming=False)
    assert p.rows[3:6] == (PromptRow(151671, 2155), PromptRow(151671, 2156), PromptRow(151671, 2157))
    assert p.rows[6:8] == (PromptRow(151671, 3061), PromptRow(151672, 2148))
    assert p.rows[8:] == (
        *(PromptRow(t, 2148) for t in TEXT),
        PromptRow(151673, 2148),
        PromptRow(151671, 2149),
    )
    assert p.trailing == (151671,)


@pytest.mark.parametrize(
    ("speaker", "language", "expected"),
    [("eric", "chinese", 2062), ("eric", "auto", 2062), ("dylan", "Chinese", 2074), ("dylan", "AUTO", 2074),
     ("eric", "english", 2050), ("vivian", "chinese", 2055), ("vivian", "auto", None)],
)  # fmt: skip
def test_dialect_speakers_get_their_dialect_for_chinese_and_auto(
    speaker: str, language: str, expected: int
) -> None:
    rows = build_prefill(IDS, speaker=speaker, language=language, text_ids=TEXT).rows
    codec = [r.codec_id for r in rows[3:-2]]
    if expected is None:
        assert codec[:3] == [2155, 2156, 2157]
    else:
        assert codec[:4] == [2154, 2156, expected, 2157]


def test_speaker_and_language_names_are_case_insensitive() -> None:
    a = build_prefill(IDS, speaker="Uncle_Fu", language="ENGLISH", text_ids=TEXT)
    b = build_prefill(IDS, speaker="uncle_fu", language="english", text_ids=TEXT)
    assert a == b


def test_no_speaker_omits_the_speaker_row() -> None:
    with_speaker = build_prefill(IDS, speaker="ryan", language="english", text_ids=TEXT)
    without = build_prefill(IDS, speaker=None, language="english", text_ids=TEXT)
    assert len(with_speaker.rows) - len(without.rows) == 1
    assert PromptRow(151671, 3061) not in without.rows


def test_unknown_speaker_or_language_or_empty_text_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"unknown speaker 'bob'.*ryan"):
        build_prefill(IDS, speaker="bob", language="english", text_ids=TEXT)
    with pytest.raises(ValueError, match=r"unknown language 'klingon'.*auto"):
        build_prefill(IDS, speaker="ryan", language="klingon", text_ids=TEXT)
    with pytest.raises(ValueError, match="empty"):
        build_prefill(IDS, speaker="ryan", language="english", text_ids=[])


def test_user_facing_lists_drop_dialects_and_add_auto() -> None:
    assert speakers(IDS) == tuple(sorted(CONFIG["talker_config"]["spk_id"]))
    langs = languages(IDS)
    assert langs[0] == "auto" and "english" in langs and len(langs) == 11
    assert not any("dialect" in name for name in langs)


def test_config_reading_fails_clearly_on_missing_ids() -> None:
    broken = {
        **CONFIG,
        "talker_config": {k: v for k, v in CONFIG["talker_config"].items() if k != "codec_bos_id"},
    }
    with pytest.raises(ValueError, match="talker_config.codec_bos_id"):
        PromptIds.from_config(broken)
    with pytest.raises(ValueError, match="talker_config"):
        PromptIds.from_config({"im_start_token_id": 1})
    assert IDS.speaker_dialect["eric"] == "sichuan_dialect" and IDS.speaker_dialect["ryan"] is None
