"""Approximate timings: characters spread over the audio at the length model's rate, clamped to it."""

from __future__ import annotations

import pytest

from gateway.compat.languages import iso_language
from gateway.compat.timings import CHARS_PER_SECOND, CharTimeline, WordTimeline
from gateway.voices import UnknownName, resolve_language


def test_each_chunk_releases_the_characters_its_audio_reaches_and_they_tile_it() -> None:
    timeline = CharTimeline()
    timeline.add_text("Hello world, again.")  # 19 characters: 1.357 s at 14 per second
    first = timeline.audio(0.5)  # characters starting before 0.5 s: 0..6 (6/14 = 0.43)
    assert "".join(c.char for c in first) == "Hello w"
    assert first[0].start_s == 0 and first[-1].end_s == 0.5
    assert all(a.end_s == b.start_s for a, b in zip(first, first[1:], strict=False))
    second = timeline.audio(0.5)
    assert second[0].start_s == pytest.approx(7 / CHARS_PER_SECOND) and second[-1].end_s == 1.0
    rest = timeline.audio(1.0)
    assert "".join(c.char for c in first + second + rest) == "Hello world, again."
    assert timeline.finish() == []


def test_characters_the_audio_never_reached_end_at_its_last_sample() -> None:
    timeline = CharTimeline()
    timeline.add_text("A long sentence spoken quickly.")
    timed = timeline.audio(0.8)
    tail = timeline.finish()
    assert tail and all(c.start_s == c.end_s == 0.8 for c in tail)
    assert "".join(c.char for c in timed + tail) == "A long sentence spoken quickly."


def test_late_text_starts_at_the_chunk_that_carries_it() -> None:
    timeline = CharTimeline()
    timeline.add_text("Hi ")
    timeline.audio(1.0)
    timeline.add_text("there")
    late = timeline.audio(0.2)
    assert [c.char for c in late] == list("there") and late[0].start_s == 1.0 and late[-1].end_s == 1.2


def test_words_are_closed_by_whitespace_and_by_the_end() -> None:
    timeline, words = CharTimeline(), WordTimeline()
    timeline.add_text("one two  three")
    got = words.add(timeline.audio(0.5)) + words.add(timeline.audio(0.5)) + words.finish()
    assert [w.word for w in got] == ["one", "two", "three"]
    assert got[0].start_s == 0 and got[1].start_s == pytest.approx(4 / CHARS_PER_SECOND)
    assert all(w.start_s < w.end_s for w in got)


def test_iso_639_1_codes_resolve_to_model_languages_and_unknown_ones_are_refused() -> None:
    languages = ("chinese", "english", "german", "japanese")
    assert resolve_language("en", languages) == "english"
    assert resolve_language("zh-CN", languages) == "chinese"
    assert resolve_language("de_AT", languages) == "german"
    assert resolve_language("English", languages) == "english"
    assert iso_language("xx") is None
    for bad in ("xx", "fr"):  # not a code; a code whose language this model lacks
        with pytest.raises(UnknownName) as info:
            resolve_language(bad, languages)
        assert info.value.code == "unknown_language" and "ISO 639-1" in str(info.value)
