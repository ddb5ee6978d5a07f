"""Deadline-aware scheduler: each step advances the one batch of work that best protects every listener.

The one idea: every request is a cursor in two lanes, generation (prefill -> code predictor -> talker
decode -> code predictor ...) and codec (frames generated -> PCM). Each call to `plan(now)` picks an
*anchor*, the most pressing ready item, which decides the work kind; it then *fills* the batch with
every other ready item of that kind and shape, most pressing first, up to the largest capture size
and the step budget (`max_step_ms`, so no batch blocks a newcomer for long). The rest waits a turn.

Who is most pressing (policy DEADLINE, the default):
  1. urgent streams: already playing, slack < `urgent_slack_ms`, where
     slack = deadline - now - predicted time to produce their next audio;
  2. startup: requests without first audio (the TTFA path), their first codec chunk first, then
     prefill (it brings newcomers into step with the others), code predictor, talker decode;
  3. everyone else by slack (earliest to run dry first): filler that builds buffers ahead.
FIFO and ROUND_ROBIN exist as baselines for the simulator (docs/scheduling.md compares them).

Chunk sizes: each request's next codec chunk is chosen from its remaining playback buffer and its
own generation pace (`SlackChunkPolicy`; any `engine.codec.chunking` policy plugs in instead): one
frame while the listener has almost nothing, growing as the buffer grows. A codec batch takes the
anchor's chunk size, and every row with at least that many frames ready joins it.

Admission refuses, with a reason, a request that would push the GPU time needed to keep every stream
real-time past `max_utilization`, or whose predicted time to first audio exceeds `ttfa_budget_ms`;
also when KV or codec slots run out. The scheduler owns slot accounting (numbers only, no tensors).

Driving it (engine loop and simulator alike):
    admit(state, now) -> Admission; plan(now) -> Plan | None; <run the plan>;
    complete(plan, Outcome, now); pop_finished() -> requests that ended, resources already released.
Input: append_text / end_text / flush / cancel / set_deadline at any time. No torch, no clock reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from engine.codec.chunking import ChunkPolicy
from engine.costmodel import CostModel
from engine.ipc.messages import Layout
from engine.request import (
    SAMPLES_PER_FRAME,
    TEXT_PAD,
    FinishReason,
    Phase,
    RequestState,
    SlotPool,
    WorkKind,
    length_model_frames,
)

FRAME_MS = 80.0
PRESSURE_DECAY = 0.98  # per plan: `pressure` looks back over roughly the last 50 plans
GENERATION_PHASES = frozenset({Phase.PREFILL, Phase.CODE_PREDICT, Phase.TALKER_DECODE})
# Order of a request's own items when it is the anchor: audio out first, then the pipeline front.
STAGE_RANK = {WorkKind.CODEC_CHUNK: 0, WorkKind.TALKER_PREFILL: 1, WorkKind.CODE_PREDICT: 2,
              WorkKind.TALKER_DECODE: 3}
MERGING_KINDS = {WorkKind.CODE_PREDICT: WorkKind.TALKER_DECODE, WorkKind.TALKER_DECODE: WorkKind.CODE_PREDICT}
PHASE_KIND = {Phase.PREFILL: WorkKind.TALKER_PREFILL, Phase.CODE_PREDICT: WorkKind.CODE_PREDICT,
              Phase.TALKER_DECODE: WorkKind.TALKER_DECODE}


class Policy(Enum):
    DEADLINE = "deadline"  # urgent streams > startup > the rest by slack (the module docstring)
    FIFO = "fifo"  # the oldest request's next item anchors: plain continuous batching, no priorities
    ROUND_ROBIN = "round_robin"  # the kind served least recently anchors (the peer's "balanced" profile)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    capture_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)  # talker decode and code predictor
    prefill_capture_sizes: tuple[int, ...] = (1, 2, 4, 8)
    prefill_token_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)  # last = longest prefill
    codec_capture_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    codec_chunk_sizes: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 25)  # steady chunks snap to these
    max_requests: int = 256  # talker KV slots (cohorts above the largest capture split)
    max_codec_streams: int = 256  # codec state slots
    max_step_ms: float = 12.0  # a batch is cut so its predicted time stays under this (anchor always runs)
    urgent_slack_ms: float = 60.0
    first_chunk_frames: int = 1  # 2 when the engine drops the fixed silent first frame
    chunk_margin_ms: float = 40.0  # a chunk must be out this long before its listener would run dry
    typical_chunk_frames: int = 8  # codec shape assumed by admission's real-time demand
    max_utilization: float = 0.8  # admission: GPU share needed to keep every stream real-time
    ttfa_budget_ms: float = 250.0  # admission: refuse when the predicted TTFA is larger
    max_pressure: float = 0.7  # admission: refuse while more recent GPU time went to urgent streams
    admission_control: bool = True  # False: only slot and shape limits (the simulator's baselines)
    max_frames: int = 2048  # runaway cap (164 s) while the text is open
    runaway_frames_per_char: float = 3.0  # cap once the text ended: speech is ~0.9 frames per character
    runaway_min_frames: int = 50
    min_frames_before_eos: int = 2  # official min_new_tokens
    length_model: bool = False  # random weights: stop at length_model_frames(chars), never at EOS
    policy: Policy = Policy.DEADLINE
    merge_startup: bool = False  # let a newcomer wait one step so split phases merge (see _anchor)

    def __post_init__(self) -> None:
        for name in ("capture_sizes", "prefill_capture_sizes", "prefill_token_buckets",
                     "codec_capture_sizes", "codec_chunk_sizes"):
            sizes = getattr(self, name)
            if not sizes or sizes[0] < 1 or list(sizes) != sorted(set(sizes)):
                raise ValueError(f"{name} must be positive and strictly increasing, got {sizes}")
        if self.first_chunk_frames < 1 or self.max_requests < 1 or self.max_codec_streams < 1:
            raise ValueError("first_chunk_frames, max_requests and max_codec_streams must be >= 1")
        if not 0 < self.max_utilization <= 1:
            raise ValueError("max_utilization must be in (0, 1]")


# ---------------------------------------------------------------- plan, outcome, admission


@dataclass(frozen=True, slots=True)
class PlanRow:
    """One request's part of a batch. `frame_index`: prefill 0; code predictor: the frame it completes;
    talker decode: the frame whose codes it feeds (it samples codebook 0 of frame_index + 1);
    codec: the first frame it decodes. `position` is the talker position of the row's first new token."""

    request_id: int
    kv_slot: int | None
    codec_slot: int | None
    frame_index: int
    position: int = 0
    text_index: int = TEXT_PAD  # talker decode: index into the request's text_ids, TEXT_END or TEXT_PAD
    eos_allowed: bool = False  # talker kinds: EOS may be sampled (else it stays masked)
    codec_frames: int = 0
    final_chunk: bool = False  # codec: the request's last chunk (generation over, nothing pending after)


