"""Playback clocks: turn what was sent and what the client reports into engine deadlines.

Pure arithmetic with `now` passed in (monotonic nanoseconds), no I/O, so every rule is tested
with explicit times. A deadline is the absolute `time.monotonic_ns()` at which the listener runs
out of audio: the engine must have the next audio at the client before then.

Two sources, best first:
1. `playback.position` reports: at report time t_r the client had played P samples, so with
   S samples sent it runs dry at t_r + (S - P) / rate. t_r is the client's timestamp mapped to
   server time with the offset learned from ping/pong and reports (`ClockOffset`); without a
   timestamp, the moment the report arrived.
2. Without reports: a server-side model in which playback starts the moment the first audio is
   sent and runs at real time: dry at t_first + S / rate.
The rate is the context's output rate (24 kHz unless the client chose another).
Both are moved earlier by `network_margin_ns`, the time audio sent now needs to reach the client.
"""

from __future__ import annotations

from collections import deque

SAMPLE_RATE = 24000
NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000


def samples_to_ns(samples: int, sample_rate: int = SAMPLE_RATE) -> int:
    return samples * NS_PER_S // sample_rate


class ClockOffset:
    """Estimates server_monotonic_ms - client_time_ms from (client stamp, arrival) pairs.

    Each pair gives offset + one-way delay of that message; the minimum over a recent window is
    the offset plus the *smallest* delay, which removes the queuing jitter of any single report.
    The remaining bias (the minimum one-way delay, about a millisecond on a LAN) is left to
    `network_margin_ns`. A window, not an all-time minimum, so drift between clocks is followed.
    """

    def __init__(self, window: int = 32) -> None:
        self._samples: deque[float] = deque(maxlen=window)

    def observe(self, client_time_ms: float, arrival_ns: int) -> None:
        self._samples.append(arrival_ns / NS_PER_MS - client_time_ms)

    @property
    def offset_ms(self) -> float | None:
        return min(self._samples) if self._samples else None

    def to_server_ns(self, client_time_ms: float | None, arrival_ns: int) -> int:
        """Server time of a client timestamp; never later than the message's arrival."""
        offset = self.offset_ms
        if client_time_ms is None or offset is None:
            return arrival_ns
        return min(arrival_ns, int((client_time_ms + offset) * NS_PER_MS))


class PlaybackClock:
    """One context's audio timeline as the listener experiences it."""

    def __init__(self, network_margin_ns: int = 10 * NS_PER_MS, sample_rate: int = SAMPLE_RATE) -> None:
        self.network_margin_ns = network_margin_ns
        self.sample_rate = sample_rate  # the context's output rate: every count here is in its samples
        self.samples_sent = 0
        self.first_sent_ns: int | None = None
        self.report_ns: int | None = None  # server time of the latest report
        self.played_samples = 0
        self.buffered_samples: int | None = None
        self.underruns = 0

    def on_audio_sent(self, samples: int, now_ns: int) -> None:
        if self.first_sent_ns is None and samples > 0:
            self.first_sent_ns = now_ns
        self.samples_sent += samples

    def on_report(self, played_samples: int, report_ns: int, buffered_samples: int | None = None) -> None:
        """A `playback.position` report. Stale reports (older or going backwards) are ignored."""
        if self.report_ns is not None and (
            report_ns < self.report_ns or played_samples < self.played_samples
        ):
            return
        self.report_ns = report_ns
        self.played_samples = min(played_samples, self.samples_sent)
        self.buffered_samples = buffered_samples

    def dry_ns(self, now_ns: int) -> int | None:
        """When the listener runs out of the audio sent so far; None before any audio was sent."""
        if self.first_sent_ns is None:
            return None
        if self.report_ns is None:
            return self.first_sent_ns + samples_to_ns(self.samples_sent, self.sample_rate)
        if self.played_samples == 0:
            # Reported but not playing yet (the client's jitter buffer is filling): playback may
            # start at any moment, so all the audio sent lies ahead of now at the latest.
            return max(now_ns, self.report_ns) + samples_to_ns(self.samples_sent, self.sample_rate)
        return self.report_ns + samples_to_ns(self.samples_sent - self.played_samples, self.sample_rate)

    def deadline_ns(self, now_ns: int) -> int | None:
        dry = self.dry_ns(now_ns)
        return None if dry is None else dry - self.network_margin_ns

    def lead_ns(self, now_ns: int) -> int | None:
        """Audio the listener still has ahead of it (negative: it is starving)."""
        dry = self.dry_ns(now_ns)
        return None if dry is None else dry - now_ns
