"""Pacing (`Submit.max_lead_ms`): how freely a paced request may generate, by the audio its listener has ahead.

    lead = deadline - now + generated-but-undecoded frames          (RequestState.lead_ns)

    lead >= max_lead             HELD    no generation; pending frames are decoded at once
    max_lead / 2 < lead < max    FILLER  joins a batch another stream anchors, never anchors one
    lead <= max_lead / 2         FREE    schedules like any stream (so does an unpaced one)

Plain Python, the clock passed in. The scheduler decides when pacing applies at all (slots permitting).
"""

from __future__ import annotations

from enum import Enum

from engine.request import RequestState


class Pace(Enum):
    """Generation of a paced request (Submit.max_lead_ms), by the audio its listener has ahead."""

    FREE = "free"  # unpaced, no audio yet, or at most half the lead ahead: schedules like any stream
    FILLER = "filler"  # between half the lead and the lead: joins other streams' batches, starts none
    HELD = "held"  # the whole lead ahead: no generation until the listener catches up


def pace_of(r: RequestState, now_ns: int) -> tuple[Pace, int | None]:
    """-> (r's pace, when it becomes FREE). The half-lead band lets paced streams gather into shared
    batches instead of each running its own small step the moment it falls below its lead."""
    lead = r.lead_ns(now_ns)
    if lead is None:
        return Pace.FREE, None
    limit = r.max_lead_ms * 1_000_000
    refill = limit // 2
    if lead <= refill:
        return Pace.FREE, None
    return (Pace.HELD if lead >= limit else Pace.FILLER), now_ns + lead - refill
