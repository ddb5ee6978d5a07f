"""Deadline-aware scheduler: each step advances the one batch of work that best protects every listener.

The one idea: every request is a cursor in two lanes, generation (prefill -> code predictor -> talker
decode -> code predictor ...) and codec (frames generated -> PCM). Each call to `plan(now)` picks an
*anchor*, the most pressing ready item, which decides the work kind; it then *fills* the batch with
every other ready item of that kind and shape, most pressing first, up to the largest capture size
and the step budget (`max_step_ms`, so no batch blocks a newcomer for long; `startup_codec_ms` for codec
batches while any request awaits its first audio). The rest waits a turn.

Who is most pressing (policy DEADLINE, the default):
  1. rescue: playing streams with slack < `rescue_slack_ms`, where
     slack = deadline - now - predicted time to produce their next audio;
  2. startup: requests without first audio (the TTFA path), their first codec chunk first, then
     prefill (it brings newcomers into step with the others), code predictor, talker decode;
  3. urgent: playing streams with slack < `urgent_slack_ms` (rescue and urgent work are what admission's
     pressure counts, unless the stream is near its deadline only because its text came late);
  4. everyone else by slack (earliest to run dry first): filler that builds buffers ahead.
FIFO and ROUND_ROBIN exist as baselines for the simulator (docs/scheduling.md compares them).

Chunk sizes: each request's next codec chunk is chosen from its remaining playback buffer and its
own generation pace (`engine.scheduling.chunk_sizing`; any `engine.codec.chunking` policy plugs in instead): one
frame while the listener has almost nothing, growing as the buffer grows. A codec batch takes the
anchor's chunk size, and every row with at least that many frames ready joins it.

Lanes (`Plan.lane`): generation plans queue on the generation lane, codec plans on the codec lane beside it
(the engine runs both lanes on one CUDA stream by default; `--codec-stream` gives the codec lane its own);
`plan(now, lanes)` plans only for lanes with room on the device. With `first_chunk_lane`, newcomers' first
chunks are codec plans of their own on the generation lane (right behind the code predictor that made their
frames), so no newcomer waits behind the codec lane, whose plans keep the whole step budget and the shape of
the playing streams' chunks. Codec gathering (`codec_gather_ms`): a codec-lane plan of filler rows starts at
most once per window, so rows share fewer, fuller plans; a row running low ends the wait (docs/scheduling.md).

Admission refuses, with a reason, a request that would push the GPU time needed to keep every stream
real-time past `max_utilization`, or whose predicted time to first audio exceeds `ttfa_budget_ms`;
also when KV or codec slots run out. The scheduler owns slot accounting (numbers only, no tensors).

Driving it (engine loop and simulator alike):
    admit(state, now) -> Admission; plan(now) -> Plan | None; <run the plan>;
    complete(plan, Outcome, now); pop_finished() -> requests that ended, resources already released.
Input: append_text / end_text / flush / cancel / set_deadline at any time. No torch, no clock reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter

from engine.codec.chunking import ChunkPolicy
from engine.ipc.messages import Layout
from engine.request import (
    SAMPLES_PER_FRAME,
    FinishReason,
    Phase,
    RequestState,
    SlotPool,
    WorkKind,
    length_model_frames,
    runaway_frame_cap,
)
from engine.scheduling import capacity
from engine.scheduling.capacity import batch_ms
from engine.scheduling.chunk_sizing import SlackChunkPolicy, request_chunk_frames
from engine.scheduling.config import Policy, SchedulerConfig, bucket, capture_sizes, next_size
from engine.scheduling.costmodel import CostModel
from engine.scheduling.pacing import Pace, pace_of
from engine.scheduling.plan import ALL_LANES, Admission, Lane, Outcome, Plan, PlanRow
from engine.scheduling.pressure import RescuePressure

# Public names; all but Scheduler live in the modules imported above and stay importable from here.
__all__ = ["Admission", "Lane", "Outcome", "Plan", "PlanRow", "Policy", "Scheduler", "SchedulerConfig",
           "SlackChunkPolicy", "next_size"]

GENERATION_PHASES = frozenset({Phase.PREFILL, Phase.CODE_PREDICT, Phase.TALKER_DECODE})
# Order of a request's own items when it is the anchor: audio out first, then the pipeline front.
STAGE_RANK = {WorkKind.CODEC_CHUNK: 0, WorkKind.TALKER_PREFILL: 1, WorkKind.CODE_PREDICT: 2,
              WorkKind.TALKER_DECODE: 3}
CODEC_RANK = STAGE_RANK[WorkKind.CODEC_CHUNK]
# Tiers of the DEADLINE policy's keys (first element; smaller goes first). Rescue and urgent are both playing
# streams near their deadlines (they count as rescue work for admission's pressure and keep their codec budget);
# only rescue goes before newcomers' startup work.
RESCUE, STARTUP, URGENT, FILLER = 0, 1, 2, 3
URGENT_TIERS = (RESCUE, URGENT)
# Codec gathering ends for a row this much before it would turn urgent: it runs as filler, never as the urgent
# anchor that admission's pressure counts as rescue work (on the H200 with WebSocket playback reports, gathered plans
# that waited until a row was urgent raised the pressure past its limit: 3.5 % refused at 40 RPS; eighteenth session).
GATHER_HEADROOM_MS = 20.0
# ... and stops while this share of admission's `max_pressure` is reached: near overload, rows that wait for the
# window end their wait behind a busier device (simulator, plain H200 costs, 200 RPS with 1,024 slots: 3-6 requests
# underran with 80 ms gathering ungated, none gated at 0.25-0.75; at the fast costs' 10-100 RPS, 0.75 changed nothing).
GATHER_MAX_PRESSURE = 0.75
MERGING_KINDS = {WorkKind.CODE_PREDICT: WorkKind.TALKER_DECODE, WorkKind.TALKER_DECODE: WorkKind.CODE_PREDICT}
PHASE_KIND = {Phase.PREFILL: WorkKind.TALKER_PREFILL, Phase.CODE_PREDICT: WorkKind.CODE_PREDICT,
              Phase.TALKER_DECODE: WorkKind.TALKER_DECODE}


@dataclass(slots=True)
class _Item:
    request: RequestState
    kind: WorkKind
    key: tuple[float, ...]  # smaller is more pressing
    shape: int = 0  # compatibility: prefill token bucket, codec frames
    filler: bool = False  # may join a batch, never anchor one (a paced stream within its lead)
    lane: Lane = Lane.GENERATION  # codec items: CODEC, or GENERATION for a first chunk (`first_chunk_lane`)
    early: bool = False  # a codec row its chunk policy would still hold back, offered to join (`codec_fill_frames`)


BY_KEY = attrgetter("key")  # sort and min items by key: a C getter, not a Python lambda per item


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
        self._codec_lane_started_ns: int | None = None  # codec gathering: when the last codec-lane plan began
        self.rescues = RescuePressure()  # admission's pressure over recent plans
        # Time to decode n frames of one request, n = 0..largest chunk (slack needs it per request per step).
        self._codec_row_ms = [costs.ms(WorkKind.CODEC_CHUNK, 1, max(n, 1))
                              for n in range(config.codec_chunk_sizes[-1] + 1)]
        # Codec gathering: a row with less slack than this no longer waits for the window (`_gathering`), and the
        # loop wakes when a waiting row gets there (`_gather_closes_ns`).
        self._gather_min_slack_ms = config.urgent_slack_ms + GATHER_HEADROOM_MS

    # ------------------------------------------------------------ queries

    def get(self, request_id: int) -> RequestState | None:
        return self._requests.get(request_id)

    @property
    def requests(self) -> Iterable[RequestState]:
        return self._requests.values()

    @property
    def active_count(self) -> int:
        return len(self._requests)

    @property
    def generating_count(self) -> int:
        """Requests whose generation is not over: the streams that must be kept real-time."""
        return sum(1 for r in self._requests.values() if not r.generation_finished)

    def pop_finished(self) -> list[RequestState]:
        """Requests that reached DONE, CANCELLED or FAILED since the last call; their slots are free."""
        finished, self._finished = self._finished, []
        return finished

    # ------------------------------------------------------------ admission

    def admit(self, request: RequestState, now_ns: int) -> Admission:
        cfg = self.config
        refused = self._check_request(request)
        if refused:
            return Admission(False, refused, "bad_request", rule="request")
        if self.kv_slots.free_count == 0:
            return Admission(False, f"all {cfg.max_requests} KV slots are in use", "overloaded", rule="slots")
        if self.codec_slots.free_count == 0:
            return Admission(False, f"all {cfg.max_codec_streams} codec slots are in use", "overloaded",
                             rule="slots")
        streams = self.generating_count
        utilization = self.realtime_utilization(streams + 1)
        ttfa_ms = self.predicted_ttfa_ms(now_ns)
        if cfg.admission_control and utilization > cfg.max_utilization:
            return Admission(False, f"keeping {streams + 1} streams real-time would need "
                             f"{utilization:.0%} of the GPU (limit {cfg.max_utilization:.0%})",
                             "overloaded", ttfa_ms, utilization, "utilization")
        # Pressure only speaks for streams that are still playing: with none left there is no promise to break
        # (and no plans run to let the decaying average fall, so an idle engine would refuse forever).
        playing = any(not r.is_ended for r in self._requests.values())
        if cfg.admission_control and playing and self.pressure > cfg.max_pressure:
            return Admission(False, f"playing streams are near their deadlines ({self.pressure:.0%} of recent GPU "
                             f"time went to rescuing them: {self.rescues.describe()}; limit {cfg.max_pressure:.0%})",
                             "overloaded", ttfa_ms, utilization, "pressure")
        if cfg.admission_control and ttfa_ms > cfg.ttfa_budget_ms:
            return Admission(False, f"predicted time to first audio {ttfa_ms:.0f} ms exceeds the "
                             f"{cfg.ttfa_budget_ms:.0f} ms budget", "overloaded", ttfa_ms, utilization, "ttfa")
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
        return capacity.realtime_utilization(self.config, self.costs, streams)

    def predicted_ttfa_ms(self, now_ns: int) -> float:
        """Time to first audio of a request admitted now (`engine.scheduling.capacity.predicted_ttfa_ms`)."""
        startup = 1 + sum(1 for r in self._requests.values() if r.first_audio_ns is None)
        generating = 1 + self.generating_count
        oldest_wait_ms = max(((now_ns - r.arrival_ns) / 1e6 for r in self._requests.values()
                              if r.first_audio_ns is None), default=0.0)
        return capacity.predicted_ttfa_ms(self.config, self.costs, startup, generating, oldest_wait_ms)

    # ------------------------------------------------------------ input

    def append_text(self, request_id: int, text_ids: Iterable[int], chars: int) -> bool:
        """More stable text for a running request; False if it is unknown or already ended."""
        r = self._live(request_id)
        if r is None:
            return False
        if r.text_ended:
            raise ValueError(f"request {request_id}: text appended after its end")
        r.text_ids.extend(text_ids)
        r.text_chars += chars
        self._resume_if_text(r)
        return True

    def _live(self, request_id: int) -> RequestState | None:
        """The request, unless it is unknown or has ended (input for it is then ignored)."""
        r = self._requests.get(request_id)
        return None if r is None or r.is_ended else r

    def end_text(self, request_id: int) -> bool:
        r = self._live(request_id)
        if r is None:
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
        r = self._live(request_id)
        if r is None:
            return False
        r.flush_pending = True
        return True

    def set_deadline(self, request_id: int, deadline_ns: int, samples: int | None = None) -> bool:
        """The gateway's absolute monotonic deadline for the listener that was sent `samples` of the audio (None:
        the deadline holds as it is; `RequestState.effective_deadline_ns`); 0 returns to the first-audio
        assumption."""
        r = self._live(request_id)
        if r is None:
            return False
        r.deadline_ns, r.deadline_samples = (deadline_ns, samples) if deadline_ns else (None, None)
        return True

    def cancel(self, request_id: int) -> bool:
        """Stop at once. Resources are released now, or when the plan holding the request completes."""
        r = self._live(request_id)
        if r is None:
            return False
        r.phase = Phase.CANCELLED
        self._retire_if_idle(r)
        return True

    def fail(self, request_id: int, message: str) -> bool:
        r = self._live(request_id)
        if r is None:
            return False
        self._fail(r, message)
        return True

    def _close_text(self, r: RequestState) -> None:
        cfg = self.config
        cap = runaway_frame_cap(len(r.text_ids), cfg.runaway_base_frames, cfg.runaway_frames_per_token)
        r.max_frames = min(cfg.max_frames, cap)
        if r.use_length_model:
            r.target_frames = length_model_frames(r.text_chars)

    def _resume_if_text(self, r: RequestState) -> None:
        if r.phase is Phase.WAITING_TEXT:
            r.phase = Phase.PREFILL if r.text_fed == 0 else Phase.TALKER_DECODE
            if not r.has_text_for_next_step():
                r.phase = Phase.WAITING_TEXT

    # ------------------------------------------------------------ planning

    def plan(self, now_ns: int, lanes: frozenset[Lane] = ALL_LANES) -> Plan | None:
        """The next batch to run on one of `lanes` (those with room on the device), or None when nothing is
        ready there (wait for input or a completion)."""
        items = self._ready_items(now_ns, lanes)
        anchors = [i for i in items if not i.filler]
        if not anchors:
            return None  # nothing, or only paced streams that may join a batch but not start one
        anchor = self._anchor(anchors)
        if self._gathering(anchor, now_ns):  # the codec lane waits for more rows: plan for the other lane
            items = [i for i in items if i.lane is not Lane.CODEC]
            anchors = [i for i in anchors if i.lane is not Lane.CODEC]
            if not anchors:
                return None
            anchor = self._anchor(anchors)
        ragged = self.config.ragged_codec
        ratio = self.config.codec_join_ratio
        kind, lane = anchor.kind, anchor.lane
        cohort = sorted((i for i in items if i.kind is kind and i.lane is lane and not i.early
                         and _fits(anchor, i, ragged, ratio)), key=BY_KEY)  # fmt: skip
        cohort.remove(anchor)
        cohort.insert(0, anchor)
        self._plans += 1
        self._served_at[anchor.kind] = self._plans
        first_chunks = anchor.kind is WorkKind.CODEC_CHUNK and anchor.lane is Lane.GENERATION
        if anchor.kind is WorkKind.CODEC_CHUNK and anchor.lane is Lane.CODEC:
            self._codec_lane_started_ns = now_ns
        rows = self._cut(anchor.kind, anchor.shape, cohort, first_chunks)
        shape = self._ragged_frames(rows, first_chunks) if anchor.kind is WorkKind.CODEC_CHUNK and ragged \
            else anchor.shape
        if anchor.kind is WorkKind.CODEC_CHUNK and anchor.lane is Lane.CODEC and not ragged:
            rows = self._fill_early(rows, [i for i in items if i.early], shape)
        plan = self._lower(anchor.kind, shape, rows, first_chunks)
        # Pressure: the share of recent GPU time spent rescuing streams close to running dry for want of GPU time.
        # A stream whose text came late is near its deadline on an idle GPU too: it does not make a plan a rescue.
        urgent = self.config.policy is Policy.DEADLINE and anchor.key[0] in URGENT_TIERS and any(
            i.key[0] in URGENT_TIERS and not i.request.text_starved for i in rows)
        self.rescues.record(anchor.kind, plan.predicted_ms, urgent)
        return plan

    def next_wake_ns(self, now_ns: int) -> int | None:
        """When a paced request may start a batch of its own again, or the codec lane's gathering window ends
        (the loop sleeps no longer than this)."""
        times: list[int | None] = []
        if self.pacing_allowed:
            times += [pace_of(r, now_ns)[1] for r in self._requests.values()
                      if not r.generation_busy and r.phase in PHASE_KIND]
        gathered = self._gather_ends_ns()
        if gathered is not None and gathered > now_ns:
            waiting = [r for r in self._requests.values() if r.frames_generated > r.frames_decoded and not r.codec_busy]
            if waiting:  # frames wait to be decoded: they may be gathering, until the window ends or, sooner, a
                times.append(gathered)  # row's slack runs down to the headroom (nothing else may wake the loop)
                # (a row past it already waits only for a busy codec lane, whose plan's end wakes the loop)
                times += [t for r in waiting if r.first_audio_ns is not None
                          and (t := self._gather_closes_ns(r)) is not None and t > now_ns]
        return min((t for t in times if t is not None), default=None)

    def _gather_closes_ns(self, r: RequestState) -> int | None:
        """A moment by which playing request `r`'s codec row may no longer gather: its slack (buffered audio less
        its chunk's decode, as `_ready_items` counts it) is below `urgent_slack_ms + GATHER_HEADROOM_MS` even for a
        one-frame chunk, the cheapest (so at most a chunk's extra decode time late, and never early)."""
        deadline = r.effective_deadline_ns()
        if deadline is None:
            return None
        return deadline - int((self._gather_min_slack_ms + self._codec_row_ms[1]) * 1e6) + 1_000

    def _gather_ends_ns(self) -> int | None:
        if self.config.codec_gather_ms <= 0 or self._codec_lane_started_ns is None:
            return None
        return self._codec_lane_started_ns + int(self.config.codec_gather_ms * 1e6)

    def _gathering(self, anchor: _Item, now_ns: int) -> bool:
        """A codec-lane anchor that may wait for more rows (`codec_gather_ms`): filler only (so is every row
        behind it) with `GATHER_HEADROOM_MS` of slack to spare, slots plentiful (a request's slots are not held
        longer while they run short), pressure below `GATHER_MAX_PRESSURE` of its limit, and the last codec-lane
        plan started less than the window ago."""
        ends = self._gather_ends_ns()
        return (ends is not None and now_ns < ends and anchor.kind is WorkKind.CODEC_CHUNK
                and anchor.lane is Lane.CODEC and self.config.policy is Policy.DEADLINE
                and anchor.key[0] == FILLER and anchor.key[1] >= self._gather_min_slack_ms
                and self.slots_plentiful and self.pressure < GATHER_MAX_PRESSURE * self.config.max_pressure)  # fmt: skip

    @property
    def slots_plentiful(self) -> bool:
        """At least `pacing_min_free_share` of the KV and of the codec slots are free. Below that the GPU's
        throughput is the limit: paced streams generate at full speed (they finish and make room for
        newcomers) and batches may take `saturated_step_ms`."""
        share = self.config.pacing_min_free_share
        return (self.kv_slots.free_count >= share * self.kv_slots.size
                and self.codec_slots.free_count >= share * self.codec_slots.size)

    @property
    def pacing_allowed(self) -> bool:
        """Pacing keeps a stream's KV and codec slots until its audio is nearly played, while slots are
        plentiful."""
        return self.slots_plentiful

    def reset_history(self) -> None:
        """Forget recent load: e.g. after the warm-up synthesis, whose cold first steps say nothing about
        serving."""
        self.rescues.reset()

    @property
    def pressure(self) -> float:
        """Share of recent planned GPU time whose anchor was an urgent stream (0 idle .. 1 saturated), not counting
        plans whose only urgent rows are streams short of text (`RequestState.text_starved`); `rescues` has its
        parts by work kind."""
        return self.rescues.share

    def _ready_items(self, now_ns: int, lanes: frozenset[Lane] = ALL_LANES) -> list[_Item]:
        """Every request's next work item on `lanes`, with its key. The engine loop calls this before each plan
        (hundreds of times a second over every active request), so requests with nothing to offer on an open lane
        are passed over before anything is computed for them, and what is the same for every request (config,
        costs, enum members) is read once per call, into locals, not once per request."""
        cfg, costs = self.config, self.costs
        generating = sum(1 for r in self._requests.values() if r.phase in GENERATION_PHASES)
        batch = next_size(cfg.capture_sizes, min(max(generating, 1), cfg.capture_sizes[-1]))
        cp_ms, decode_ms = costs.ms(WorkKind.CODE_PREDICT, batch), costs.ms(WorkKind.TALKER_DECODE, batch)
        codec_ms = self._codec_row_ms
        items: list[_Item] = []
        pacing = self.pacing_allowed
        generation_open, codec_open = Lane.GENERATION in lanes, Lane.CODEC in lanes  # (Lane hashes in Python)
        codec_lane = Lane.CODEC
        first_chunk_lane = Lane.GENERATION if cfg.first_chunk_lane else codec_lane
        first_chunk_open = generation_open if cfg.first_chunk_lane else codec_open
        fill, largest_chunk, last_row = cfg.codec_fill_frames, cfg.codec_chunk_sizes[-1], len(codec_ms) - 1
        slack_chunks, chunks, append = self.slack_chunks, self.chunks, items.append
        by_deadline, rescue_ms, urgent_ms = cfg.policy is Policy.DEADLINE, cfg.rescue_slack_ms, cfg.urgent_slack_ms
        codec, prefill, talker_decode = WorkKind.CODEC_CHUNK, WorkKind.TALKER_PREFILL, Phase.TALKER_DECODE
        free, held, filler = Pace.FREE, Pace.HELD, Pace.FILLER
        slack_chunk, waiting_text, finishing = slack_chunks.next_chunk_frames, Phase.WAITING_TEXT, Phase.FINISHING
        for r in self._requests.values():
            phase = r.phase
            gen_kind = None if r.generation_busy or not generation_open else PHASE_KIND.get(phase)
            newcomer = r.first_audio_ns is None
            offer_codec = first_chunk_open if newcomer else codec_open  # if not, its chunk still sets its slack
            pending = r.frames_generated - r.frames_decoded
            no_chunk = r.codec_busy or pending == 0
            if gen_kind is None and (no_chunk or not offer_codec):
                continue  # nothing to offer on an open lane (also every ended request)
            paced = pacing and r.max_lead_ms > 0 and phase in PHASE_KIND  # else pace_of says FREE
            pace = pace_of(r, now_ns)[0] if paced else free
            if pace is held:
                gen_kind = None  # far enough ahead of its listener: leave the GPU to others for now
            # The gateway's deadline when it sent one (moved on by the audio published since), else the
            # first-audio assumption: `effective_deadline_ns`.
            deadline = None if newcomer else r.effective_deadline_ns()
            if no_chunk:
                chunk = 0
            elif chunks is None:
                # `request_chunk_frames` for the default policy, inlined (one call per request instead of two;
                # tests/scheduler/test_chunk_sizing.py holds them equal):
                # drain on a flush, while the talker waits for text, once generation is over, or while paced.
                drain = r.flush_pending or phase is waiting_text or phase >= finishing or pace is not free
                buffered_ms = 0.0 if newcomer or deadline <= now_ns else (deadline - now_ns) / 1e6
                chunk = slack_chunk(r.frames_decoded, r.frames_generated, buffered_ms, drain, r.frame_interval_ms)
            else:
                chunk = request_chunk_frames(r, now_ns, slack_chunks, chunks, pace is not free, deadline)
            early = chunk == 0 and fill > 0 and not r.codec_busy and not newcomer and pending >= fill
            if gen_kind is None and not (offer_codec and (chunk or early)):
                continue
            # Keys, smaller is more pressing (`_anchor`, cohorts): FIFO anchors by age, ROUND_ROBIN picks the kind
            # first; DEADLINE puts newcomers' startup work by stage and age, playing streams by tier and slack.
            # Built here rather than by a method: this runs for every item of every plan call.
            gen_rank = 0 if gen_kind is None else STAGE_RANK[gen_kind]
            if not by_deadline:
                gen_key, codec_key = (r.arrival_ns, gen_rank), (r.arrival_ns, CODEC_RANK)
            elif newcomer:
                gen_key, codec_key = (STARTUP, gen_rank, r.arrival_ns), (STARTUP, CODEC_RANK, r.arrival_ns)
            else:
                # Slack: buffered audio minus the time to produce the next audio (decode the pending frames,
                # or first generate one more frame). codec_ms[0] is one frame's time: a chunk of 0 (waiting)
                # decodes at least its next frame.
                slack = (deadline - now_ns) / 1e6 - codec_ms[chunk if chunk <= last_row else last_row]
                if pending == 0:
                    slack -= cp_ms + (decode_ms if phase is talker_decode else 0.0)
                tier = RESCUE if slack < rescue_ms else URGENT if slack < urgent_ms else FILLER
                if tier == FILLER:
                    r.text_starved = False  # a healthy buffer again: from here on, nearness is the GPU's doing
                gen_key, codec_key = (tier, slack, gen_rank), (tier, slack, CODEC_RANK)
            if gen_kind is not None:
                shape = bucket(cfg.prefill_token_buckets, r.prefill_len) if gen_kind is prefill else 0
                append(_Item(r, gen_kind, gen_key, shape, pace is filler))
            if not offer_codec:
                continue
            # (_Item's fields by position: keywords cost a little more, for every item of every plan call.)
            if chunk:  # not filler, on the first-chunk lane or the codec lane
                append(_Item(r, codec, codec_key, chunk, False, first_chunk_lane if newcomer else codec_lane))
            elif early:  # joins a codec-lane batch that runs anyway with what it has; never starts one
                # its shape: what it has; filler, on the codec lane, early
                append(_Item(r, codec, codec_key, min(pending, largest_chunk), True, codec_lane, True))
        return items

    def _anchor(self, items: list[_Item]) -> _Item:
        if self.config.policy is Policy.ROUND_ROBIN:
            ready = {i.kind for i in items}
            kind = min(ready, key=lambda k: (self._served_at[k], STAGE_RANK[k]))
            return min((i for i in items if i.kind is kind), key=BY_KEY)
        anchor = min(items, key=BY_KEY)
        if self.config.policy is not Policy.DEADLINE:
            return anchor
        if (anchor.kind is WorkKind.TALKER_PREFILL and anchor.key[0] == STARTUP and self.config.align_startup_rows
                and not self.slots_plentiful):
            # Slots run short, so throughput is what admits the next request: prefill right after the others'
            # talker decode, not before it. The newcomer's code predictor then runs in the same plan as theirs
            # instead of alone (it costs about the same at 1 row as at 128), for one decode step on its TTFA.
            # Only while decoders and newcomers fit one code-predictor plan: a split plan merges nothing.
            decodes = [i for i in items if i.kind is WorkKind.TALKER_DECODE]
            predicts = sum(1 for i in items if i.kind is WorkKind.CODE_PREDICT)
            newcomers = sum(1 for i in items if i.kind is WorkKind.TALKER_PREFILL)
            if (len(decodes) >= self.config.align_startup_rows and len(decodes) > predicts
                    and len(decodes) + predicts + newcomers <= self.config.capture_sizes[-1]):
                return min(decodes, key=BY_KEY)
        if anchor.kind in MERGING_KINDS and self._may_merge(anchor):
            # Streams alternate code predictor and talker decode. When the other phase holds more rows,
            # run it first: its rows then join the anchor's phase and the next step serves everyone at
            # once, instead of two half-full steps per frame from here on.
            other = MERGING_KINDS[anchor.kind]
            others = [i for i in items if i.kind is other]
            if len(others) > sum(1 for i in items if i.kind is anchor.kind):
                return min(others, key=BY_KEY)
        return anchor

    def _may_merge(self, anchor: _Item) -> bool:
        """Never for urgent streams; for startup work only when `merge_startup` trades TTFA for throughput."""
        tier = anchor.key[0]
        return tier == FILLER or (tier == STARTUP and self.config.merge_startup)

    def _budget_ms(self, kind: WorkKind, cohort: list[_Item], first_chunks: bool = False) -> float:
        """How long this batch may take: `max_step_ms` (`saturated_step_ms` while slots run short), and for a
        codec batch a newcomer could wait behind (first-chunk plans; with no first-chunk lane, any codec plan)
        `startup_codec_ms` while a newcomer waits, unless its anchor is urgent."""
        budget_ms = self.config.max_step_ms
        if not self.slots_plentiful:
            budget_ms = max(budget_ms, self.config.saturated_step_ms)
        urgent = self.config.policy is Policy.DEADLINE and cohort and cohort[0].key[0] in URGENT_TIERS
        in_newcomers_way = first_chunks or not self.config.first_chunk_lane
        if kind is WorkKind.CODEC_CHUNK and in_newcomers_way and not urgent and self.startup_waiting:
            # A newcomer must not wait behind a long codec batch; a rescue of a stream about to run dry
            # (an urgent anchor) keeps its full budget, or playing streams would underrun under overload.
            budget_ms = min(budget_ms, self.config.startup_codec_ms)
        return budget_ms

    def _cut(self, kind: WorkKind, shape: int, cohort: list[_Item], first_chunks: bool = False) -> list[_Item]:
        """Split oversize cohorts: keep the most pressing rows that fit a capture size and the step budget."""
        sizes = capture_sizes(self.config, kind, first_chunks)
        cohort = cohort[: sizes[-1]]
        budget_ms = self._budget_ms(kind, cohort, first_chunks)
        while len(cohort) > 1 and batch_ms(self.costs, kind, next_size(sizes, len(cohort)), shape) > budget_ms:
            smaller = max((s for s in sizes if s < len(cohort)), default=1)
            cohort = cohort[:smaller]
        return cohort

    def _fill_early(self, rows: list[_Item], early: list[_Item], frames: int) -> list[_Item]:
        """Early rows (`codec_fill_frames`) with `frames` ready join a codec-lane batch of due rows, most pressing
        first, into its padding for free, and beyond it while the batch stays within `codec_fill_ms`: so they never
        make a plan much longer than its due rows need, and a stream that falls due meanwhile never waits long
        behind the codec lane."""
        cfg = self.config
        if not cfg.codec_fill_frames or frames < cfg.codec_fill_frames:
            return rows
        sizes = cfg.codec_capture_sizes
        padded = next_size(sizes, len(rows))
        rows = list(rows)
        for item in sorted(early, key=BY_KEY):
            if len(rows) == sizes[-1]:
                break
            if item.shape < frames:
                continue
            grown = next_size(sizes, len(rows) + 1)
            if grown > padded and batch_ms(self.costs, WorkKind.CODEC_CHUNK, grown, frames) > cfg.codec_fill_ms:
                break
            rows.append(item)
            padded = grown
        return rows

    def _ragged_frames(self, cohort: list[_Item], first_chunks: bool = False) -> int:
        """Ragged codec: the batch's frames, i.e. the largest row's chunk snapped up to a chunk size, shrunk
        while the batch would overrun its budget (never below the anchor's chunk, which `_cut` fitted)."""
        sizes, anchor = self.config.codec_chunk_sizes, cohort[0].shape
        padded = next_size(capture_sizes(self.config, WorkKind.CODEC_CHUNK, first_chunks), len(cohort))
        budget_ms = self._budget_ms(WorkKind.CODEC_CHUNK, cohort, first_chunks)
        want = max(item.shape for item in cohort)
        frames = next((n for n in sizes if n >= want), sizes[-1])
        while frames > anchor and batch_ms(self.costs, WorkKind.CODEC_CHUNK, padded, frames) > budget_ms:
            frames = max((n for n in sizes if n < frames), default=anchor)
        return max(frames, anchor)

    @property
    def startup_waiting(self) -> bool:
        """Some admitted request has no audio yet (its first steps are on the TTFA path)."""
        return any(r.first_audio_ns is None and not r.is_ended for r in self._requests.values())

    def _lower(self, kind: WorkKind, shape: int, cohort: list[_Item], first_chunks: bool = False) -> Plan:
        """Turn the cohort into rows and mark its lanes busy (text fed by a talker step counts as
        consumed)."""
        rows: list[PlanRow] = []
        append = rows.append  # (one loop per kind, no per-row kind tests: up to 128 rows a plan)
        if kind is WorkKind.CODEC_CHUNK:
            for item in cohort:
                r = item.request
                frames = min(item.shape, shape)  # uniform batches: every row decodes `shape` (its chunk >= shape)
                r.codec_busy = True
                if r.flush_pending and frames >= r.frames_pending:
                    r.flush_pending = False
                final = r.generation_finished and frames == r.frames_pending
                append(PlanRow(r.request_id, r.kv_slot, r.codec_slot, r.frames_decoded,
                               codec_frames=frames, final_chunk=final))
        elif kind is WorkKind.TALKER_PREFILL:
            for item in cohort:
                r = item.request
                r.generation_busy = True
                append(PlanRow(r.request_id, r.kv_slot, r.codec_slot, 0, position=0))
                r.text_fed = 1 if r.layout is Layout.STREAMING else len(r.text_ids)
                r.text_end_fed = r.layout is Layout.NON_STREAMING
        elif kind is WorkKind.CODE_PREDICT:
            for item in cohort:
                r = item.request
                r.generation_busy = True
                append(PlanRow(r.request_id, r.kv_slot, r.codec_slot, r.frames_generated))
        else:
            min_frames = self.config.min_frames_before_eos
            for item in cohort:
                r = item.request
                r.generation_busy = True
                frame = r.frames_generated - 1
                text_index = r.next_text_input()
                eos_allowed = r.eos_allowed_next_step(min_frames)
                append(PlanRow(r.request_id, r.kv_slot, r.codec_slot, frame, r.prefill_len + frame, text_index,
                               eos_allowed))
                r.consume_text_input()
        padded = next_size(capture_sizes(self.config, kind, first_chunks), len(rows))
        return Plan(kind, tuple(rows), padded,
                    codec_frames=shape if kind is WorkKind.CODEC_CHUNK else 0,
                    prefill_tokens=shape if kind is WorkKind.TALKER_PREFILL else 0,
                    predicted_ms=batch_ms(self.costs, kind, padded, shape), first_chunks=first_chunks)

    # ------------------------------------------------------------ completion

    def complete(self, plan: Plan, outcome: Outcome, now_ns: int) -> None:
        """Apply what the executors did. Rows of requests cancelled meanwhile are dropped and released."""
        kind, requests, failed = plan.kind, self._requests, outcome.failed  # (read once: up to 128 rows a plan)
        codec = kind is WorkKind.CODEC_CHUNK
        for row in plan.rows:
            request_id = row.request_id
            r = requests.get(request_id)
            if r is None:
                continue
            if codec:
                r.codec_busy = False
            else:
                r.generation_busy = False
            if r.is_ended:
                self._retire_if_idle(r)
            elif request_id in failed:
                self._fail(r, failed[request_id])
            elif codec:
                self._apply_codec(r, row, outcome.samples.get(request_id), now_ns)
            else:
                self._apply_generation(r, kind, row, request_id in outcome.eos, now_ns)

    def _apply_generation(self, r: RequestState, kind: WorkKind, row: PlanRow, eos: bool,
                          now_ns: int) -> None:
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
        if r.has_text_for_next_step():
            r.phase = Phase.TALKER_DECODE
        else:
            r.phase, r.text_starved = Phase.WAITING_TEXT, True
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


def _fits(anchor: _Item, item: _Item, ragged_codec: bool = False, join_ratio: float = 0.0) -> bool:
    """Can `item` share the anchor's batch? Prefill: same token bucket. Codec: rows decode the anchor's
    chunk size, so any row with at least that many frames ready joins (the rest waits for a later chunk;
    the codec's cost is mostly per step, so fuller steps beat equal-sized chunks); ragged, every row joins.
    With `join_ratio` > 0 a row that could decode more than `join_ratio` times the anchor's chunk joins only
    when it is urgent: else it would decode a sliver of what it has ready (a newcomer's 1-2 frame chunk sets
    the shape) and the codec's cost per frame triples; it waits for a batch of its own size instead."""
    if anchor.kind is WorkKind.CODEC_CHUNK:
        if ragged_codec:
            return True
        if item.shape < anchor.shape:
            return False
        return not join_ratio or item.shape <= join_ratio * anchor.shape or item.key[0] in URGENT_TIERS
    return item.shape == anchor.shape
