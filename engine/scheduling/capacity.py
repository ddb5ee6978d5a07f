"""What the cost model predicts for the scheduler: a batch's time, the GPU share that keeps streams
real-time, and a newcomer's time to first audio. Pure arithmetic on shapes and counts, no clock reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from engine.request import WorkKind
from engine.scheduling.config import SchedulerConfig, next_size
from engine.scheduling.costmodel import CostModel

FRAME_MS = 80.0


def batch_ms(costs: CostModel, kind: WorkKind, padded: int, shape: int) -> float:
    """Predicted time of one `kind` batch padded to `padded` rows; `shape`: prefill tokens or codec frames."""
    if kind is WorkKind.TALKER_PREFILL:
        return costs.ms(kind, padded, tokens=shape)
    return costs.ms(kind, padded, frames=max(shape, 1))


def batched_ms(rows: int, sizes: tuple[int, ...], step_ms: Callable[[int], float]) -> float:
    """Time to run `rows` rows in as few captured batches as possible."""
    full, rest = divmod(rows, sizes[-1])
    return full * step_ms(sizes[-1]) + (step_ms(next_size(sizes, rest)) if rest else 0.0)


def realtime_utilization(cfg: SchedulerConfig, costs: CostModel, streams: int) -> float:
    """GPU share needed to give `streams` streams one frame each per 80 ms, decoded in typical chunks."""
    if streams <= 0:
        return 0.0
    round_ms = batched_ms(streams, cfg.capture_sizes, costs.frame_step_ms)
    chunk = cfg.typical_chunk_frames
    codec_ms = batched_ms(streams, cfg.codec_capture_sizes,
                          lambda b: costs.ms(WorkKind.CODEC_CHUNK, b, chunk)) / chunk
    return (round_ms + codec_ms) / FRAME_MS


def predicted_ttfa_ms(cfg: SchedulerConfig, costs: CostModel, startup: int, generating: int,
                      oldest_wait_ms: float) -> float:
    """Time to first audio of a newcomer: its own pipeline at today's batch sizes, stretched by the
    share of the GPU that playing streams need, plus half a step already running; never less than
    `oldest_wait_ms`, the wait of the oldest request still without audio (it is served before).
    `startup` and `generating` count the newcomer too."""
    batch = next_size(cfg.capture_sizes, min(generating, cfg.capture_sizes[-1]))
    prefill_rows = min(startup, cfg.prefill_capture_sizes[-1])
    prefill_rounds = math.ceil(startup / cfg.prefill_capture_sizes[-1])
    prefill_ms = costs.ms(WorkKind.TALKER_PREFILL, prefill_rows, tokens=cfg.prefill_token_buckets[0])
    pipeline = (prefill_rounds * prefill_ms
                + (cfg.first_chunk_frames + 1) * costs.ms(WorkKind.CODE_PREDICT, batch)
                + cfg.first_chunk_frames * costs.ms(WorkKind.TALKER_DECODE, batch)
                + costs.ms(WorkKind.CODEC_CHUNK, min(startup, cfg.codec_capture_sizes[-1]),
                           cfg.first_chunk_frames))
    busy = min(realtime_utilization(cfg, costs, generating - 1), 0.95)
    return max(pipeline / (1.0 - busy) + cfg.max_step_ms / 2, oldest_wait_ms)
