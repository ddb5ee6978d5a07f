"""Per-request numbers from a trace: latencies on the playback timeline, stalls, RTF, errors.

All latencies are milliseconds after dispatch (time zero of the request):

    ttfb            first non-empty audio payload arrives
    first_playable  first complete PCM sample arrives (= playback starts)
    ttfa            the audible onset plays: first_playable + leading silence + stalls before it
    e2e             response complete
    connect         transport start -> dispatch (HTTP: pooled connection; WS: handshake,
                    session.created, context.create)
    scheduling_lag  transport start - ideal Poisson arrival (the generator's own lateness; shown
                    as a latency of its own, relative to the ideal arrival, not to dispatch)

A request with audio but whose largest stall exceeds 500 ms or whose stalls total over 1 s is a
"stall failure" (the peers' rule); it is counted separately from transport errors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from loadtest.onset import audible_onset_pcm16
from loadtest.trace import RequestFailed, StreamTrace

STALL_FAIL_MAX_S = 0.5
STALL_FAIL_TOTAL_S = 1.0


@dataclass(slots=True)
class RequestRecord:
    index: int
    phase: str  # "warmup" | "measure"
    prompt_id: str
    chars: int
    scheduled_s: float  # ideal arrival, seconds after the run started
    ok: bool = False
    error_kind: str | None = None
    error_message: str | None = None
    dispatch_s: float | None = None  # actual dispatch, seconds after the run started
    scheduling_lag_ms: float | None = None
    connect_ms: float | None = None
    ttfb_ms: float | None = None
    first_playable_ms: float | None = None
    ttfa_ms: float | None = None
    leading_silence_ms: float | None = None
    e2e_ms: float | None = None
    input_ingress_ms: float | None = None  # WS: first append -> input_text.end
    audio_s: float | None = None
    rtf: float | None = None
    chunks: int = 0
    underruns: int = 0
    stall_total_ms: float = 0.0
    stall_max_ms: float = 0.0
    stall_failure: bool = False
    audio_before_input_end: bool | None = None  # WS: audio began before the text was complete
    playback_reports: int = 0

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _ms(later: float | None, earlier: float | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier) * 1000.0


def fill_record(
    record: RequestRecord, trace: StreamTrace, run_start: float, error: RequestFailed | None
) -> None:
    """Compute every metric of `record` from what the transport saw."""
    dispatch = trace.dispatch
    record.dispatch_s = None if dispatch is None else dispatch - run_start
    record.scheduling_lag_ms = _ms(trace.started, run_start + record.scheduled_s)
    record.connect_ms = _ms(dispatch, trace.started)
    record.ttfb_ms = _ms(trace.first_byte, dispatch)
    record.e2e_ms = _ms(trace.end, dispatch)
    record.input_ingress_ms = _ms(trace.input_last, dispatch)
    record.chunks = trace.chunks
    record.playback_reports = trace.reports_sent

    playback = trace.playback
    if playback.started:
        record.first_playable_ms = _ms(playback.start_time, dispatch)
        record.audio_s = playback.total_samples / trace.sample_rate
        record.underruns = playback.underruns
        record.stall_total_ms = playback.total_stall * 1000.0
        record.stall_max_ms = playback.max_stall * 1000.0
        record.stall_failure = (
            playback.max_stall > STALL_FAIL_MAX_S or playback.total_stall > STALL_FAIL_TOTAL_S
        )
        if trace.input_last is not None:
            record.audio_before_input_end = (
                playback.start_time is not None and playback.start_time < trace.input_last
            )
        onset = audible_onset_pcm16(trace.pcm, trace.sample_rate)
        if onset is not None:
            record.leading_silence_ms = onset / trace.sample_rate * 1000.0
            record.ttfa_ms = _ms(playback.time_of_sample(onset), dispatch)

    if error is None and not playback.started:
        error = RequestFailed("empty_audio", "the response carried no audio samples")
    if error is None and record.ttfa_ms is None:
        error = RequestFailed("silent_audio", f"no audible onset in {record.audio_s:.3f} s of audio")
    if error is not None:
        record.error_kind, record.error_message = error.kind, error.message
        return
    record.ok = True
    if record.e2e_ms is not None and record.audio_s:
        record.rtf = record.e2e_ms / 1000.0 / record.audio_s
