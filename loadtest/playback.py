"""Zero-buffer playback simulation from chunk arrival times: when each sample plays, and every stall.

The simulated client plays immediately (peers.md section 2.2): playback starts when the first
playable chunk arrives; every chunk extends the moment the buffer runs dry by its duration; a chunk
that arrives after that moment is an underrun, stalled for (arrival - dry moment), and playback
resumes at its arrival. Playback is kept as contiguous segments, one per stall-free stretch:

    wall time  ──────────────────────────────────────────────────────────▶
    segment 0  [start0 ······ plays samples 0..a ······)  stall  [start1 ··· samples a..b ···)
                                                     dry0 ^^^^^^ arrival of the late chunk

Times are seconds on any monotonic clock (the caller's); sample counts are whole output samples.
The simulator is incremental so a WebSocket client can report its playback position while
audio still arrives, and the final result is the same object the metrics read.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(slots=True)
class Segment:
    wall_start: float  # when the segment's first sample plays
    sample_start: int  # first sample of the segment on the audio timeline
    sample_end: int  # one past its last sample


class PlaybackSimulator:
    """Feed `add(arrival, n_samples)` in arrival order; ask when samples play and how often it stalled."""

    def __init__(self, sample_rate: int) -> None:
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {sample_rate}")
        self.sample_rate = sample_rate
        self.segments: list[Segment] = []
        self.stalls: list[float] = []  # seconds of each underrun, in order
        self._last_arrival = float("-inf")

    # ---------------------------------------------------------------- feeding

    def add(self, arrival: float, n_samples: int) -> None:
        if n_samples < 0:
            raise ValueError(f"n_samples must be >= 0, got {n_samples}")
        if arrival < self._last_arrival:
            raise ValueError(f"chunks must be added in arrival order ({arrival} < {self._last_arrival})")
        self._last_arrival = arrival
        if n_samples == 0:
            return
        if not self.segments:
            self.segments.append(Segment(arrival, 0, n_samples))
            return
        last = self.segments[-1]
        dry = self.dry_time()
        if arrival > dry:
            self.stalls.append(arrival - dry)
            self.segments.append(Segment(arrival, last.sample_end, last.sample_end + n_samples))
        else:
            last.sample_end += n_samples

    # ---------------------------------------------------------------- queries

    @property
    def started(self) -> bool:
        return bool(self.segments)

    @property
    def start_time(self) -> float | None:
        return self.segments[0].wall_start if self.segments else None

    @property
    def total_samples(self) -> int:
        return self.segments[-1].sample_end if self.segments else 0

    @property
    def underruns(self) -> int:
        return len(self.stalls)

    @property
    def total_stall(self) -> float:
        return sum(self.stalls)

    @property
    def max_stall(self) -> float:
        return max(self.stalls, default=0.0)

    def dry_time(self) -> float:
        """When the buffer runs dry if nothing more arrives (raises before playback started)."""
        if not self.segments:
            raise ValueError("playback has not started")
        last = self.segments[-1]
        return last.wall_start + (last.sample_end - last.sample_start) / self.sample_rate

    def time_of_sample(self, sample: int) -> float:
        """Wall time at which `sample` plays. Raises for samples not received yet."""
        if not 0 <= sample < self.total_samples:
            raise ValueError(f"sample {sample} outside received audio [0, {self.total_samples})")
        starts = [segment.sample_start for segment in self.segments]
        segment = self.segments[bisect.bisect_right(starts, sample) - 1]
        return segment.wall_start + (sample - segment.sample_start) / self.sample_rate

    def played_samples(self, now: float) -> int:
        """Samples played by `now`: what a client reports in `playback.position`."""
        played = 0
        for segment in self.segments:
            if now <= segment.wall_start:
                break
            elapsed = round((now - segment.wall_start) * self.sample_rate)
            played = min(segment.sample_end, segment.sample_start + elapsed)
        return played

    def buffered_samples(self, now: float) -> int:
        return self.total_samples - self.played_samples(now)
