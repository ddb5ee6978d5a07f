"""What the scheduler may run: its settings, and the padded batch shapes those settings allow.

Plain Python (no torch, no clock reads), shared by the scheduler, the simulator and the engine settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from engine.request import WorkKind


class Policy(Enum):
    DEADLINE = "deadline"  # urgent streams > startup > the rest by slack (engine/scheduling/scheduler.py's docstring)
    FIFO = "fifo"  # the oldest request's next item anchors: plain continuous batching, no priorities
    ROUND_ROBIN = "round_robin"  # the kind served least recently anchors (the peer's "balanced" profile)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    capture_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)  # talker decode and code predictor
    prefill_capture_sizes: tuple[int, ...] = (1, 2, 4, 8)
    prefill_token_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)  # last = longest prefill
    codec_capture_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64)  # (engine.settings.codec_sizes_up_to)
    codec_chunk_sizes: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 25)  # steady chunks snap to these
    max_requests: int = 256  # talker KV slots (cohorts above the largest capture split)
    max_codec_streams: int = 256  # codec state slots
    max_step_ms: float = 12.0  # a batch is cut so its predicted time stays under this (anchor always runs)
    # ... or under this (if larger) while slots run short (fewer than `pacing_min_free_share` free): the GPU is then the
    # limit, and fuller codec steps (more frames per row) free slots sooner; newcomers may wait longer.
    saturated_step_ms: float = 25.0
    startup_codec_ms: float = 4.0  # ... and a codec batch under this while any request awaits its first audio
    urgent_slack_ms: float = 60.0  # a playing stream this near running dry is urgent: rescue work for admission
    # ... and with less slack than this it also goes before newcomers' startup work. Lower than urgent: streams
    # that have just started (80-160 ms buffered) are urgent, and at 60 ms they held every newcomer's first chunk
    # back (tools/ttfa_trace.py on the H200; simulator at 40 RPS: p95 TTFA 33 -> 17 ms; docs/scheduling.md).
    rescue_slack_ms: float = 40.0
    first_chunk_frames: int = 1  # 2 when the engine drops the fixed silent first frame
    chunk_margin_ms: float = 40.0  # a chunk must be out this long before its listener would run dry
    typical_chunk_frames: int = 8  # codec shape assumed by admission's real-time demand
    max_utilization: float = 0.8  # admission: GPU share needed to keep every stream real-time
    ttfa_budget_ms: float = 250.0  # admission: refuse when the predicted TTFA is larger
    max_pressure: float = 0.7  # admission: refuse while more recent GPU time went to urgent streams
    admission_control: bool = True  # False: only slot and shape limits (the simulator's baselines)
    max_frames: int = 2048  # runaway cap (164 s) while the text is open
    runaway_base_frames: int = 64  # cap once the text ended: base + per_token * text tokens
    runaway_frames_per_token: int = 8  # (engine.request.runaway_frame_cap, as the reference loop)
    min_frames_before_eos: int = 2  # official min_new_tokens
    pacing_min_free_share: float = 0.25  # pacing (max_lead_ms) applies only while this share of slots is free
    length_model: bool = False  # random weights: stop at length_model_frames(chars), never at EOS
    policy: Policy = Policy.DEADLINE
    merge_startup: bool = False  # let a newcomer wait one step so split phases merge (see Scheduler._anchor)
    # While slots run short, a newcomer's prefill waits for the talker decode of at least this many streams when
    # that decode is ready: its code predictor then joins theirs (one code-predictor plan per frame, not a solo
    # one at ~3.8 ms per newcomer). 0: never wait. Simulator, H200 costs, 128 slots: 80 RPS refuses 15 % instead
    # of 24 % (304 audio s/s instead of 272, with saturated_step_ms); 1-40 RPS unchanged (docs/scheduling.md).
    align_startup_rows: int = 32
    # Codec batches where each row decodes its own chunk (padded to the largest, which the budget allows), not
    # the anchor's: rows with many frames ready drain them in the same step. Needs executors built with
    # ragged_codec (engine --ragged-codec); off: on the H200 it refused more than uniform batches (docs/scheduling.md).
    ragged_codec: bool = False
    # A codec row joins a batch of the anchor's chunk only if its own chunk is at most this many times larger, or
    # it is urgent; 0 (the default): every row with enough frames ready joins. Under load a newcomer's 1-2 frame
    # chunk anchors most batches, and a row that joins one decodes that sliver of what it has ready, at ~3x the
    # codec's cost per frame of an 8-frame chunk (costs/h200_fast.json). On the H200 ratio 4 raised the ceiling
    # from 273 to 289 audio s/s (80 RPS refused 25 % instead of 29 %) but let 3-16 requests a point underrun by up
    # to 30 ms at 60-100 RPS, where joining every batch had none: off until that is fixed (docs/scheduling.md).
    codec_join_ratio: float = 0.0
    # Newcomers' first codec chunks as plans of their own on the generation lane (Plan.first_chunks), up to
    # `first_chunk_max_batch` rows: a newcomer's first audio then never queues behind the codec lane's plans,
    # which therefore keep the full step budget (no `startup_codec_ms` cut), and no newcomer's 1-frame chunk
    # sets the shape of the playing streams' codec batches. False: one codec lane for every chunk.
    first_chunk_lane: bool = True
    first_chunk_max_batch: int = 8
    # Codec gathering: while slots are plentiful, a codec-lane plan whose rows are all filler (no stream within
    # `urgent_slack_ms` + `GATHER_HEADROOM_MS` of running dry) starts at most once per `codec_gather_ms`, so the rows
    # that become ready meanwhile share one plan instead of a stream of small ones (the codec's cost is mostly per
    # plan). Rows nearer than that never wait; a chunk waits at most this long. 0: codec plans back to back. On the
    # H200 (eighteenth session, one CUDA stream, codec sizes 24 and 48) 80 ms took codec efficiency at 40 RPS to
    # 20.6k frames per codec event-second (9.7k on two streams without it) with p95 TTFA no worse (28.7 ms at 80 RPS,
    # 30.4 at 100, nothing refused, no underruns over HTTP). Earlier, slower engines saw it cost refusals or
    # underruns at 80 RPS (docs/benchmarks.md, seventh session).
    codec_gather_ms: float = 80.0
    # Early rows: a codec-lane plan of N >= `codec_fill_frames` frames a row also takes playing streams whose chunk
    # policy would still wait for more frames but that have N ready: into the batch's padding (free), and beyond it
    # while the plan's predicted time stays within `codec_fill_ms`. The codec's cost is mostly per plan (H200, tf32:
    # 1 x 4 frames 2.1 ms, 8 x 4 3.7 ms, 32 x 4 8.8 ms), so those frames cost a fraction of what they would in the
    # small plans they would otherwise anchor later. On the H200 (4 frames, 8 ms; docs/benchmarks.md, tenth session)
    # 80 RPS p95 TTFA went from 75-149 ms to 48-59 ms with nothing refused, and 100 RPS refused 2-5 % instead of
    # 8-12 %. One of five such servers hung mid-run in the tenth session; the codec lane's graphs now have their own
    # cuBLAS workspace (engine/fast/codec_graphs.py), and the eleventh session ran five servers with early rows at
    # 80-100 RPS without a stall (80 RPS p95 53-77 ms, 0-0.3 % refused). The GPU test of the two codec lanes that
    # kept them off in the eleventh session failed on the test's own fault (it read a request's codes after its slot
    # had gone to a later request). 0 turns them off: a row joins only once its own chunk is due.
    codec_fill_frames: int = 4
    codec_fill_ms: float = 8.0

    def __post_init__(self) -> None:
        for name in ("capture_sizes", "prefill_capture_sizes", "prefill_token_buckets",
                     "codec_capture_sizes", "codec_chunk_sizes"):
            sizes = getattr(self, name)
            if not sizes or sizes[0] < 1 or list(sizes) != sorted(set(sizes)):
                raise ValueError(f"{name} must be positive and strictly increasing, got {sizes}")
        if not 0 <= self.rescue_slack_ms <= self.urgent_slack_ms:
            raise ValueError("rescue_slack_ms must be in [0, urgent_slack_ms]")
        if self.first_chunk_frames < 1 or self.max_requests < 1 or self.max_codec_streams < 1:
            raise ValueError("first_chunk_frames, max_requests and max_codec_streams must be >= 1")
        if self.align_startup_rows < 0:
            raise ValueError("align_startup_rows must be >= 0")
        if self.first_chunk_max_batch < 1:
            raise ValueError("first_chunk_max_batch must be >= 1")
        if self.codec_join_ratio < 0 or self.codec_gather_ms < 0 or self.codec_fill_frames < 0:
            raise ValueError("codec_join_ratio, codec_gather_ms and codec_fill_frames must be >= 0")
        if not 0 < self.max_utilization <= 1:
            raise ValueError("max_utilization must be in (0, 1]")


def next_size(sizes: tuple[int, ...], n: int) -> int:
    """Smallest capture size holding n rows (n never exceeds the largest: cohorts are cut first)."""
    return next(s for s in sizes if s >= n)


def bucket(buckets: tuple[int, ...], n: int) -> int:
    """Smallest prefill token bucket holding n tokens (admission refuses longer prompts)."""
    return next(b for b in buckets if b >= n)


def capture_sizes(cfg: SchedulerConfig, kind: WorkKind, first_chunks: bool = False) -> tuple[int, ...]:
    """The batch sizes captured for `kind`, smallest first (`first_chunks`: a codec plan of newcomers' first
    chunks, on the generation lane's own, smaller codec graphs)."""
    if kind is WorkKind.TALKER_PREFILL:
        return cfg.prefill_capture_sizes
    if kind is WorkKind.CODEC_CHUNK:
        if first_chunks:
            return first_chunk_sizes(cfg)
        return cfg.codec_capture_sizes
    return cfg.capture_sizes


def first_chunk_sizes(cfg: SchedulerConfig) -> tuple[int, ...]:
    """Codec batch sizes of first-chunk plans: the codec's capture sizes up to `first_chunk_max_batch`."""
    return tuple(s for s in cfg.codec_capture_sizes if s <= cfg.first_chunk_max_batch) or cfg.codec_capture_sizes[:1]
