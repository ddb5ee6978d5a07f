"""Simulate the engine on a CPU in seconds: the real Scheduler, a cost model as the GPU clock.

    python -m engine.scheduling.simulate --rps 5 10 20 40 80 100 --duration 120 [--costs FILE] [--policy deadline]

Poisson arrivals (seeded) of Seed-TTS English prompts (`loadtest/data/seed-tts-eval-en.jsonl`), each
speaking `ceil(12.5 * chars / 14)` frames (the random-weight length model) with ~chars/4.5 text tokens,
the text sent whole or streamed word by word. Plans run one after another in one queue, as the engine runs them
on one CUDA stream by default; with `--codec-stream` (the engine's option of that name) they run on two lanes,
generation and codec, one plan at a time on each, sharing the device while both are busy
(`engine.scheduling.simdevice`); a plan's standalone time is the cost model's. Inbound events
that arrive meanwhile are applied before the next plan, as in the engine loop. Planning is free unless
`--host` (or any `--host-*` cost) puts the engine's host in the loop (`engine.scheduling.simhost`: a
scheduler call and a launch cost host time, lanes queue launched plans); its rows then end with the host's
busy share.

The simulator plays the gateway's part for deadlines: each client starts playing when its first
audio arrives (plus `--client-buffer-ms`), plays continuously, and resumes as soon as audio arrives
after running dry; its deadlines come `--network-margin-ms` before it runs dry (by default the
gateway's 10 ms for streamed text, which comes over WebSocket, and none for whole texts, as over
HTTP, which sends no deadlines). An underrun is a chunk that arrives after its client ran dry; with
streamed text, one that follows a wait for text is counted apart as "starved". It prints one row
per RPS: TTFA percentiles (request arrival to first audio published, engine side), underruns
(count and requests affected), refusals, GPU utilisation (busy time / simulated time) and the mean
batch per work kind, then the codec's mean frames per plan, seconds of audio decoded per second (at
saturation, the ceiling), the codec's share of the GPU work and its frames per second of lane time in
thousands (`kfr/ev`: the engine's CUDA-event figure for the codec, stretched where it overlaps generation).
`--admission-detail` adds a line under each row: admission's pressure as arrivals met it (with its mean split by the
kind of the rescue plans it counted), and refusals per rule.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from engine.codec.chunking import AdaptivePolicy, ChunkPolicy, FixedSchedule
from engine.ipc.messages import Layout
from engine.request import (
    NS_PER_SAMPLE,
    SAMPLES_PER_FRAME,
    Phase,
    RequestState,
    WorkKind,
    length_model_frames,
)
from engine.scheduling.costmodel import DEFAULT_COSTS, CostModel
from engine.scheduling.scheduler import Outcome, Policy, Scheduler, SchedulerConfig
from engine.scheduling.simdevice import DEFAULT_OVERLAP_RATE, MS, Running, SimDevice
from engine.scheduling.simhost import H200_HOST, HostCosts, simulate_with_host

PROMPTS = Path(__file__).resolve().parents[2] / "loadtest" / "data" / "seed-tts-eval-en.jsonl"
CHARS_PER_TOKEN = 4.5
STARVED_LOOKBACK_NS = 100 * MS  # an underrun this soon after waiting for text is blamed on the text
NETWORK_MARGIN_MS = 10.0  # the gateway's playback clocks set deadlines this long before a client runs dry (gateway/clock.py)


def load_prompts(path: Path = PROMPTS) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def text_tokens(chars: int) -> int:
    return max(1, round(chars / CHARS_PER_TOKEN))


def capacity_rps(config: SchedulerConfig, costs: CostModel, mean_frames: float) -> float:
    """Requests per second the GPU can generate and decode at the largest batches this configuration
    runs: full talker/code-predictor captures, and the largest codec batch of typical chunks that fits
    the step budget."""
    frames = config.typical_chunk_frames
    codec_batch = max((b for b in config.codec_capture_sizes
                       if costs.ms(WorkKind.CODEC_CHUNK, b, frames) <= config.max_step_ms), default=1)
    fps = costs.frames_per_second(config.capture_sizes[-1], codec_batch, frames)
    return fps / mean_frames


@dataclass(slots=True)
class Listener:
    """The client's playback of one request."""

    arrival_ns: int
    first_audio_ns: int | None = None
    runs_dry_ns: int = 0  # when the client's buffer empties at the current rate
    underruns: int = 0
    underrun_ms: float = 0.0
    starved_ns: int = -1  # last time its talker waited for text (the LLM, not the engine, was late)


