"""Engine settings: one frozen dataclass built from the command line, validated before any weight loads.

Built only in `engine/__main__.py` (or by tests) and passed down; nothing else in the engine reads the
command line or the environment. Besides the model and the socket it fixes every size the engine
preallocates and every shape a CUDA graph will later be captured for:

    capture_sizes          talker decode / code predictor batch sizes: 1, 2, 4, ... up to --max-batch
    prefill_capture_sizes  talker prefill batch sizes: 1, 2, 4, ... up to --max-prefill-batch
    prefill_token_buckets  prefill lengths rows are padded to (the last is the longest prompt accepted)
    codec_capture_sizes    codec batch sizes: 1, 2, 4, 8, 16, 24, 32, 48, ... up to --codec-max-batch
    codec_chunk_sizes      frames per codec call (the chunk policy snaps to these)

Which executors run their fast path (engine/fast: CUDA graphs over Triton kernels on a GPU, the same
static-shape steps eagerly through PyTorch twins elsewhere) is `--fast-path`, resolved against the device
by `fast_path_for` into a `FastPath`; `--codec-precision` picks the codec's dtype and TF32 switches on
either path. docs/engine.md ("Fast path") gives the reasons for what `auto` selects.

Memory (talker KV cache, one slot per live generation): layers x 2 x kv_slots x kv_heads x max_context x
head_dim x dtype bytes; for the 1.7B model in bf16 that is 112 KiB per position, so 128 slots x 2048
positions take 28 GiB. Codec state per stream is `CodecStatePool.bytes_per_slot` (about 2.6 MiB fp32).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.codec.chunking import AdaptivePolicy, ChunkPolicy, FixedSchedule
from engine.codec.silence import SilenceConfig
from engine.scheduling import DEFAULT_COSTS, SchedulerConfig, fast_costs_for
from engine.scheduling.config import first_chunk_sizes

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16")
LOAD_FORMATS = ("auto", "safetensors", "dummy")
# The fast codec's per-op kernels, its fused ones, or those with each vocoder conv and its SnakeBeta in one kernel
PROFILE_KINDS = ("torch", "host")  # engine/profiling.py: StepProfiler, HostProfiler
CODEC_KERNELS = ("ops", "fused", "fused-convs")  # (docs/engine.md)
CODEC_LAYOUTS = ("ncl", "channels-last")  # the fast codec vocoder's activation memory (engine/fast/codec_fast.py)
STREAM_PRIORITIES = ("equal", "generation", "codec")  # CUDA: the stream served first (docs/engine.md)
TALKER_CHAINS = ("off", "on")  # the fast talker's 16- and 64-row decode (`talker_graph.chain_options`)
SPLIT_K = (1, 2, 4)  # K slices of a split-K product (`GemvConfig.split_k`)
CP_KERNELS = ("layers", "fused")  # the code predictor's fast path (engine/fast/code_predictor_graph.py)
TALKER_GEMV_ROWS = (0, 1, 2)  # the fast talker's decode steps in `gemv` products: up to this many rows
CHUNK_POLICIES = ("slack", "adaptive", "fixed")
ADMISSION = ("auto", "on", "off")
FAST_PATHS = ("auto", "on", "off")
CODEC_PRECISIONS = ("auto", "bf16", "tf32", "fp32")
MAX_FRAMES_CAP = 2048  # runaway cap while a text is open (164 s), further bounded by max_context


@dataclass(frozen=True, slots=True)
class FastPath:
    """Which executors run their fast path; the others run the plain-PyTorch executors."""

    talker: bool = False  # TalkerGraphs: decode and prefill
    code_predictor: bool = False  # CodePredictorGraphs: the 15-step frame
    codec: bool = False  # CodecGraphs over FastCodecDecoder

    @property
    def any(self) -> bool:
        return self.talker or self.code_predictor or self.codec

    def describe(self) -> str:
        names = [name for name in ("talker", "code_predictor", "codec") if getattr(self, name)]
        return ", ".join(names) if names else "off"


@dataclass(frozen=True)  # (no slots: EngineSettings' fields take their defaults from the class attributes)
class KernelOptions:
    """How the talker's and code predictor's fast paths run (docs/engine.md, "Fast path"): the one place their
    defaults live, which the engine's command line (`EngineSettings`), `Executors`, `loadtest.gpu_check` and
    `tools/frame_profile.py` all start from. Validated on construction."""

    cp_kernels: str = "fused"  # code-predictor fast path: fused (frame kernels) | layers (fused layer stack)
    cp_pdl: bool = True  # cp_kernels fused: its Triton-product steps' kernels as programmatic dependent launches
    # Measured on the H200 (docs/benchmarks.md, twenty-second session): the code predictor's 64-program products in
    # 4 K slices and the talker chain won.
    cp_split_k: int = 4  # cp_kernels fused: projection, o and down (4-64 token rows) in this many K slices
    talker_gemv_rows: int = 2  # fast talker: decode steps of up to this many rows with its products in `gemv`
    talker_fused_rope: bool = True  # fast talker: q/k norm and RoPE inside the decode attention's split kernel
    talker_chain: str = "on"  # fast talker: 16- and 64-row decode steps as one PDL chain: off | on
    # fast talker: a step's scores, draw and slot-state writes in one kernel (`kernels.talker_draw`) instead of ~20
    # small ones: the same tokens bit for bit; H100, 2026-12-06 (`tools/frame_profile.py` at context 128,
    # `draw_fused`), talker step at B = 1 / 64 1.626 / 2.290 -> 1.562 / 2.216 ms
    talker_fused_draw: bool = True

    def __post_init__(self) -> None:
        _check_choice("cp_kernels", self.cp_kernels, CP_KERNELS)
        _check_choice("talker_chain", self.talker_chain, TALKER_CHAINS)
        if self.cp_split_k not in SPLIT_K:
            raise ValueError(f"cp_split_k must be one of {', '.join(map(str, SPLIT_K))}; got {self.cp_split_k}")
        if self.talker_gemv_rows not in TALKER_GEMV_ROWS:
            raise ValueError(f"talker_gemv_rows must be one of {', '.join(map(str, TALKER_GEMV_ROWS))}; "
                             f"got {self.talker_gemv_rows}")  # fmt: skip
        if self.talker_chain != "off" and not self.talker_fused_rope:
            raise ValueError("talker_chain needs talker_fused_rope (its attention kernels are the fused ones): "
                             "with --no-talker-fused-rope pass --talker-chain off")


@dataclass(frozen=True, slots=True)
class CaptureShapes:
    """Every shape a fast path captures (the scheduler plans within the same sizes)."""

    batch: tuple[int, ...]  # talker decode and code-predictor batch sizes
    prefill_batch: tuple[int, ...]  # talker prefill batch sizes
    prefill_buckets: tuple[int, ...]  # talker prefill lengths
    codec_batch: tuple[int, ...]  # codec batch sizes
    codec_frames: tuple[int, ...]  # codec frames per step; 1 is always in, so any chunk splits into these
    # First-chunk plans (the generation lane's codec graphs, `SchedulerConfig.first_chunk_lane`); () none.
    first_chunk_batch: tuple[int, ...] = ()
    first_chunk_frames: tuple[int, ...] = (1, 2)


@dataclass(frozen=True, slots=True)
class EngineSettings:
    model: str
    socket: str
    device: str = "auto"  # auto: cuda when available, else cpu
    dtype: str = "auto"  # auto: bfloat16 on cuda, float32 on cpu
    load_format: str = "auto"
    download: bool = False
    seed: int = 0  # random weights (presets, dummy) only
    threads: int = 0  # torch CPU threads; 0: 1 for presets on cpu (tiny ops only lose to contention), else torch's
    # As many as kv_slots (capture sizes stop there): at 64, every frame step above 64 generating streams split in
    # two (H200, 80 RPS: 22 % refused instead of 1.7 %; docs/benchmarks.md, sixth session).
    max_batch: int = 128
    max_prefill_batch: int = 8
    codec_max_batch: int = 64
    kv_slots: int = 128
    codec_slots: int = 0  # 0: as many as kv_slots
    max_context: int = 2048
    prefill_token_buckets: tuple[int, ...] = (32, 64, 128, 256, 512)
    codec_chunk_sizes: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 25)
    chunk_policy: str = "slack"
    fixed_chunks: tuple[int, ...] = (1, 2, 4, 8, 12)  # chunk_policy "fixed": the ramp, last entry repeats
    trim_silence: bool = True
    silence_threshold_dbfs: float = -50.0
    max_trim_ms: float = 2000.0
    skip_silent_first_frame: bool = False
    admission: str = "auto"  # auto: on for cuda, off for cpu (the cost table is measured on a GPU)
    fast_path: str = "auto"  # auto: talker, code predictor and codec on cuda with Triton, nothing on cpu
    codec_precision: str = "auto"  # auto: bf16 on cuda, tf32 elsewhere; tf32 / fp32: fp32 codec, TF32 on / off
    costs: str = "auto"  # auto: the fast-path table when the talker and code-predictor fast paths run
    heartbeat_s: float = 1.0
    shutdown_grace_ms: int = 5000
    log_level: str = "info"
    # the fast paths' kernels (`KernelOptions`, where their defaults and meanings are written)
    cp_kernels: str = KernelOptions.cp_kernels
    cp_pdl: bool = KernelOptions.cp_pdl
    talker_gemv_rows: int = KernelOptions.talker_gemv_rows
    talker_fused_rope: bool = KernelOptions.talker_fused_rope
    cp_split_k: int = KernelOptions.cp_split_k
    talker_chain: str = KernelOptions.talker_chain
    talker_fused_draw: bool = KernelOptions.talker_fused_draw
    precompile_workers: int = -1  # cp_kernels fused: processes compiling its Triton kernels (-1: one per core, <= 8)
    max_in_flight: int = 2  # plans queued on the device before the host waits for the oldest
    rescue_slack_ms: float = SchedulerConfig().rescue_slack_ms  # a playing stream this near running dry goes first
    # While slots run short: newcomers prefill after a decode of this many streams (0: never wait) ...
    align_startup_rows: int = SchedulerConfig().align_startup_rows
    saturated_step_ms: float = SchedulerConfig().saturated_step_ms  # ... and a batch may take this long
    ragged_codec: bool = False  # codec batches where each row decodes its own chunk (slower on the H200)
    codec_kernels: str = "fused"  # fast codec: "fused" cuts ~150 of a step's ~400 launches (docs/engine.md)
    codec_layout: str = "channels-last"  # fast codec vocoder: cuDNN's NHWC convs without conversions (docs/engine.md)
    codec_join_ratio: float = SchedulerConfig().codec_join_ratio  # codec rows join chunks at most this much smaller
    codec_gather_ms: float = SchedulerConfig().codec_gather_ms  # filler codec-lane plans at most once per this
    codec_fill_frames: int = SchedulerConfig().codec_fill_frames  # codec-lane plans of >= this take rows not yet due
    codec_fill_ms: float = SchedulerConfig().codec_fill_ms  # ... while the plan stays within this
    stream_priority: str = "equal"  # CUDA: which stream's blocks the GPU schedules first (STREAM_PRIORITIES)
    # CUDA: codec chunks on a stream of their own, beside the generation steps (off: behind them on one stream, where
    # a codec plan's event time is its own; with codec gathering, one stream measured better: docs/engine.md) ...
    codec_stream: bool = False
    split_lanes: bool = False  # ... and generation and codec plans in flight bounded apart (False: one shared bound)
    codec_in_flight: int = 1  # codec-lane plans queued on the device at once
    first_chunk_lane: bool = True  # newcomers' first codec chunks as their own plans on the generation stream
    slot_wait_ms: float = 200.0  # a Submit that finds every slot taken waits this long for one (0: refuse at once)
    stall_dump_s: float = 5.0  # a serving loop silent this long writes every thread's stack to stderr (0: never)
    sync_debug: str = "off"  # CUDA: "warn" logs every host-device synchronisation (torch sync debug mode)
    profile_dir: str = ""  # profile the loop (engine/profiling.py) and write summary tables here
    profile_after_s: float = 30.0  # ... this long after the first real request
    profile_steps: int = 300  # ... over this many working turns
    profile_kind: str = "torch"  # "torch": GPU kernels, syncs, gaps (StepProfiler); "host": Python functions (cProfile)
    voices_dir: str = ""  # Base models: the saved-voice store (engine/voice_store.py); "" none

    def __post_init__(self) -> None:
        _check_choice("device", self.device.split(":")[0], DEVICES)
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("load_format", self.load_format, LOAD_FORMATS)
        _check_choice("chunk_policy", self.chunk_policy, CHUNK_POLICIES)
        _check_choice("admission", self.admission, ADMISSION)
        _check_choice("fast_path", self.fast_path, FAST_PATHS)
        _check_choice("codec_precision", self.codec_precision, CODEC_PRECISIONS)
        for name in ("max_batch", "max_prefill_batch", "codec_max_batch", "kv_slots"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.codec_slots < 0 or self.threads < 0:
            raise ValueError("codec_slots and threads must be >= 0")
        if self.codec_slots and self.codec_slots < self.kv_slots:
            raise ValueError(f"codec_slots ({self.codec_slots}) must be >= kv_slots ({self.kv_slots}): every "
                             "generating request also holds a codec stream")
        for name in ("prefill_token_buckets", "codec_chunk_sizes", "fixed_chunks"):
            sizes = getattr(self, name)
            if not sizes or sizes[0] < 1 or (name != "fixed_chunks" and list(sizes) != sorted(set(sizes))):
                raise ValueError(f"{name} must be positive (and strictly increasing), got {list(sizes)}")
        if self.max_frames < 16:
            raise ValueError(f"max_context {self.max_context} leaves {self.max_frames} frames after the longest "
                             f"prefill ({self.prefill_token_buckets[-1]}); raise --max-context")
        if self.heartbeat_s <= 0 or self.shutdown_grace_ms < 0:
            raise ValueError("heartbeat_s must be > 0 and shutdown_grace_ms >= 0")
        if not 0 <= self.rescue_slack_ms <= SchedulerConfig().urgent_slack_ms:
            raise ValueError(f"rescue_slack_ms must be in [0, {SchedulerConfig().urgent_slack_ms:g}]")
        if self.align_startup_rows < 0 or self.saturated_step_ms <= 0 or self.codec_join_ratio < 0:
            raise ValueError("align_startup_rows and codec_join_ratio must be >= 0, saturated_step_ms > 0")
        if self.slot_wait_ms < 0:
            raise ValueError("slot_wait_ms must be >= 0")
        if self.max_in_flight < 1 or self.codec_in_flight < 1 or self.profile_steps < 1 or self.profile_after_s < 0:
            raise ValueError("max_in_flight, codec_in_flight and profile_steps must be >= 1, profile_after_s >= 0")
        _check_choice("sync_debug", self.sync_debug, ("off", "warn"))
        _check_choice("profile_kind", self.profile_kind, PROFILE_KINDS)
        _check_choice("codec_kernels", self.codec_kernels, CODEC_KERNELS)
        _check_choice("codec_layout", self.codec_layout, CODEC_LAYOUTS)
        _check_choice("stream_priority", self.stream_priority, STREAM_PRIORITIES)
        if self.codec_kernels == "fused-convs" and self.codec_layout != "channels-last":
            raise ValueError("codec_kernels fused-convs needs codec_layout channels-last")
        if self.precompile_workers < -1:
            raise ValueError("precompile_workers must be >= 0, or -1 for one per core")
        _ = self.kernel_options  # validates the fast paths' kernel choices
        SilenceConfig(threshold_dbfs=self.silence_threshold_dbfs, max_trim_ms=self.max_trim_ms)  # validates

    # ------------------------------------------------------------ derived sizes

    @property
    def kernel_options(self) -> KernelOptions:
        """The fast paths' kernel choices as `Executors` takes them (every `KernelOptions` field is a setting)."""
        return KernelOptions(**{name: getattr(self, name) for name in KernelOptions.__dataclass_fields__})

    @property
    def resolved_precompile_workers(self) -> int:
        """`precompile_workers` with -1 resolved (engine/fast/precompile.py's `default_workers`)."""
        if self.precompile_workers >= 0:
            return self.precompile_workers
        from engine.fast.precompile import default_workers

        return default_workers()

    @property
    def device_kind(self) -> str:
        return self.device.split(":")[0]

    @property
    def streams(self) -> int:
        """Codec streams (codec state slots and per-stream code buffers)."""
        return self.codec_slots or self.kv_slots

    @property
    def max_frames(self) -> int:
        """Frames one request may generate: the runaway cap, bounded so position + frames fit the KV slot."""
        return min(MAX_FRAMES_CAP, self.max_context - self.prefill_token_buckets[-1])

    @property
    def capture_sizes(self) -> tuple[int, ...]:
        return powers_up_to(min(self.max_batch, self.kv_slots))  # no batch holds more streams than there are

    @property
    def prefill_capture_sizes(self) -> tuple[int, ...]:
        return powers_up_to(self.max_prefill_batch)

    @property
    def codec_capture_sizes(self) -> tuple[int, ...]:
        return codec_sizes_up_to(self.codec_max_batch)

    @property
    def capture_shapes(self) -> CaptureShapes:
        chunks = self.codec_chunk_sizes
        first = first_chunk_sizes(SchedulerConfig(codec_capture_sizes=self.codec_capture_sizes))
        return CaptureShapes(batch=self.capture_sizes, prefill_batch=self.prefill_capture_sizes,
                             prefill_buckets=self.prefill_token_buckets, codec_batch=self.codec_capture_sizes,
                             codec_frames=chunks if chunks[0] == 1 else (1, *chunks),
                             first_chunk_batch=first if self.first_chunk_lane else ())

    def costs_path(self, fast: FastPath, device_name: str = "") -> Path:
        """The cost table the scheduler predicts from. `--costs auto` follows the executors that run and, on the
        fast path, the card (`device_name`, e.g. torch's 'NVIDIA H100 80GB HBM3'): its family's measured table."""
        if self.costs != "auto":
            return Path(self.costs)
        return fast_costs_for(device_name) if fast.talker and fast.code_predictor else DEFAULT_COSTS

    def codec_precision_for(self, device_kind: str) -> str:
        """`--codec-precision` on this device. `auto`: bf16 on CUDA, the precision the official examples run the
        codec in (its error against fp32 is the plain bf16 decoder's, 5e-2 relative L2 on random weights, and it
        decodes ~1.6x faster than tf32 on the H200: docs/engine.md); tf32 elsewhere (on a CPU: fp32 arithmetic,
        which the CPU tests' exact comparisons rely on)."""
        if self.codec_precision != "auto":
            return self.codec_precision
        return "bf16" if device_kind == "cuda" else "tf32"

    def fast_path_for(self, *, device_kind: str, have_triton: bool) -> FastPath:
        """`--fast-path` on this device. `auto`: all three on CUDA with Triton, nothing on a CPU (where the twins
        only add padding). The plain talker is ~30x slower on a GPU (768 ms vs 24 ms first audio for 8 requests,
        docs/engine.md), so a GPU without it cannot serve in real time; its fused path's bf16 drift (2.75e-2 vs
        the 2e-2 aim) is documented there. `on`: all three, on any device; `off`: none."""
        if self.fast_path == "on":
            return FastPath(talker=True, code_predictor=True, codec=True)
        if self.fast_path == "auto" and device_kind == "cuda" and have_triton:
            return FastPath(talker=True, code_predictor=True, codec=True)
        return FastPath()

    def scheduler_config(self, *, random_weights: bool, device_kind: str) -> SchedulerConfig:
        """The scheduler's view: capture shapes, slot counts, caps; the length model for random weights."""
        admission = self.admission == "on" or (self.admission == "auto" and device_kind == "cuda")
        return SchedulerConfig(
            capture_sizes=self.capture_sizes,
            prefill_capture_sizes=self.prefill_capture_sizes,
            prefill_token_buckets=self.prefill_token_buckets,
            codec_capture_sizes=self.codec_capture_sizes,
            codec_chunk_sizes=self.codec_chunk_sizes,
            max_requests=self.kv_slots,
            max_codec_streams=self.streams,
            # A skipped silent first frame would leave a one-frame first chunk empty: start with two.
            first_chunk_frames=2 if self.skip_silent_first_frame and not random_weights else 1,
            admission_control=admission,
            max_frames=self.max_frames,
            length_model=random_weights,
            rescue_slack_ms=self.rescue_slack_ms,
            align_startup_rows=self.align_startup_rows,
            saturated_step_ms=self.saturated_step_ms,
            ragged_codec=self.ragged_codec,
            codec_join_ratio=self.codec_join_ratio,
            codec_gather_ms=self.codec_gather_ms,
            codec_fill_frames=self.codec_fill_frames,
            codec_fill_ms=self.codec_fill_ms,
            first_chunk_lane=self.first_chunk_lane,
        )

    def chunk_policy_object(self) -> ChunkPolicy | None:
        """None: the scheduler's own pace-aware policy (`SlackChunkPolicy`)."""
        if self.chunk_policy == "adaptive":
            sizes = tuple(s for s in self.codec_chunk_sizes)
            return AdaptivePolicy(sizes=sizes if sizes[0] == 1 else (1, *sizes))
        if self.chunk_policy == "fixed":
            return FixedSchedule(self.fixed_chunks)
        return None

    def silence_config(self) -> SilenceConfig:
        return SilenceConfig(trim_leading=self.trim_silence, threshold_dbfs=self.silence_threshold_dbfs,
                             max_trim_ms=self.max_trim_ms, skip_silent_first_frame=self.skip_silent_first_frame)

    def fingerprint(self) -> str:
        """Settings as one JSON line plus a short hash, echoed at startup so runs can be told apart."""
        text = json.dumps(asdict(self), sort_keys=True)
        return f"{hashlib.sha256(text.encode()).hexdigest()[:12]} {text}"


