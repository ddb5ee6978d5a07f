"""What a transport observed for one request: timestamps, PCM bytes and their arrival times.

Transports only record; `loadtest/metrics.py` turns a trace into the request's numbers. Times are
`time.monotonic()` seconds (the event loop's clock). PCM is little-endian 16-bit mono; a chunk may
end mid-sample (raw HTTP bodies split anywhere), so a sample counts as arrived only when both of
its bytes have.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from loadtest.playback import PlaybackSimulator


class RequestFailed(Exception):
    """A request ended without complete audio. `kind` groups errors in the summary."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


@dataclass(slots=True)
class StreamTrace:
    sample_rate: int
    started: float = field(default_factory=time.monotonic)  # transport began (before connecting)
    dispatch: float | None = None  # time zero: HTTP request body sent / first WS text append
    setup_done: float | None = None  # WS: session.created received
    first_byte: float | None = None  # first non-empty audio payload
    input_last: float | None = None  # WS: input_text.end sent
    end: float | None = None  # response complete (EOF / context.done)
    pcm: bytearray = field(default_factory=bytearray)
    chunks: int = 0  # non-empty audio payloads received
    reports_sent: int = 0  # WS playback.position events sent
    playback: PlaybackSimulator = field(init=False)

    def __post_init__(self) -> None:
        self.playback = PlaybackSimulator(self.sample_rate)

    def audio(self, data: bytes, now: float | None = None) -> None:
        """Record an audio payload arriving `now`."""
        if not data:
            return
        now = time.monotonic() if now is None else now
        if self.first_byte is None:
            self.first_byte = now
        before = len(self.pcm) // 2
        self.pcm += data
        self.chunks += 1
        self.playback.add(now, len(self.pcm) // 2 - before)

    @property
    def samples(self) -> int:
        return len(self.pcm) // 2
