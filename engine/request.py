"""Per-request state of the engine: where one utterance stands in its pipeline, and what it holds.

`RequestState` is the noun every engine file shares. It is plain Python (no torch, no clock reads):
the scheduler moves it through its phases, the executors read the indices it hands out.

Phases of the generation lane (the codec lane runs beside it, counted by `frames_decoded`):

    admit ──▶ WAITING_TEXT ◀──────────────┐   (streaming layout: no text token to feed yet)
       │          │ text arrives           │
       ▼          ▼                        │
     PREFILL ──▶ CODE_PREDICT ──▶ TALKER_DECODE ──(no EOS)──▶ CODE_PREDICT ...
                 (frame k needs     │  (consumes one text token per frame in the streaming layout)
                  codes 1..15)      └──(EOS, length model or runaway cap)──▶ FINISHING
     FINISHING: generation over, the codec drains the frames not yet decoded ──▶ DONE
     any phase ──▶ CANCELLED (cancel) | FAILED (executor error); resources are released exactly once.

In-context voice cloning (Base models): the prompt holds the reference transcript, the whole target text and
the reference codes, and leaves `prompt_trailing` (its `VoicePrefill.trailing`: the text track's rest,
ending in tts_eos, or just tts_pad) for the decode steps, fed one per step whatever the layout, then
TEXT_PAD; the text is whole at Submit, so the request never waits for text.

Frame bookkeeping (frame k = 80 ms = 1920 samples at 24 kHz):

    frames_generated   frames whose 16 codes are all known (code predictor finished them)
    frames_decoded     frames the codec has turned into PCM; frames_generated - frames_decoded are pending
    samples_published  PCM samples handed to the outbound ring (leading silence may be trimmed)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum, IntEnum, auto

from engine.ipc.messages import Layout, Submit

SAMPLE_RATE = 24_000
SAMPLES_PER_FRAME = 1_920  # 12.5 frames per second
NS_PER_SAMPLE = 1e9 / SAMPLE_RATE

# Sentinels for `text_index` in a talker-decode row (see `RequestState.next_text_input`).
TEXT_END = -1  # the text end-of-sequence row: fed once, after the last text token
TEXT_PAD = -2  # the text pad row: fed on every step after TEXT_END (and always in the non-streaming layout)


# IntEnum: the scheduler hashes these per request per step, and int hashing is C, Enum's is Python.
class WorkKind(IntEnum):
    """The four independently schedulable, batchable units of work (design brief section 3)."""

    TALKER_PREFILL = auto()
    CODE_PREDICT = auto()  # the 15-step code predictor loop of one frame
    TALKER_DECODE = auto()
    CODEC_CHUNK = auto()

    @property
    def label(self) -> str:
        """The name metrics and heartbeats use: talker_prefill, code_predict, talker_decode, codec_chunk."""
        return self.name.lower()


class Phase(IntEnum):
    # Declaration order is relied on: every phase from FINISHING on has finished generating, and every one from DONE
    # on has ended (`generation_finished` and `is_ended` compare, as the scheduler asks them of every request on
    # every plan call).
    WAITING_TEXT = auto()
    PREFILL = auto()
    CODE_PREDICT = auto()
    TALKER_DECODE = auto()
    FINISHING = auto()
    DONE = auto()
    CANCELLED = auto()
    FAILED = auto()


ENDED_PHASES = frozenset({Phase.DONE, Phase.CANCELLED, Phase.FAILED})


class FinishReason(Enum):
    EOS = "eos"  # the talker sampled end-of-speech
    LENGTH_MODEL = "length_model"  # random weights: the deterministic length model said stop
    RUNAWAY = "runaway"  # the frame cap for this text was reached; the loop reports Error("runaway")


FRAMES_PER_SECOND = 12.5
LENGTH_MODEL_CHARS_PER_SECOND = 14.0
RUNAWAY_BASE_FRAMES = 64
RUNAWAY_FRAMES_PER_TOKEN = 8  # 640 ms per text token: about twice the slowest normal speech


def length_model_frames(chars: int) -> int:
    """Frames a random-weight model speaks for `chars` characters: ceil(12.5 * chars / 14), at least 1."""
    return max(1, math.ceil(FRAMES_PER_SECOND * chars / LENGTH_MODEL_CHARS_PER_SECOND))


def runaway_frame_cap(text_tokens: int, base: int = RUNAWAY_BASE_FRAMES,
                      per_token: int = RUNAWAY_FRAMES_PER_TOKEN) -> int:
    """Frames after which a real-weight model that never said EOS is stopped as a runaway: 64 + 8 per
    text token. One rule for the engine (scheduler) and the reference loop (`engine.model.generate`)."""
    return base + per_token * text_tokens


class SlotPool:
    """Fixed set of slot numbers (rows of a preallocated cache). Double frees are refused loudly."""

    def __init__(self, name: str, size: int) -> None:
        if size < 1:
            raise ValueError(f"{name} pool needs at least one slot, got {size}")
        self.name = name
        self.size = size
        self._free = list(range(size - 1, -1, -1))  # pop() hands out slot 0 first
        self._used: set[int] = set()

    @property
    def free_count(self) -> int:
        return len(self._free)

    def allocate(self) -> int | None:
        if not self._free:
            return None
        slot = self._free.pop()
        self._used.add(slot)
        return slot

    def free(self, slot: int) -> None:
        if slot not in self._used:
            raise AssertionError(f"{self.name} slot {slot} freed twice or never allocated")
        self._used.remove(slot)
        self._free.append(slot)


@dataclass(slots=True)
class RequestState:
    """One utterance inside the engine. Fields are public so executors and the loop can read them."""

    request_id: int
    arrival_ns: int
    layout: Layout
    prefill_len: int  # prefill rows, from `engine.text.prompt.build_prefill` (layout and instruct included)
    text_ids: list[int] = field(default_factory=list)  # stable text token ids received so far
    text_chars: int = 0  # characters those ids cover (feeds the length model and the runaway cap)
    text_ended: bool = False
    text_fed: int = 0  # text tokens the talker has consumed (x_1 goes in with the prefill)
    text_end_fed: bool = False  # the TEXT_END row has been consumed
    prompt_trailing: tuple[int, ...] | None = None  # in-context mode: text ids the decode steps feed, then pad
    trailing_fed: int = 0  # in-context mode: entries of `prompt_trailing` the talker has consumed
    flush_pending: bool = False
    phase: Phase = Phase.PREFILL
    finish_reason: FinishReason | None = None
    error: str | None = None
    frames_generated: int = 0
    frames_decoded: int = 0
    samples_published: int = 0
    first_audio_ns: int | None = None
    last_frame_ns: int | None = None  # when the code predictor last completed one of its frames
    frame_interval_ms: float | None = None  # moving average of the time between its frames (its pace)
    deadline_ns: int | None = None  # owned by the gateway; None: playback assumed to start at first audio
    deadline_samples: int | None = None  # the audio the gateway's deadline counts as sent (None: it holds as it is)
    max_lead_ms: int = 0  # pacing: no generation while more audio than this lies ahead of the listener; 0 = off
    max_frames: int = 2048  # runaway cap before the text has ended; tightened when it ends
    target_frames: int | None = None  # length model of random-weight models, known once the text ended
    use_length_model: bool = False
    kv_slot: int | None = None
    codec_slot: int | None = None
    generation_busy: bool = False  # a plan holding this request's generation lane is in flight
    codec_busy: bool = False  # a plan holding its codec lane is in flight
    # The talker waited for text since this stream last had a healthy buffer: while so, its nearness to its deadline
    # is its text's doing, not the GPU's, and admission's pressure does not count its rescue work.
    text_starved: bool = False
    _kv_pool: SlotPool | None = None
    _codec_pool: SlotPool | None = None

    @classmethod
    def from_submit(cls, msg: Submit, prefill_len: int, now_ns: int,
                    prompt_trailing: tuple[int, ...] | None = None) -> RequestState:
        """State of a just-submitted request; `admit` sets its phase, caps and slots. `prompt_trailing`: an
        in-context request's decode-step text (`Executors.check_submit`)."""
        return cls(
            request_id=msg.request_id,
            arrival_ns=msg.arrival_ns or now_ns,
            layout=msg.layout,
            prefill_len=prefill_len,
            text_ids=list(msg.text_ids),
            text_chars=msg.text_chars,
            text_ended=msg.text_ended,
            deadline_ns=msg.deadline_ns or None,
            max_lead_ms=msg.max_lead_ms,
            prompt_trailing=prompt_trailing,
        )

    # ---------------------------------------------------------------- text

    @property
    def is_ended(self) -> bool:
        return self.phase >= Phase.DONE  # DONE, CANCELLED, FAILED (ENDED_PHASES)

    @property
    def frames_pending(self) -> int:
        return self.frames_generated - self.frames_decoded

    @property
    def generation_finished(self) -> bool:
        return self.phase >= Phase.FINISHING  # FINISHING or ended

    def has_text_for_next_step(self) -> bool:
        """Whether the next talker step can run without inventing text (input streaming)."""
        if self.prompt_trailing is not None:
            return True  # in-context: the whole text is in the prompt and its trailing
        if self.layout is Layout.NON_STREAMING:
            return True  # admission demands the whole text; every decode step feeds TEXT_PAD
        if self.phase is Phase.PREFILL:
            return len(self.text_ids) > 0  # the prefill's last row carries x_1
        return self.text_fed < len(self.text_ids) or self.text_ended

    def next_text_input(self) -> int:
        """Index into `text_ids` the next talker step feeds, or TEXT_END / TEXT_PAD (in-context mode: an
        index into `prompt_trailing`, or TEXT_PAD once it is fed)."""
        if self.prompt_trailing is not None:
            return self.trailing_fed if self.trailing_fed < len(self.prompt_trailing) else TEXT_PAD
        if self.layout is Layout.NON_STREAMING:
            return TEXT_PAD
        if self.text_fed < len(self.text_ids):
            return self.text_fed
        assert self.text_ended, "next_text_input called while the talker must wait for text"
        return TEXT_PAD if self.text_end_fed else TEXT_END

    def eos_allowed_next_step(self, min_frames_before_eos: int) -> bool:
        """EOS may be sampled only after the text ended and its end row is fed (never with the length model)."""
        if self.use_length_model or not self.text_ended:
            return False
        # The step samples codebook 0 of frame `frames_generated`, after `frames_generated` tokens were
        # sampled already; official min_new_tokens = 2 masks EOS while fewer than 2 exist.
        if self.frames_generated < min_frames_before_eos:
            return False
        if self.prompt_trailing is not None:
            return True  # official in-context: only min_new_tokens holds EOS back, fed trailing or not
        return self.layout is Layout.NON_STREAMING or self.text_fed >= len(self.text_ids)

    def consume_text_input(self) -> None:
        """Record that the talker step just planned fed `next_text_input()`."""
        if self.prompt_trailing is not None:
            self.trailing_fed = min(self.trailing_fed + 1, len(self.prompt_trailing))
            return
        if self.layout is Layout.NON_STREAMING:
            return
        if self.text_fed < len(self.text_ids):
            self.text_fed += 1
        elif self.text_ended:
            self.text_end_fed = True

    def record_frame(self, now_ns: int) -> None:
        """Count a completed frame and update the request's generation pace."""
        self.frames_generated += 1
        if self.last_frame_ns is not None:
            interval = (now_ns - self.last_frame_ns) / 1e6
            previous = self.frame_interval_ms
            self.frame_interval_ms = interval if previous is None else 0.7 * previous + 0.3 * interval
        self.last_frame_ns = now_ns

    # ---------------------------------------------------------------- deadlines

    def effective_deadline_ns(self) -> int | None:
        """When the listener runs out of audio: the gateway's value, moved later by the audio published since
        the audio it counted (on its way to the listener, who plays it after what it has); else first audio +
        audio published."""
        if self.deadline_ns is not None:
            if self.deadline_samples is None or self.samples_published <= self.deadline_samples:
                return self.deadline_ns
            return self.deadline_ns + int((self.samples_published - self.deadline_samples) * NS_PER_SAMPLE)
        if self.first_audio_ns is None:
            return None
        return self.first_audio_ns + int(self.samples_published * NS_PER_SAMPLE)

    def lead_ns(self, now_ns: int) -> int | None:
        """Pacing: audio ahead of the listener at `now_ns` (published and not yet played, plus generated frames
        still to decode); None for an unpaced request or one without audio yet (nothing holds it back)."""
        deadline = self.effective_deadline_ns()
        if self.max_lead_ms <= 0 or deadline is None or self.first_audio_ns is None:
            return None
        return deadline - now_ns + int(self.frames_pending * SAMPLES_PER_FRAME * NS_PER_SAMPLE)

    # ---------------------------------------------------------------- resources

    def attach_slots(self, kv_pool: SlotPool, codec_pool: SlotPool) -> bool:
        """Take one KV slot and one codec slot; on failure take neither."""
        kv = kv_pool.allocate()
        if kv is None:
            return False
        codec = codec_pool.allocate()
        if codec is None:
            kv_pool.free(kv)
            return False
        self.kv_slot, self.codec_slot = kv, codec
        self._kv_pool, self._codec_pool = kv_pool, codec_pool
        return True

    def release_kv(self) -> None:
        """Give the talker KV slot back (generation is over). Idempotent."""
        if self.kv_slot is not None and self._kv_pool is not None:
            self._kv_pool.free(self.kv_slot)
        self.kv_slot = None

    def release(self) -> None:
        """Give every resource back. Idempotent: safe to call from cancel, failure and completion paths."""
        self.release_kv()
        if self.codec_slot is not None and self._codec_pool is not None:
            self._codec_pool.free(self.codec_slot)
        self.codec_slot = None