def codec_sizes_up_to(largest: int) -> tuple[int, ...]:
    """`powers_up_to`, and from 16 up the sizes halfway between (24, 48, 96, ...): a codec plan's cost grows with
    its padded rows, and gathered plans of 17-30 rows padded to 32 spent a third of their time on padding (the
    simulator at 40 RPS: 17.8k -> 19.6k frames per codec event-second with finer sizes; docs/scheduling.md)."""
    sizes = powers_up_to(largest)
    halfway = [n + n // 2 for n in sizes if n >= 16 and n + n // 2 < largest]
    return tuple(sorted({*sizes, *halfway}))


def powers_up_to(largest: int) -> tuple[int, ...]:
    """1, 2, 4, ... below `largest`, then `largest` itself: the batch sizes graphs are captured for."""
    sizes, n = [], 1
    while n < largest:
        sizes.append(n)
        n *= 2
    return (*sizes, largest)


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_kernel_arguments(p: argparse.ArgumentParser, options: KernelOptions) -> None:
    """The `KernelOptions` flags (`--cp-*`, `--talker-*`), defaulting to `options`: the engine's command line and
    `loadtest.gpu_check` declare them here, once."""
    p.add_argument("--cp-kernels", default=options.cp_kernels, choices=CP_KERNELS,
                   help="code-predictor fast path: fused (default: Triton products with the norms in their prologues "
                        "at 1-2 token rows, tensor-core Triton products at 4-64 token rows, cuBLAS otherwise, short "
                        "attention and the one-kernel sampler; 2.1-3.9 ms a frame on an H200; its kernels compile in "
                        "parallel at start-up, see --precompile-workers) "
                        "or layers (the fused layer stack with cuBLAS products and the graph sampler; 5.7-6.7 ms)")
    p.add_argument("--cp-pdl", action=argparse.BooleanOptionalAction, default=options.cp_pdl,
                   help="with --cp-kernels fused: launch the kernels of the frame's steps whose products run in "
                        "Triton (1-2 and 4-64 token rows) as programmatic dependents, so each starts while the one "
                        "before it finishes (Hopper and later, ignored before; same results; B=1 frame 2.42 -> 2.16 "
                        "ms on an H200, and the B=64 frame's Triton products need it to beat cuBLAS; on by "
                        "default since the seventeenth session, docs/benchmarks.md: earlier server runs saw a 2-3 ms "
                        "first-audio tail at 1 RPS with it)")
    p.add_argument("--talker-gemv-rows", type=int, default=options.talker_gemv_rows, choices=TALKER_GEMV_ROWS,
                   help="fast talker: decode steps of up to this many rows (default 2) stream each weight once in "
                        "Triton products with the RMSNorms and SwiGLU folded in (6 kernels a layer instead of 9); 0: "
                        "cuBLAS products at every batch size (docs/benchmarks.md, seventeenth session)")
    p.add_argument("--talker-fused-rope", action=argparse.BooleanOptionalAction, default=options.talker_fused_rope,
                   help="fast talker: norm and rotate q and k inside the decode attention's split kernel instead of a "
                        "kernel of their own (on by default: 28 fewer launches a decode step, the same roundings)")
    p.add_argument("--cp-split-k", type=int, default=options.cp_split_k, choices=SPLIT_K,
                   help="with --cp-kernels fused: the 4-64 token-row steps' projection, o and down products (64 "
                        "programs each unsplit) with K cut into this many slices, one program each (default 4: the "
                        "B = 64 code-predictor frame 3.07 -> 2.85 ms on the H200; 1: unsplit)")
    p.add_argument("--talker-fused-draw", action=argparse.BooleanOptionalAction, default=options.talker_fused_draw,
                   help="fast talker: a step's repetition penalty, EOS and control-id masks, draw and slot-state "
                        "writes in one kernel instead of ~20 small ones (the same tokens; off until measured on a "
                        "GPU, docs/benchmarks.md, twenty-eighth session)")
    p.add_argument("--talker-chain", default=options.talker_chain, choices=TALKER_CHAINS,
                   help="fast talker: its 16- and 64-row decode steps as one chain of programmatic-dependent Triton "
                        "kernels (default on; needs --talker-fused-rope: the B = 64 decode step 2.05 -> 1.98 ms on "
                        "the H200, the same results bit for bit)")


def build_parser() -> argparse.ArgumentParser:
    d = EngineSettings(model="", socket="")
    p = argparse.ArgumentParser(prog="python -m engine",
                                description="Vivace engine: one process per GPU serving Qwen3-TTS over shared memory.")
    p.add_argument("--model", required=True,
                   help="preset (tiny, 1.7b, 0.6b, tiny-base, 1.7b-base, 0.6b-base), checkpoint directory or HF repo id "
                        "(CustomVoice or Base)")
    p.add_argument("--socket", required=True, help='control socket path ("@name": Linux abstract namespace)')
    p.add_argument("--device", default=d.device, help="auto | cpu | cuda | cuda:N (auto: cuda when available)")
    p.add_argument("--dtype", default=d.dtype, choices=DTYPES, help="auto: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--load-format", default=d.load_format, choices=LOAD_FORMATS,
                   help="dummy: random weights of the checkpoint's shape, length model instead of EOS")
    p.add_argument("--download", action="store_true", help="allow fetching a HF repo id from the Hub")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of random weights (presets, dummy)")
    p.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads (0: automatic)")
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="largest talker / code-predictor batch")
    p.add_argument("--max-prefill-batch", type=int, default=d.max_prefill_batch)
    p.add_argument("--codec-max-batch", type=int, default=d.codec_max_batch)
    p.add_argument("--kv-slots", type=int, default=d.kv_slots, help="talker KV cache slots (concurrent generations)")
    p.add_argument("--codec-slots", type=int, default=d.codec_slots, help="codec streams (0: as many as KV slots)")
    p.add_argument("--max-context", type=int, default=d.max_context, help="positions per KV slot (prefill + frames)")
    p.add_argument("--prefill-buckets", type=_int_list, default=d.prefill_token_buckets,
                   help="comma-separated prefill lengths; the last is the longest prompt accepted")
    p.add_argument("--chunk-sizes", type=_int_list, default=d.codec_chunk_sizes, help="codec frames per call")
    p.add_argument("--chunk-policy", default=d.chunk_policy, choices=CHUNK_POLICIES)
    p.add_argument("--fixed-chunks", type=_int_list, default=d.fixed_chunks, help="ramp of --chunk-policy fixed")
    p.add_argument("--no-trim-silence", dest="trim_silence", action="store_false", help="keep leading silence")
    p.add_argument("--silence-threshold-dbfs", type=float, default=d.silence_threshold_dbfs)
    p.add_argument("--max-trim-ms", type=float, default=d.max_trim_ms)
    p.add_argument("--skip-silent-first-frame", action="store_true",
                   help="drop the real model's silent first frame (default sampling, no instruction)")
    p.add_argument("--admission", default=d.admission, choices=ADMISSION,
                   help="predictive admission control (auto: on for cuda, off for cpu)")
    p.add_argument("--fast-path", default=d.fast_path, choices=FAST_PATHS,
                   help="GPU fast path (CUDA graphs, Triton kernels). auto: talker, code predictor and codec when "
                        "the device is CUDA and Triton imports, nothing on CPU (docs/engine.md); on: all three on "
                        "any device (CPU runs the kernels' PyTorch twins); off: plain PyTorch")
    p.add_argument("--codec-precision", default=d.codec_precision, choices=CODEC_PRECISIONS,
                   help="codec arithmetic: bf16 (bf16 weights and activations, as the official examples), tf32 (fp32 "
                        "weights, TF32 convs and matmuls on CUDA: closer to fp32, ~1.6x slower), fp32 (fp32, TF32 "
                        "off); auto: bf16 on cuda, tf32 elsewhere (on CPU tf32 and fp32 are the same)")
    p.add_argument("--costs", default=d.costs, help="cost table (JSON) the scheduler predicts step times from; auto: when the talker and "
                   "code-predictor fast paths run, engine/scheduling/costs/<card>_fast.json measured on this GPU's "
                   "family (h200, h100; the H200's for any other card), else h200_plain.json")
    p.add_argument("--heartbeat-s", type=float, default=d.heartbeat_s)
    p.add_argument("--shutdown-grace-ms", type=int, default=d.shutdown_grace_ms,
                   help="SIGTERM: time in-flight requests get to finish before they fail")
    p.add_argument("--log-level", default=d.log_level, choices=("debug", "info", "warning", "error"))
    p.add_argument("--rescue-slack-ms", type=float, default=d.rescue_slack_ms,
                   help="a playing stream whose slack (audio left minus the predicted time to its next audio) is "
                        "under this goes before newcomers' startup work (docs/scheduling.md)")
    p.add_argument("--align-startup-rows", type=int, default=d.align_startup_rows,
                   help="while slots run short, a newcomer's prefill waits for the talker decode of at least this "
                        "many streams, so its code predictor joins theirs (0: never wait; docs/scheduling.md)")
    p.add_argument("--saturated-step-ms", type=float, default=d.saturated_step_ms,
                   help="while slots run short, a batch may take this long (else the scheduler's 12 ms step budget)")
    p.add_argument("--ragged-codec", action=argparse.BooleanOptionalAction, default=d.ragged_codec,
                   help="codec batches where each row decodes its own chunk, padded to the longest (fewer refusals "
                        "in the simulator, more on the H200: off; docs/scheduling.md)")
    p.add_argument("--codec-kernels", choices=CODEC_KERNELS, default=d.codec_kernels,
                   help="fast codec: 'fused' (default) writes a step's new state back in one kernel and runs "
                        "each pre-transformer layer's RoPE, attention and ring update as one; 'ops' runs them "
                        "as separate PyTorch ops; 'fused-convs' (channels-last only) also runs decoder.0 and each "
                        "residual unit's convs with the SnakeBeta after them as one Triton kernel each (not yet "
                        "timed on a GPU; docs/engine.md)")
    p.add_argument("--codec-layout", choices=CODEC_LAYOUTS, default=d.codec_layout,
                   help="fast codec vocoder's activations: 'channels-last' (default: [B, L, C] memory, NHWC conv "
                        "weights, so cuDNN's tensor-core convs convert nothing; -12 to -18 %% a codec step on the "
                        "H200) or 'ncl', the plain modules' layout (docs/engine.md)")
    p.add_argument("--codec-join-ratio", type=float, default=d.codec_join_ratio,
                   help="a codec row joins a batch whose chunk is smaller than its own only up to this ratio, or "
                        "when its stream is urgent (0: always; docs/scheduling.md)")
    p.add_argument("--codec-gather-ms", type=float, default=d.codec_gather_ms,
                   help="while slots are plentiful, codec plans of streams far from running dry start at most once "
                        "per this many ms, so they batch more rows (0: off; docs/scheduling.md)")
    p.add_argument("--codec-fill-frames", type=int, default=d.codec_fill_frames,
                   help="a codec plan of at least this many frames a row also decodes playing streams that have that "
                        "many frames ready but whose own chunk is not due yet (0: off; docs/scheduling.md)")
    p.add_argument("--codec-fill-ms", type=float, default=d.codec_fill_ms,
                   help="... into the batch's padding, and beyond it while the plan is predicted to take at most this")
    p.add_argument("--stream-priority", choices=STREAM_PRIORITIES, default=d.stream_priority,
                   help="CUDA: the stream whose blocks the GPU schedules first when both wait for SMs: 'generation' "
                        "(the talker and code predictor steps), 'codec' (the codec lane's plans), or 'equal'")
    p.add_argument("--max-in-flight", type=int, default=d.max_in_flight,
                   help="generation plans queued on the GPU before the host waits for the oldest (host planning of "
                        "step k+1 overlaps the GPU's step k)")
    p.add_argument("--codec-in-flight", type=int, default=d.codec_in_flight,
                   help="codec plans queued on the codec stream at once (1: the next one gathers every row that "
                        "became ready meanwhile)")
    p.add_argument("--split-lanes", action=argparse.BooleanOptionalAction, default=d.split_lanes,
                   help="with --codec-stream: bound generation and codec plans in flight apart, so a long codec "
                        "plan never holds the generation stream back (default: one bound over both, the host waits "
                        "on the oldest)")
    p.add_argument("--slot-wait-ms", type=float, default=d.slot_wait_ms,
                   help="a request that finds every KV or codec slot taken waits up to this long for one before it "
                        "is refused as overloaded (0: refuse at once)")
    p.add_argument("--stall-dump-s", type=float, default=d.stall_dump_s,
                   help="while serving, a loop that sends no heartbeat for this long writes every thread's Python "
                        "stack to stderr, so a stall is on record before the gateway's heartbeat timeout (0: never)")
    p.add_argument("--first-chunk-lane", action=argparse.BooleanOptionalAction, default=d.first_chunk_lane,
                   help="newcomers' first codec chunks as plans of their own on the generation stream, so first "
                        "audio never waits behind the codec stream's longer plans (docs/scheduling.md)")
    add_kernel_arguments(p, d.kernel_options)
    p.add_argument("--precompile-workers", type=int, default=d.precompile_workers,
                   help="with --cp-kernels fused: child processes that compile its Triton kernels in parallel before "
                        "capture (-1: one per CPU core, at most 8; 0: the capture compiles them one by one)")
    p.add_argument("--codec-stream", action=argparse.BooleanOptionalAction, default=d.codec_stream,
                   help="CUDA: run codec chunks on a stream of their own beside the generation steps (default: "
                        "behind them on the generation stream)")
    p.add_argument("--sync-debug", default=d.sync_debug, choices=("off", "warn"),
                   help="warn: log every host-device synchronisation (CUDA; for finding hidden syncs)")
    p.add_argument("--profile-dir", default=d.profile_dir,
                   help="profile the loop under load and write summary tables here (engine/profiling.py)")
    p.add_argument("--profile-after-s", type=float, default=d.profile_after_s,
                   help="start profiling this long after the first real request")
    p.add_argument("--profile-steps", type=int, default=d.profile_steps, help="working loop turns to profile")
    p.add_argument("--profile-kind", default=d.profile_kind, choices=PROFILE_KINDS,
                   help="torch: GPU kernels, host-GPU syncs and idle gaps; host: the loop's Python functions by "
                        "self and cumulative time (cProfile), e.g. the scheduler against the launches")
    p.add_argument("--voices-dir", default=d.voices_dir,
                   help="Base models: directory of saved voices (engine/voice_store.py) that Submit.voice names")
    return p


def parse_args(argv: Sequence[str] | None = None) -> EngineSettings:
    parser = build_parser()
    args = parser.parse_args(argv)
    values = vars(args)
    values["prefill_token_buckets"] = values.pop("prefill_buckets")
    values["codec_chunk_sizes"] = values.pop("chunk_sizes")
    try:
        settings = EngineSettings(**values)
    except ValueError as error:
        parser.error(str(error))
    if settings.costs != "auto" and not Path(settings.costs).is_file():
        parser.error(f"cost table not found: {settings.costs}")
    return settings