@dataclass(slots=True)
class SimResult:
    rps: float
    offered: int = 0
    refused: int = 0
    refused_by: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # per `Admission.rule`
    pressure_at_admission: list[float] = field(default_factory=list)  # admission's pressure met by each arrival
    pressure_by_kind_sum: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # its parts, summed
    completed: int = 0
    ttfa_ms: list[float] = field(default_factory=list)
    underruns: int = 0  # chunks that reached a client after it ran dry, the engine's fault
    starved: int = 0  # the same, but the talker had been waiting for text (streamed text came too slowly)
    requests_with_underruns: int = 0
    busy_ms: float = 0.0
    sim_ms: float = 0.0
    rows: dict[WorkKind, list[int]] = field(default_factory=lambda: defaultdict(list))
    codec_frames: list[int] = field(default_factory=list)  # per codec plan: frames of its graph shape
    frames_decoded: int = 0  # every row's frames, all plans
    busy_by_kind: dict[WorkKind, float] = field(default_factory=lambda: defaultdict(float))  # standalone ms
    codec_event_ms: float = 0.0  # codec plans' start-to-end time on their lane (the engine's CUDA-event time)
    host_ms: float = 0.0  # the host's planning and launching (the host model only, `engine.scheduling.simhost`)
    wall_s: float = 0.0

    def percentile(self, q: float) -> float:
        if not self.ttfa_ms:
            return math.nan
        ordered = sorted(self.ttfa_ms)
        return ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)]

    @property
    def utilization(self) -> float:
        return self.busy_ms / self.sim_ms if self.sim_ms else 0.0

    @property
    def audio_per_s(self) -> float:
        """Seconds of audio decoded per simulated second: at saturation, the GPU's ceiling."""
        return self.frames_decoded * SAMPLES_PER_FRAME * NS_PER_SAMPLE / 1e9 / (self.sim_ms / 1e3) if self.sim_ms else 0.0

    def share(self, kind: WorkKind) -> float:
        """The kind's share of the standalone GPU work (the lanes' overlap aside)."""
        work = sum(self.busy_by_kind.values())
        return self.busy_by_kind.get(kind, 0.0) / work if work else 0.0

    @property
    def codec_frames_per_event_s(self) -> float:
        """Frames decoded per second of codec plans' lane time: the engine's codec-efficiency figure."""
        return self.frames_decoded / (self.codec_event_ms / 1e3) if self.codec_event_ms else 0.0

    def mean_batch(self, kind: WorkKind) -> float:
        rows = self.rows.get(kind)
        return sum(rows) / len(rows) if rows else 0.0


@dataclass(frozen=True, slots=True)
class Workload:
    rps: float
    duration_s: float
    seed: int = 0
    text_mode: str = "whole"  # "whole" | "words"
    words_per_s: float = 20.0  # words mode: how fast the LLM streams text
    client_buffer_ms: float = 0.0  # client jitter buffer before playback starts
    network_margin_ms: float = 0.0  # deadlines this much before the client runs dry (WebSocket: NETWORK_MARGIN_MS)
    layout: Layout = Layout.STREAMING
    jitter: float = 0.0  # relative spread of step times around the cost model (uniform)
    max_lead_ms: int = 0  # pacing of every stream (the session's max_lead_ms); 0 = unpaced
    lanes: bool = False  # codec-lane plans run beside the generation plans (engine --codec-stream); False: one queue
    overlap_rate: float = DEFAULT_OVERLAP_RATE  # each lane's speed while both run (engine.scheduling.simdevice)


def _arrivals(load: Workload, prompts: list[str]) -> list[tuple[int, int, str, object]]:
    """(time_ns, request_id, event, payload) for submits, text pieces and text ends."""
    rng = random.Random(load.seed)
    events: list[tuple[int, int, str, object]] = []
    t, rid = 0.0, 0
    while True:
        t += rng.expovariate(load.rps)
        if t >= load.duration_s:
            return events
        rid += 1
        text = rng.choice(prompts)
        at = int(t * 1e9)
        if load.text_mode == "whole":
            events.append((at, rid, "submit", (text_tokens(len(text)), len(text), True)))
            continue
        words = text.split()
        sent_tokens = 0
        for i, word in enumerate(words):
            chars = len(word) + (1 if i else 0)
            total = text_tokens(sum(len(w) + 1 for w in words[: i + 1]) - 1)
            n, sent_tokens = total - sent_tokens, total
            kind = "submit" if i == 0 else "append"
            events.append((at + int(i / load.words_per_s * 1e9), rid, kind, (n, chars, False)))
        events.append((at + int((len(words) - 1) / load.words_per_s * 1e9), rid, "end", None))