@dataclass(frozen=True, slots=True)
class Plan:
    kind: WorkKind
    rows: tuple[PlanRow, ...]
    padded_batch: int  # capture size the rows are padded to
    codec_frames: int = 0  # codec: new frames of every row (rows share it so one graph serves them)
    prefill_tokens: int = 0  # prefill: token bucket every row is padded to
    predicted_ms: float = 0.0

    @property
    def request_ids(self) -> tuple[int, ...]:
        return tuple(row.request_id for row in self.rows)

    @property
    def eos_possible(self) -> bool:
        """False: no row can end, so the executor need not read sampled tokens back to the host."""
        return any(row.eos_allowed for row in self.rows)


@dataclass(frozen=True, slots=True)
class Outcome:
    eos: frozenset[int] = frozenset()  # talker decode: rows that sampled EOS
    samples: Mapping[int, int] = field(default_factory=dict)  # codec: samples published (default N*1920)
    failed: Mapping[int, str] = field(default_factory=dict)  # rows that failed, with a message


@dataclass(frozen=True, slots=True)
class Admission:
    ok: bool
    reason: str = ""
    code: str = ""  # "overloaded" | "bad_request" when refused (the Error message code)
    predicted_ttfa_ms: float = 0.0
    utilization: float = 0.0  # predicted GPU share to keep every stream real-time, this one included


