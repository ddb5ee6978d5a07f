"""Typed records crossing the gateway <-> engine boundary: the one place their shapes live.

Pure Python (no torch, no numpy import needed by callers) so the gateway can import it.
The byte encoding of each record lives in `engine/ipc/wire.py`; this module only says what
the records mean.

Inbound (gateway -> engine), all keyed by a `request_id` the gateway chooses (unique per ring):

    Submit        a new request: prompt inputs as token ids, speaker or saved voice, language, sampling, seed
    AppendText    more stable text token ids for a running request (input streaming)
    Flush         decode and publish every frame generated so far, without waiting to fill a chunk
    EndText       no more text will come; the talker may now end the utterance
    Cancel        stop at once; the engine answers Done(reason="cancelled")
    Deadline      absolute time.monotonic_ns() at which the listener runs out of audio
    Shutdown      finish or fail in-flight work within `grace_ms`, then exit

Outbound (engine -> gateway):

    Ready         model loaded, graphs captured, warm-up synthesis done
    Heartbeat     liveness plus load figures for /metrics
    Audio         PCM16 mono 24 kHz samples of one request, `start_sample` on its timeline
    Done          the request ended (completed | cancelled | error); nothing follows for it
    Error         a request failed (request_id) or the engine failed (request_id == 0)

Time values are `time.monotonic_ns()` of the shared host clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class Layout(IntEnum):
    """Prompt layout (reference section 5.3)."""

    STREAMING = 0  # one text token fed per frame; the default, and the only one that streams input
    NON_STREAMING = 1  # all text in the prefill; needs the whole text at Submit (text_ended=True)


class DoneReason(IntEnum):
    COMPLETED = 0
    CANCELLED = 1
    ERROR = 2


@dataclass(frozen=True, slots=True)
class Sampling:
    """Official defaults (reference section 6.3). `greedy` replaces temperature/top-k by argmax."""

    greedy: bool = False
    temperature: float = 0.9
    top_k: int = 50
    repetition_penalty: float = 1.05
    subtalker_greedy: bool = False
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50


# ---------------------------------------------------------------- inbound


@dataclass(frozen=True, slots=True)
class Submit:
    request_id: int
    speaker: str  # lower-case CustomVoice speaker name, validated by the gateway
    language: str  # lower-case language name or "auto"
    text_ids: tuple[int, ...]  # stable text token ids known so far (x_1 .. x_n), no role/suffix ids
    text_chars: int  # characters of text those ids cover (feeds the random-weight length model)
    text_ended: bool  # True when text_ids is the whole text
    instruct_ids: tuple[int, ...] = ()  # tokenized "<|im_start|>user\n...<|im_end|>\n", or empty
    layout: Layout = Layout.STREAMING
    seed: int = 0
    sampling: Sampling = field(default_factory=Sampling)
    deadline_ns: int = 0  # 0: no deadline yet (the engine assumes playback starts at first audio)
    arrival_ns: int = 0  # when the gateway accepted the request (for TTFA accounting)
    max_lead_ms: int = 0  # pacing: generation pauses while the listener has more audio ahead; 0 = unpaced
    voice: str = ""  # Base models: a saved voice's name (x-vector mode, read from the voice store); "" none


@dataclass(frozen=True, slots=True)
class AppendText:
    request_id: int
    text_ids: tuple[int, ...]
    text_chars: int


@dataclass(frozen=True, slots=True)
class Flush:
    request_id: int


@dataclass(frozen=True, slots=True)
class EndText:
    request_id: int


@dataclass(frozen=True, slots=True)
class Cancel:
    request_id: int


@dataclass(frozen=True, slots=True)
class Deadline:
    request_id: int
    deadline_ns: int  # absolute time.monotonic_ns() when the listener's buffer runs dry
    # ... having been sent this much of the request's audio (engine samples, 24 kHz). Audio the engine publishes
    # beyond it moves the deadline later by its length until the gateway sends the next one (which it does only
    # when the listener drifts from that), so the engine never counts fresh audio as missing. None: the deadline
    # holds as it is.
    samples: int | None = None


@dataclass(frozen=True, slots=True)
class Shutdown:
    grace_ms: int = 5000


# ---------------------------------------------------------------- outbound


@dataclass(frozen=True, slots=True)
class Ready:
    model_id: str
    random_weights: bool
    sample_rate: int
    speakers: tuple[str, ...]
    languages: tuple[str, ...]
    device: str
    max_batch: int
    gpu_uuid: str = ""  # "GPU-…" as nvidia-smi -L prints it (the GPU this engine runs on); "" on CPU
    # `tts_model_type` of the served model: "custom_voice", "base" or "voice_design"; "" from an engine
    # older than the field (a CustomVoice model lists speakers, a Base model none)
    model_type: str = ""
    # Whether Submit.instruct_ids are taken (the official wrapper drops them for the 0.6B models; a Base model
    # takes none); False lets the gateway refuse instructions before a request starts
    takes_instructions: bool = True


@dataclass(frozen=True, slots=True)
class Heartbeat:
    time_ns: int
    active_requests: int
    queued_requests: int
    # Recent per-kind figures, e.g. {"talker_decode": (mean_batch, mean_ms)}; small and optional.
    step_stats: dict[str, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Audio:
    request_id: int
    start_sample: int  # index of pcm's first sample on the request's 24 kHz timeline
    pcm: bytes  # int16 little-endian mono samples
    first: bool = False  # first audio of this request


@dataclass(frozen=True, slots=True)
class Done:
    request_id: int
    reason: DoneReason
    samples: int  # total samples published for this request
    frames: int  # codec frames generated


@dataclass(frozen=True, slots=True)
class Error:
    request_id: int  # 0: the engine itself failed
    code: str  # short machine code: "overloaded", "runaway", "bad_request", "internal", ...
    message: str


Inbound = Submit | AppendText | Flush | EndText | Cancel | Deadline | Shutdown
Outbound = Ready | Heartbeat | Audio | Done | Error