def chunk_policy(name: str, config: SchedulerConfig) -> ChunkPolicy | None:
    """'slack': the scheduler's pace-aware default; 'adaptive' and 'ramp': engine.codec.chunking's."""
    if name == "slack":
        return None
    if name == "adaptive":
        return AdaptivePolicy(sizes=config.codec_chunk_sizes, first_chunk_frames=config.first_chunk_frames)
    return FixedSchedule()


def simulate(load: Workload, config: SchedulerConfig, costs: CostModel, prompts: list[str],
             chunks: ChunkPolicy | None = None, host: HostCosts | None = None) -> SimResult:
    """One RPS. `host`: put the engine's host in the loop (`engine.scheduling.simhost`); None: planning is free."""
    if host is not None:
        return simulate_with_host(load, config, costs, prompts, chunks, host)
    started = time.perf_counter()
    config = replace(config, length_model=True)
    scheduler = Scheduler(config, costs, chunks)
    device = SimDevice(load.overlap_rate, split_lanes=load.lanes)
    rng = random.Random(load.seed + 1)
    result = SimResult(load.rps)
    events = _arrivals(load, prompts)
    heapq.heapify(events)
    listeners: dict[int, Listener] = {}
    now = 0
    while True:
        while events and events[0][0] <= now:
            _apply(heapq.heappop(events), scheduler, listeners, result, load)
        while lanes := device.free_lanes():  # the host plans the moment a lane frees, as the engine loop does
            plan = scheduler.plan(now, lanes)
            if plan is None:
                break
            step_ms = plan.predicted_ms * (1 + load.jitter * (2 * rng.random() - 1))
            device.start(plan, step_ms, now)
            result.busy_by_kind[plan.kind] += step_ms
            result.rows[plan.kind].append(len(plan.rows))
        wakes = [t for t in (events[0][0] if events else None, device.next_end_ns(now)) if t is not None]
        wake = scheduler.next_wake_ns(now)  # a paced stream's resume time, or the end of codec gathering
        if wake is not None and wake > now:
            wakes.append(wake)
        if not wakes:
            assert scheduler.active_count == 0, "simulation stuck: requests wait for input that never comes"
            break
        later = max(now + 1, min(wakes))
        for ended in device.advance(now, later):
            _finish(ended, later, scheduler, listeners, result, load)
        now = later
    result.sim_ms = now / MS
    result.busy_ms = device.busy_ms
    result.requests_with_underruns = sum(1 for li in listeners.values() if li.underruns)
    result.wall_s = time.perf_counter() - started
    return result


def _finish(ended: Running, now: int, scheduler: Scheduler, listeners: dict[int, Listener], result: SimResult,
            load: Workload) -> None:
    """A plan's device work ended at `now`: apply it, and deliver its audio to the listeners."""
    plan = ended.plan
    scheduler.complete(plan, Outcome(), now)
    if load.text_mode == "words":
        for r in scheduler.requests:
            if r.phase is Phase.WAITING_TEXT:
                listeners[r.request_id].starved_ns = now
    if plan.kind is WorkKind.CODEC_CHUNK:
        result.codec_frames.append(plan.codec_frames)
        result.frames_decoded += sum(row.codec_frames for row in plan.rows)
        result.codec_event_ms += (now - ended.started_ns) / MS
        for row in plan.rows:
            _play(listeners[row.request_id], row.codec_frames, now, load, scheduler, row.request_id, result)
    result.completed += len(scheduler.pop_finished())