class SlackChunkPolicy:
    """Frames to decode now (0: wait); the scheduler's default, pace-aware chunk policy. The next chunk is the largest size the listener can afford to
    wait for: waiting for the missing frames at this request's own pace, then decoding them, must end
    `margin_ms` before its buffer runs dry. A thin buffer gives one-frame chunks, a growing one longer
    chunks (cheaper per frame), so small chunks are paid for only when they buy latency or safety.

    Unlike the policies of `engine.codec.chunking` (which the scheduler also accepts), it knows the
    request's own generation pace, so a stream generated far faster than real time moves to long,
    cheap chunks sooner, and one generated slowly under load keeps chunks short (docs/scheduling.md
    compares them). `frames_available` counts every generated frame; `buffered_ms` is the audio the
    listener still has (0 before first audio); `flush` drains what is pending."""

    def __init__(self, costs: CostModel, sizes: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 25),
                 first_chunk_frames: int = 1, margin_ms: float = 40.0) -> None:
        self.sizes = sizes
        self.first_chunk_frames = first_chunk_frames
        self.margin_ms = margin_ms
        # Largest first, with the time to decode that chunk alone (the policy runs per request per step).
        self._largest_first = [(n, costs.ms(WorkKind.CODEC_CHUNK, 1, n)) for n in reversed(sizes)]

    def next_chunk_frames(self, frames_decoded: int, frames_available: int, buffered_ms: float,
                          flush: bool, frame_interval_ms: float | None) -> int:
        pending = frames_available - frames_decoded
        if pending <= 0:
            return 0
        if flush:
            return min(pending, self.sizes[-1])
        if frames_decoded == 0 or frame_interval_ms is None:
            return self.first_chunk_frames if pending >= self.first_chunk_frames else 0
        budget = buffered_ms - self.margin_ms
        for n, decode_ms in self._largest_first:
            if max(0, n - pending) * frame_interval_ms + decode_ms <= budget:
                return n if pending >= n else 0
        # The buffer is nearly dry: hand over what exists, in an allowed size.
        return max((n for n in self.sizes if n <= pending), default=pending)


def next_size(sizes: tuple[int, ...], n: int) -> int:
    """Smallest capture size holding n rows (n never exceeds the largest: cohorts are cut first)."""
    return next(s for s in sizes if s >= n)


@dataclass(slots=True)
class _Item:
    request: RequestState
    kind: WorkKind
    key: tuple[float, ...]  # smaller is more pressing
    shape: int = 0  # compatibility: prefill token bucket, codec frames


# ---------------------------------------------------------------- scheduler


