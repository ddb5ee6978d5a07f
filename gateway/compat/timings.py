"""Approximate character and word timings, derived from the audio produced, not from token consumption.

The model reads text faster than it speaks (one text token per 80 ms frame, a token being several
characters), so when a token was consumed says little about when it is heard. Instead the
characters received are spread over the audio at the length model's rate (`CHARS_PER_SECOND`,
about 14 characters per second of speech): character i nominally starts at i / 14 s. Each chunk of
audio [t0, t1) releases the received characters whose nominal start is before t1; a character
that arrives late starts at t0; the characters of one chunk tile it, the last one ending at t1.
Characters the audio never reached are released when the context completes, clamped to its last
sample. These are labelled approximate wherever they are documented.

`CharTimeline` gives character timings in seconds from the start of the context (ElevenLabs'
alignment makes them relative to each message); `WordTimeline` groups them into words
(Cartesia's `word_timestamps`).
"""

from __future__ import annotations

from dataclasses import dataclass

CHARS_PER_SECOND = 14.0  # the length model's speaking rate (gateway tests: frames = 12.5 * chars / 14)


@dataclass(frozen=True, slots=True)
class CharTiming:
    char: str
    start_s: float
    end_s: float


class CharTimeline:
    """One context's characters and audio so far; `audio()` and `finish()` release timed characters."""

    def __init__(self, chars_per_second: float = CHARS_PER_SECOND) -> None:
        self.rate = chars_per_second
        self.text = ""  # every character received, in order
        self.released = 0  # characters already given a time
        self.audio_s = 0.0  # audio produced so far, seconds

    def add_text(self, text: str) -> None:
        self.text += text

    def audio(self, seconds: float) -> list[CharTiming]:
        """The characters timed by the next `seconds` of audio."""
        t0, t1 = self.audio_s, self.audio_s + seconds
        self.audio_s = t1
        end = self.released
        while end < len(self.text) and end / self.rate < t1:
            end += 1
        return self._release(end, t0, t1)

    def finish(self) -> list[CharTiming]:
        """The context completed: characters the audio never reached end at its last sample."""
        return self._release(len(self.text), self.audio_s, self.audio_s)

    def _release(self, end: int, t0: float, t1: float) -> list[CharTiming]:
        starts = [min(max(i / self.rate, t0), t1) for i in range(self.released, end)]
        ends = [*starts[1:], t1] if starts else []
        timed = [
            CharTiming(self.text[i], start, stop)
            for i, start, stop in zip(range(self.released, end), starts, ends, strict=True)
        ]
        self.released = end
        return timed


@dataclass(frozen=True, slots=True)
class WordTiming:
    word: str
    start_s: float
    end_s: float


class WordTimeline:
    """Timed characters in, complete words out (a word ends at whitespace or at `finish()`)."""

    def __init__(self) -> None:
        self._word: list[CharTiming] = []

    def add(self, chars: list[CharTiming]) -> list[WordTiming]:
        words: list[WordTiming] = []
        for timing in chars:
            if timing.char.isspace():
                words += self._close()
            else:
                self._word.append(timing)
        return words

    def finish(self) -> list[WordTiming]:
        return self._close()

    def _close(self) -> list[WordTiming]:
        if not self._word:
            return []
        word = WordTiming("".join(c.char for c in self._word), self._word[0].start_s, self._word[-1].end_s)
        self._word = []
        return [word]