def _apply(event: tuple[int, int, str, object], scheduler: Scheduler, listeners: dict[int, Listener],
           result: SimResult, load: Workload) -> None:
    at, rid, kind, payload = event
    if kind == "submit":
        n_tokens, chars, ended = payload  # type: ignore[misc]
        result.offered += 1
        prefill = 10 if load.layout is Layout.STREAMING else 11 + n_tokens
        state = RequestState(rid, at, load.layout, prefill, [0] * n_tokens, chars, ended)
        state.max_lead_ms = load.max_lead_ms
        result.pressure_at_admission.append(scheduler.pressure)
        for work, share in scheduler.rescues.share_by_kind().items():
            result.pressure_by_kind_sum[work.label] += share
        admission = scheduler.admit(state, at)
        if admission.ok:
            listeners[rid] = Listener(at)
        else:
            result.refused += 1
            result.refused_by[admission.rule] += 1
    elif rid not in listeners:
        return  # text for a refused request
    elif kind == "append":
        n_tokens, chars, _ = payload  # type: ignore[misc]
        scheduler.append_text(rid, [0] * n_tokens, chars)
    else:
        scheduler.end_text(rid)


def _play(listener: Listener, frames: int, now: int, load: Workload, scheduler: Scheduler, rid: int,
          result: SimResult) -> None:
    """A chunk reaches the client at `now`: start, extend or resume its playback; tell the engine."""
    audio_ns = int(frames * SAMPLES_PER_FRAME * NS_PER_SAMPLE)
    if listener.first_audio_ns is None:
        listener.first_audio_ns = now
        listener.runs_dry_ns = now + int(load.client_buffer_ms * MS) + audio_ns
        result.ttfa_ms.append((now - listener.arrival_ns) / MS)
    elif now > listener.runs_dry_ns and listener.starved_ns >= listener.runs_dry_ns - STARVED_LOOKBACK_NS:
        result.starved += 1
        listener.runs_dry_ns = now + audio_ns
    elif now > listener.runs_dry_ns:
        listener.underruns += 1
        result.underruns += 1
        listener.underrun_ms += (now - listener.runs_dry_ns) / MS
        listener.runs_dry_ns = now + audio_ns
    else:
        listener.runs_dry_ns += audio_ns
    scheduler.set_deadline(rid, listener.runs_dry_ns - int(load.network_margin_ms * MS))


DEFAULTS = SchedulerConfig()
HEADER = (f"{'rps':>6} {'offered':>7} {'refused':>7} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} "
          f"{'underruns':>9} {'affected':>8} {'starved':>7} {'gpu':>5} {'prefill':>7} {'cp':>6} {'decode':>6} "
          f"{'codec':>6} {'frames':>6} {'audio/s':>7} {'codec%':>6} {'kfr/ev':>6} {'wall s':>6}")


def format_row(r: SimResult) -> str:
    frames = sum(r.codec_frames) / len(r.codec_frames) if r.codec_frames else 0.0
    return (f"{r.rps:>6g} {r.offered:>7} {r.refused:>7} {r.percentile(50):>7.1f} {r.percentile(95):>7.1f} "
            f"{r.percentile(99):>7.1f} {r.underruns:>9} {r.requests_with_underruns:>8} {r.starved:>7} "
            f"{r.utilization:>5.0%} {r.mean_batch(WorkKind.TALKER_PREFILL):>7.1f} "
            f"{r.mean_batch(WorkKind.CODE_PREDICT):>6.1f} {r.mean_batch(WorkKind.TALKER_DECODE):>6.1f} "
            f"{r.mean_batch(WorkKind.CODEC_CHUNK):>6.1f} {frames:>6.1f} {r.audio_per_s:>7.0f} "
            f"{r.share(WorkKind.CODEC_CHUNK):>6.0%} {r.codec_frames_per_event_s / 1e3:>6.1f} {r.wall_s:>6.1f}")