class Scheduler:
    def __init__(self, config: SchedulerConfig, costs: CostModel, chunks: ChunkPolicy | None = None) -> None:
        self.config = config
        self.costs = costs
        # Chunk sizes: the built-in pace-aware policy, or any `engine.codec.chunking.ChunkPolicy`.
        self.chunks = chunks
        self.slack_chunks = SlackChunkPolicy(costs, config.codec_chunk_sizes, config.first_chunk_frames,
                                             config.chunk_margin_ms)
        self.kv_slots = SlotPool("kv", config.max_requests)
        self.codec_slots = SlotPool("codec", config.max_codec_streams)
        self._requests: dict[int, RequestState] = {}
        self._finished: list[RequestState] = []
        self._served_at = {kind: 0 for kind in WorkKind}  # ROUND_ROBIN: plan counter per kind
        self._plans = 0
        self._urgent_ms = self._planned_ms = 0.0  # decaying sums over recent plans, see `pressure`
        # Time to decode n frames of one request, n = 0..largest chunk (slack needs it per request per step).
        self._codec_row_ms = [costs.ms(WorkKind.CODEC_CHUNK, 1, max(n, 1)) for n in range(config.codec_chunk_sizes[-1] + 1)]

    # ------------------------------------------------------------ queries

    def get(self, request_id: int) -> RequestState | None:
        return self._requests.get(request_id)

    @property
    def requests(self) -> Iterable[RequestState]:
        return self._requests.values()

    @property
    def active_count(self) -> int:
        return len(self._requests)

    def pop_finished(self) -> list[RequestState]:
        """Requests that reached DONE, CANCELLED or FAILED since the last call; their slots are free."""
        finished, self._finished = self._finished, []
        return finished

    # ------------------------------------------------------------ admission

    def admit(self, request: RequestState, now_ns: int) -> Admission:
        cfg = self.config
        refused = self._check_request(request)
        if refused:
            return Admission(False, refused, "bad_request")
        if self.kv_slots.free_count == 0:
            return Admission(False, f"all {cfg.max_requests} KV slots are in use", "overloaded")
        if self.codec_slots.free_count == 0:
            return Admission(False, f"all {cfg.max_codec_streams} codec slots are in use", "overloaded")
        streams = sum(1 for r in self._requests.values() if not r.generation_finished)
        utilization = self.realtime_utilization(streams + 1)
        ttfa_ms = self.predicted_ttfa_ms(now_ns)
        if cfg.admission_control and utilization > cfg.max_utilization:
            return Admission(False, f"keeping {streams + 1} streams real-time would need "
                             f"{utilization:.0%} of the GPU (limit {cfg.max_utilization:.0%})",
                             "overloaded", ttfa_ms, utilization)
        # Pressure only speaks for streams that are still playing: with none left there is no promise to break
        # (and no plans run to let the decaying average fall, so an idle engine would refuse forever).
        playing = any(not r.is_ended for r in self._requests.values())
        if cfg.admission_control and playing and self.pressure > cfg.max_pressure:
            return Admission(False, f"playing streams are near their deadlines ({self.pressure:.0%} of recent "
                             f"GPU time went to rescuing them, limit {cfg.max_pressure:.0%})",
                             "overloaded", ttfa_ms, utilization)
        if cfg.admission_control and ttfa_ms > cfg.ttfa_budget_ms:
            return Admission(False, f"predicted time to first audio {ttfa_ms:.0f} ms exceeds the "
                             f"{cfg.ttfa_budget_ms:.0f} ms budget", "overloaded", ttfa_ms, utilization)
        request.attach_slots(self.kv_slots, self.codec_slots)
        request.use_length_model = cfg.length_model
        request.max_frames = cfg.max_frames
        request.phase = Phase.PREFILL if request.has_text_for_next_step() else Phase.WAITING_TEXT
        if request.text_ended:
            self._close_text(request)
        self._requests[request.request_id] = request
        return Admission(True, "", "", ttfa_ms, utilization)

    def _check_request(self, request: RequestState) -> str:
        if request.request_id in self._requests:
            return f"request {request.request_id} is already running"
        if request.layout is Layout.NON_STREAMING and not request.text_ended:
            return "the non-streaming layout needs the whole text at submit (text_ended)"
        if request.text_ended and not request.text_ids:
            return "the text is empty"
        if request.prefill_len > self.config.prefill_token_buckets[-1]:
            return (f"prompt needs {request.prefill_len} prefill tokens, more than the "
                    f"{self.config.prefill_token_buckets[-1]} allowed")
        return ""

    def realtime_utilization(self, streams: int) -> float:
        """GPU share needed to give `streams` streams one frame each per 80 ms, decoded in typical chunks."""
        if streams <= 0:
            return 0.0
        cfg, costs = self.config, self.costs
        round_ms = _batched_ms(streams, cfg.capture_sizes, costs.frame_step_ms)
        chunk = cfg.typical_chunk_frames
        codec_ms = _batched_ms(streams, cfg.codec_capture_sizes,
                               lambda b: costs.ms(WorkKind.CODEC_CHUNK, b, chunk)) / chunk
        return (round_ms + codec_ms) / FRAME_MS

    def predicted_ttfa_ms(self, now_ns: int) -> float:
        """Time to first audio of a request admitted now: its own pipeline at today's batch sizes,
        stretched by the share of the GPU that playing streams need, plus half a step already running;
        never less than the wait of the oldest request still without audio (it is served before)."""
        cfg, costs = self.config, self.costs
        startup = 1 + sum(1 for r in self._requests.values() if r.first_audio_ns is None)
        generating = 1 + sum(1 for r in self._requests.values() if not r.generation_finished)
        batch = next_size(cfg.capture_sizes, min(generating, cfg.capture_sizes[-1]))
        prefill_rows = min(startup, cfg.prefill_capture_sizes[-1])
        prefill_rounds = math.ceil(startup / cfg.prefill_capture_sizes[-1])
        pipeline = (prefill_rounds * costs.ms(WorkKind.TALKER_PREFILL, prefill_rows, tokens=cfg.prefill_token_buckets[0])
                    + (cfg.first_chunk_frames + 1) * costs.ms(WorkKind.CODE_PREDICT, batch)
                    + cfg.first_chunk_frames * costs.ms(WorkKind.TALKER_DECODE, batch)
                    + costs.ms(WorkKind.CODEC_CHUNK, min(startup, cfg.codec_capture_sizes[-1]),
                               cfg.first_chunk_frames))
        busy = min(self.realtime_utilization(generating - 1), 0.95)
        oldest_wait_ms = max(((now_ns - r.arrival_ns) / 1e6 for r in self._requests.values()
                              if r.first_audio_ns is None), default=0.0)
        return max(pipeline / (1.0 - busy) + cfg.max_step_ms / 2, oldest_wait_ms)

    # ------------------------------------------------------------ input

    def append_text(self, request_id: int, text_ids: Iterable[int], chars: int) -> bool:
        """More stable text for a running request; False if it is unknown or already ended."""
        r = self._requests.get(request_id)
        if r is None or r.is_ended:
            return False
        if r.text_ended:
            raise ValueError(f"request {request_id}: text appended after its end")
        r.text_ids.extend(text_ids)
        r.text_chars += chars
        self._resume_if_text(r)
        return True

    def end_text(self, request_id: int) -> bool:
        r = self._requests.get(request_id)
        if r is None or r.is_ended:
            return False
        if r.text_ended:
            return True
        r.text_ended = True
        if not r.text_ids:
            self._fail(r, "the text ended without any text")
            return True
        self._close_text(r)
        self._resume_if_text(r)
        if not r.generation_busy and r.phase in (Phase.TALKER_DECODE, Phase.WAITING_TEXT):
            self._stop_if_due(r)
        return True

    def flush(self, request_id: int) -> bool:
        r = self._requests.get(request_id)
        if r is None or r.is_ended:
            return False
        r.flush_pending = True
        return True

    def set_deadline(self, request_id: int, deadline_ns: int) -> bool:
        """The gateway's absolute monotonic deadline; 0 returns to the first-audio assumption."""
        r = self._requests.get(request_id)
        if r is None or r.is_ended:
            return False
        r.deadline_ns = deadline_ns or None
        return True

    def cancel(self, request_id: int) -> bool:
        """Stop at once. Resources are released now, or when the plan holding the request completes."""
        r = self._requests.get(request_id)
        if r is None or r.is_ended:
            return False
        r.phase = Phase.CANCELLED
        self._retire_if_idle(r)
        return True

    def fail(self, request_id: int, message: str) -> bool:
        r = self._requests.get(request_id)
        if r is None or r.is_ended:
            return False
        self._fail(r, message)
        return True

    def _close_text(self, r: RequestState) -> None:
        cfg = self.config
        cap = max(cfg.runaway_min_frames, math.ceil(cfg.runaway_frames_per_char * r.text_chars))
        r.max_frames = min(cfg.max_frames, cap)
        if r.use_length_model:
            r.target_frames = length_model_frames(r.text_chars)

    def _resume_if_text(self, r: RequestState) -> None:
        if r.phase is Phase.WAITING_TEXT:
            r.phase = Phase.PREFILL if r.text_fed == 0 else Phase.TALKER_DECODE
            if not r.has_text_for_next_step():
                r.phase = Phase.WAITING_TEXT

    # ------------------------------------------------------------ planning

    def plan(self, now_ns: int) -> Plan | None:
        """The next batch to run, or None when nothing is ready (wait for input or a completion)."""
        items = self._ready_items(now_ns)
        if not items:
            return None
        anchor = self._anchor(items)
        cohort = sorted((i for i in items if i.kind is anchor.kind and _fits(anchor, i)), key=lambda i: i.key)
        cohort.remove(anchor)
        cohort.insert(0, anchor)
        self._plans += 1
        self._served_at[anchor.kind] = self._plans
        plan = self._lower(anchor.kind, anchor.shape, self._cut(anchor.kind, anchor.shape, cohort))
        # Pressure: the share of recent GPU time spent rescuing streams close to running dry.
        urgent = self.config.policy is Policy.DEADLINE and anchor.key[0] == 0
        self._urgent_ms = PRESSURE_DECAY * self._urgent_ms + (plan.predicted_ms if urgent else 0.0)
        self._planned_ms = PRESSURE_DECAY * self._planned_ms + plan.predicted_ms
        return plan

    def reset_history(self) -> None:
        """Forget recent load: e.g. after the warm-up synthesis, whose cold first steps say nothing about serving."""
        self._urgent_ms = self._planned_ms = 0.0

    @property
    def pressure(self) -> float:
        """Share of recent planned GPU time whose anchor was an urgent stream (0 idle .. 1 saturated)."""
        return self._urgent_ms / self._planned_ms if self._planned_ms else 0.0

    def _ready_items(self, now_ns: int) -> list[_Item]:
        cfg, costs = self.config, self.costs
        generating = sum(1 for r in self._requests.values() if r.phase in GENERATION_PHASES)
        batch = next_size(cfg.capture_sizes, min(max(generating, 1), cfg.capture_sizes[-1]))
        cp_ms, decode_ms = costs.ms(WorkKind.CODE_PREDICT, batch), costs.ms(WorkKind.TALKER_DECODE, batch)
        codec_ms = self._codec_row_ms
        items: list[_Item] = []
        for r in self._requests.values():
            gen_kind = None if r.generation_busy else PHASE_KIND.get(r.phase)
            chunk = 0 if r.codec_busy or r.frames_generated == r.frames_decoded else self._chunk_frames(r, now_ns)
            if gen_kind is None and chunk == 0:
                continue  # also every ended request: it has no phase to run and nothing to decode
            # Slack: buffered audio minus the time to produce the next audio (decode the pending frames,
            # or first generate one more frame).
            slack = 0.0
            if r.first_audio_ns is not None:
                deadline = r.effective_deadline_ns()
                assert deadline is not None
                slack = (deadline - now_ns) / 1e6 - codec_ms[min(max(chunk, 1), len(codec_ms) - 1)]
                if r.frames_generated == r.frames_decoded:
                    slack -= cp_ms + (decode_ms if r.phase is Phase.TALKER_DECODE else 0.0)
            if gen_kind is not None:
                shape = _bucket(cfg.prefill_token_buckets, r.prefill_len) if gen_kind is WorkKind.TALKER_PREFILL else 0
                items.append(_Item(r, gen_kind, self._key(r, gen_kind, slack), shape))
            if chunk:
                items.append(_Item(r, WorkKind.CODEC_CHUNK, self._key(r, WorkKind.CODEC_CHUNK, slack), chunk))
        return items

    def _chunk_frames(self, r: RequestState, now_ns: int) -> int:
        deadline = r.effective_deadline_ns()
        buffered_ms = 0.0 if deadline is None or r.first_audio_ns is None else (deadline - now_ns) / 1e6
        starved = r.phase is Phase.WAITING_TEXT  # the talker waits for text: hand the listener what exists
        drain = r.flush_pending or starved or r.generation_finished
        if self.chunks is not None:
            buffered = None if r.first_audio_ns is None else max(buffered_ms, 0.0)
            return self.chunks.next_chunk_frames(r.frames_decoded, r.frames_pending, buffered, r.text_ended, drain)
        return self.slack_chunks.next_chunk_frames(r.frames_decoded, r.frames_generated, max(buffered_ms, 0.0),
                                                   drain, r.frame_interval_ms)

    def _key(self, r: RequestState, kind: WorkKind, slack: float) -> tuple[float, ...]:
        rank = STAGE_RANK[kind]
        if self.config.policy is not Policy.DEADLINE:
            return (r.arrival_ns, rank)  # FIFO anchors by age; ROUND_ROBIN picks the kind first
        if r.first_audio_ns is None:
            return (1, rank, r.arrival_ns)
        if slack < self.config.urgent_slack_ms:
            return (0, slack, rank)
        return (2, slack, rank)

    def _anchor(self, items: list[_Item]) -> _Item:
        if self.config.policy is Policy.ROUND_ROBIN:
            ready = {i.kind for i in items}
            kind = min(ready, key=lambda k: (self._served_at[k], STAGE_RANK[k]))
            return min((i for i in items if i.kind is kind), key=lambda i: i.key)
        anchor = min(items, key=lambda i: i.key)
        if self.config.policy is Policy.DEADLINE and anchor.kind in MERGING_KINDS and self._may_merge(anchor):
            # Streams alternate code predictor and talker decode. When the other phase holds more rows,
            # run it first: its rows then join the anchor's phase and the next step serves everyone at
            # once, instead of two half-full steps per frame from here on.
            other = MERGING_KINDS[anchor.kind]
            others = [i for i in items if i.kind is other]
            if len(others) > sum(1 for i in items if i.kind is anchor.kind):
                return min(others, key=lambda i: i.key)
        return anchor

    def _may_merge(self, anchor: _Item) -> bool:
        """Never for urgent streams; for startup work only when `merge_startup` trades TTFA for throughput."""
        tier = anchor.key[0]
        return tier == 2 or (tier == 1 and self.config.merge_startup)

    def _cut(self, kind: WorkKind, shape: int, cohort: list[_Item]) -> list[_Item]:
        """Split oversize cohorts: keep the most pressing rows that fit a capture size and the step budget."""
        sizes = self._capture_sizes(kind)
        cohort = cohort[: sizes[-1]]
        while len(cohort) > 1 and self._predict(kind, next_size(sizes, len(cohort)), shape) > self.config.max_step_ms:
            smaller = max((s for s in sizes if s < len(cohort)), default=1)
            cohort = cohort[:smaller]
        return cohort

    def _capture_sizes(self, kind: WorkKind) -> tuple[int, ...]:
        if kind is WorkKind.TALKER_PREFILL:
            return self.config.prefill_capture_sizes
        if kind is WorkKind.CODEC_CHUNK:
            return self.config.codec_capture_sizes
        return self.config.capture_sizes

    def _predict(self, kind: WorkKind, padded: int, shape: int) -> float:
        if kind is WorkKind.TALKER_PREFILL:
            return self.costs.ms(kind, padded, tokens=shape)
        return self.costs.ms(kind, padded, frames=max(shape, 1))

    def _lower(self, kind: WorkKind, shape: int, cohort: list[_Item]) -> Plan:
        """Turn the cohort into rows and mark its lanes busy (text fed by a talker step counts as consumed)."""
        rows = []
        for item in cohort:
            r = item.request
            if kind is WorkKind.CODEC_CHUNK:
                r.codec_busy = True
                if r.flush_pending and shape >= r.frames_pending:
                    r.flush_pending = False
                final = r.generation_finished and shape == r.frames_pending
                rows.append(PlanRow(r.request_id, r.kv_slot, r.codec_slot, r.frames_decoded,
                                    codec_frames=shape, final_chunk=final))
                continue
            r.generation_busy = True
            if kind is WorkKind.TALKER_PREFILL:
                rows.append(PlanRow(r.request_id, r.kv_slot, r.codec_slot, 0, position=0))
                r.text_fed = 1 if r.layout is Layout.STREAMING else len(r.text_ids)
                r.text_end_fed = r.layout is Layout.NON_STREAMING
            elif kind is WorkKind.CODE_PREDICT:
                rows.append(PlanRow(r.request_id, r.kv_slot, r.codec_slot, r.frames_generated))
            else:
                frame = r.frames_generated - 1
                rows.append(PlanRow(r.request_id, r.kv_slot, r.codec_slot, frame, r.prefill_len + frame,
                                    r.next_text_input(), r.eos_allowed_next_step(self.config.min_frames_before_eos)))
                r.consume_text_input()
        padded = next_size(self._capture_sizes(kind), len(rows))
        return Plan(kind, tuple(rows), padded,
                    codec_frames=shape if kind is WorkKind.CODEC_CHUNK else 0,
                    prefill_tokens=shape if kind is WorkKind.TALKER_PREFILL else 0,
                    predicted_ms=self._predict(kind, padded, shape))

    # ------------------------------------------------------------ completion

    def complete(self, plan: Plan, outcome: Outcome, now_ns: int) -> None:
        """Apply what the executors did. Rows of requests cancelled meanwhile are dropped and released."""
        for row in plan.rows:
            r = self._requests.get(row.request_id)
            if r is None:
                continue
            if plan.kind is WorkKind.CODEC_CHUNK:
                r.codec_busy = False
            else:
                r.generation_busy = False
            if r.is_ended:
                self._retire_if_idle(r)
            elif row.request_id in outcome.failed:
                self._fail(r, outcome.failed[row.request_id])
            elif plan.kind is WorkKind.CODEC_CHUNK:
                self._apply_codec(r, row, outcome.samples.get(row.request_id), now_ns)
            else:
                self._apply_generation(r, plan.kind, row, row.request_id in outcome.eos, now_ns)

    def _apply_generation(self, r: RequestState, kind: WorkKind, row: PlanRow, eos: bool, now_ns: int) -> None:
        if kind is WorkKind.TALKER_PREFILL:
            r.phase = Phase.CODE_PREDICT  # the prefill sampled codebook 0 of frame 0 (EOS masked)
            return
        if kind is WorkKind.TALKER_DECODE:
            if eos and not row.eos_allowed:
                self._fail(r, "executor reported EOS on a row where it was masked")
            elif eos:
                self._finish_generation(r, FinishReason.EOS)
            else:
                r.phase = Phase.CODE_PREDICT
            return
        r.record_frame(now_ns)  # the code predictor completed frame `row.frame_index`
        r.phase = Phase.TALKER_DECODE if r.has_text_for_next_step() else Phase.WAITING_TEXT
        self._stop_if_due(r)

    def _stop_if_due(self, r: RequestState) -> None:
        if r.target_frames is not None and r.frames_generated >= r.target_frames:
            self._finish_generation(r, FinishReason.LENGTH_MODEL)
        elif r.frames_generated >= r.max_frames:
            self._finish_generation(r, FinishReason.RUNAWAY)

    def _apply_codec(self, r: RequestState, row: PlanRow, samples: int | None, now_ns: int) -> None:
        r.frames_decoded += row.codec_frames
        published = row.codec_frames * SAMPLES_PER_FRAME if samples is None else samples
        if published > 0 and r.first_audio_ns is None:
            r.first_audio_ns = now_ns
        r.samples_published += published
        if r.phase is Phase.FINISHING and r.frames_pending == 0:
            r.phase = Phase.DONE
            self._retire_if_idle(r)

    def _finish_generation(self, r: RequestState, reason: FinishReason) -> None:
        r.finish_reason = reason
        r.phase = Phase.FINISHING
        r.release_kv()  # generation is over: the talker slot can serve a newcomer while the codec drains
        if r.frames_pending == 0 and not r.codec_busy:
            r.phase = Phase.DONE
            self._retire_if_idle(r)

    def _fail(self, r: RequestState, message: str) -> None:
        r.phase = Phase.FAILED
        r.error = message
        self._retire_if_idle(r)

    def _retire_if_idle(self, r: RequestState) -> None:
        if r.generation_busy or r.codec_busy:
            return  # an executor still uses its slots; complete() retires it
        r.release()
        if self._requests.pop(r.request_id, None) is not None:
            self._finished.append(r)


def _fits(anchor: _Item, item: _Item) -> bool:
    """Can `item` share the anchor's batch? Prefill: same token bucket. Codec: rows decode the anchor's
    chunk size, so any row with at least that many frames ready joins (the rest waits for a later chunk;
    the codec's cost is mostly per step, so fuller steps beat equal-sized chunks)."""
    if anchor.kind is WorkKind.CODEC_CHUNK:
        return item.shape >= anchor.shape
    return item.shape == anchor.shape


def _bucket(buckets: tuple[int, ...], n: int) -> int:
    return next(b for b in buckets if b >= n)


def _batched_ms(rows: int, sizes: tuple[int, ...], step_ms: Callable[[int], float]) -> float:
    """Time to run `rows` rows in as few captured batches as possible."""
    full, rest = divmod(rows, sizes[-1])
    return full * step_ms(sizes[-1]) + (step_ms(next_size(sizes, rest)) if rest else 0.0)