def format_admission(r: SimResult) -> str:
    """The admission line under a row: the pressure arrivals met (against `max_pressure`) and refusals per rule."""
    met = sorted(r.pressure_at_admission)
    if not met:
        return ""
    p50, p99 = (met[min(len(met) - 1, int(q * len(met)))] for q in (0.5, 0.99))
    refused = ", ".join(f"{n} {rule}" for rule, n in sorted(r.refused_by.items())) or "none"
    parts = sorted(r.pressure_by_kind_sum.items(), key=lambda kv: -kv[1])
    split = ", ".join(f"{kind} {total / len(met):.2f}" for kind, total in parts if total / len(met) >= 0.005) or "-"
    return (f"{'':>6} admission: pressure met p50 {p50:.2f} p99 {p99:.2f} max {met[-1]:.2f} (mean by kind: {split}); "
            f"refused: {refused}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine.scheduling.simulate", description=__doc__.splitlines()[0])
    parser.add_argument("--rps", type=float, nargs="+", default=[5, 10, 20, 40, 80, 100])
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals per RPS")
    parser.add_argument("--costs", type=Path, default=DEFAULT_COSTS, help="cost table JSON")
    parser.add_argument("--codec-precision", default=None,
                        help="the table's codec row of this precision (codec_chunk_<precision>), if it has one")
    parser.add_argument("--policy", choices=[p.value for p in Policy], default=Policy.DEADLINE.value)
    parser.add_argument("--chunks", choices=["slack", "adaptive", "ramp"], default="slack",
                        help="codec chunk policy: the scheduler's pace-aware one, or engine.codec.chunking's")
    parser.add_argument("--text", choices=["whole", "words"], default="whole")
    parser.add_argument("--words-per-s", type=float, default=20.0)
    parser.add_argument("--layout", choices=["streaming", "non_streaming"], default="streaming")
    parser.add_argument("--client-buffer-ms", type=float, default=0.0)
    parser.add_argument("--network-margin-ms", type=float, default=None,
                        help="deadlines this long before a client runs dry (default: 10 ms, the gateway's playback "
                             "clocks, with --text words, which only WebSocket sessions send; 0 with whole texts, as "
                             "HTTP requests, which send no deadlines: the engine's own first-audio reckoning)")
    parser.add_argument("--max-step-ms", type=float, default=DEFAULTS.max_step_ms)
    parser.add_argument("--first-chunk-frames", type=int, default=DEFAULTS.first_chunk_frames)
    parser.add_argument("--max-requests", type=int, default=DEFAULTS.max_requests)
    parser.add_argument("--merge-startup", action="store_true", help="newcomers may wait a step to merge")
    parser.add_argument("--align-startup-rows", type=int, default=DEFAULTS.align_startup_rows,
                        help="saturated mode: newcomers prefill after a decode of this many streams (0: never)")
    parser.add_argument("--saturated-step-ms", type=float, default=DEFAULTS.saturated_step_ms)
    parser.add_argument("--codec-join-ratio", type=float, default=DEFAULTS.codec_join_ratio,
                        help="a codec row joins a smaller anchor chunk only up to this ratio, or urgent (0: always)")
    parser.add_argument("--codec-fill-frames", type=int, default=DEFAULTS.codec_fill_frames,
                        help="codec-lane plans of at least this many frames take rows not yet due (0: off)")
    parser.add_argument("--codec-fill-ms", type=float, default=DEFAULTS.codec_fill_ms,
                        help="early codec rows grow a plan only while it is predicted to take at most this")
    parser.add_argument("--codec-gather-ms", type=float, default=DEFAULTS.codec_gather_ms,
                        help="a codec-lane plan of filler rows starts at most once per this window (0: off)")
    parser.add_argument("--ragged-codec", action="store_true",
                        help="codec rows decode their own chunk sizes in one batch (engine --ragged-codec)")
    parser.add_argument("--no-admission", action="store_true", help="only slot limits refuse work")
    parser.add_argument("--jitter", type=float, default=0.0, help="relative spread of step times")
    parser.add_argument("--max-lead-ms", type=int, default=0, help="pace every stream this far ahead (0: unpaced)")
    parser.add_argument("--codec-stream", action=argparse.BooleanOptionalAction, default=False,
                        help="codec-lane plans beside the generation plans, sharing the device (the engine's "
                             "--codec-stream); default: every plan in one queue, as the engine's one stream")
    parser.add_argument("--overlap-rate", type=float, default=DEFAULT_OVERLAP_RATE,
                        help="each lane's speed while both run, as a share of its standalone speed")
    parser.add_argument("--host", action="store_true",
                        help="put the engine's host in the loop with the H200's measured costs (engine.scheduling.simhost)")
    parser.add_argument("--host-plan-us", type=float, default=None,
                        help="host model: a scheduler call's cost per active request, in us (implies --host)")
    parser.add_argument("--host-launch-ms", type=float, nargs=4, default=None,
                        metavar=("PREFILL", "CP", "DECODE", "CODEC"),
                        help="host model: a plan's launch cost by kind, in ms (implies --host)")
    parser.add_argument("--host-finish-ms", type=float, default=None,
                        help="host model: an ended codec plan's host part, in ms (implies --host)")
    parser.add_argument("--max-in-flight", type=int, default=H200_HOST.max_in_flight,
                        help="host model: generation plans queued on the device")
    parser.add_argument("--codec-in-flight", type=int, default=H200_HOST.codec_in_flight,
                        help="host model: codec-lane plans queued on the device")
    parser.add_argument("--admission-detail", action="store_true",
                        help="under each row: the pressure arrivals met and the refusals per admission rule")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=Path, default=PROMPTS)
    args = parser.parse_args(argv)
    if args.text == "words" and args.layout == "non_streaming":
        parser.error("the non-streaming layout needs the whole text (--text whole)")

    costs = CostModel.load(args.costs, args.codec_precision)
    config = SchedulerConfig(policy=Policy(args.policy), max_step_ms=args.max_step_ms,
                             first_chunk_frames=args.first_chunk_frames, max_requests=args.max_requests,
                             max_codec_streams=args.max_requests, admission_control=not args.no_admission,
                             merge_startup=args.merge_startup, align_startup_rows=args.align_startup_rows,
                             saturated_step_ms=args.saturated_step_ms, ragged_codec=args.ragged_codec,
                             codec_join_ratio=args.codec_join_ratio, codec_fill_frames=args.codec_fill_frames,
                             codec_gather_ms=args.codec_gather_ms, codec_fill_ms=args.codec_fill_ms)
    host = _host_costs(args)
    prompts = load_prompts(args.prompts)
    mean_frames = sum(length_model_frames(len(p)) for p in prompts) / len(prompts)
    layout = Layout.STREAMING if args.layout == "streaming" else Layout.NON_STREAMING
    print(f"costs {costs.name} | policy {args.policy} | chunks {args.chunks} | text {args.text} | layout {args.layout} | "
          f"max lead {args.max_lead_ms or 'unpaced'} | "
          f"{len(prompts)} prompts, mean {mean_frames:.1f} frames | capacity "
          f"{capacity_rps(config, costs, mean_frames):.0f} rps | duration {args.duration:g} s | seed {args.seed}")
    if host is not None:
        launch = " / ".join(f"{host.launch_ms[k]:g}" for k in HOST_KINDS)
        print(f"host: plan {host.plan_us:g} us per active request, launch {launch} ms (prefill / CP / decode / "
              f"codec), codec finish {host.finish_ms:g} ms, in flight {host.max_in_flight} + {host.codec_in_flight}")
    print(HEADER + (f" {'host':>5}" if host is not None else ""))
    for rps in args.rps:
        load = Workload(rps, args.duration, args.seed, args.text, args.words_per_s, args.client_buffer_ms,
                        _network_margin_ms(args), layout, args.jitter, args.max_lead_ms, args.codec_stream,
                        args.overlap_rate)
        result = simulate(load, config, costs, prompts, chunk_policy(args.chunks, config), host)
        busy = f" {result.host_ms / result.sim_ms:>5.0%}" if host is not None and result.sim_ms else ""
        print(format_row(result) + busy, flush=True)
        if args.admission_detail:
            print(format_admission(result), flush=True)


def _network_margin_ms(args: argparse.Namespace) -> float:
    if args.network_margin_ms is not None:
        return args.network_margin_ms
    return NETWORK_MARGIN_MS if args.text == "words" else 0.0


HOST_KINDS = (WorkKind.TALKER_PREFILL, WorkKind.CODE_PREDICT, WorkKind.TALKER_DECODE, WorkKind.CODEC_CHUNK)


def _host_costs(args: argparse.Namespace) -> HostCosts | None:
    """The host model the flags ask for (None: planning is free, the plain simulator)."""
    if not (args.host or args.host_plan_us is not None or args.host_launch_ms or args.host_finish_ms is not None):
        return None
    host = replace(H200_HOST, max_in_flight=args.max_in_flight, codec_in_flight=args.codec_in_flight)
    if args.host_plan_us is not None:
        host = replace(host, plan_us=args.host_plan_us)
    if args.host_launch_ms:
        host = replace(host, launch_ms=dict(zip(HOST_KINDS, args.host_launch_ms, strict=True)))
    if args.host_finish_ms is not None:
        host = replace(host, finish_ms=args.host_finish_ms)
    return host


if __name__ == "__main__":
    main()
