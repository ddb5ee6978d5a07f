"""Latency of each work kind as a function of its shape, interpolated from a measured JSON table.

The scheduler asks it how long a batch will take (slack, admission, step budget); the simulator uses
it as the clock. Tables live in `engine/scheduling/costs/*.json` (format in `h200_plain.json`): per kind, the
milliseconds at a few batch sizes, and for the codec also at a few new-frame counts, for the prefill
at a few total token counts. A table may hold the codec's costs in other precisions too (`codec_chunk_tf32`
beside `codec_chunk`, the table's own); the engine loads the row of the precision it decodes in. Between
points the cost is piecewise linear; beyond the last point it extends the last segment (costs keep growing,
never flatten), below the first it takes the first value.

Tables are per card: `<family>_fast.json` holds the fast path measured on that GPU family (`h200_fast.json`,
`h100_fast.json`, named by `gpu_family`); `fast_costs_for` picks the one of the card the engine runs on, the
H200's where no table of that family has been measured.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass
from pathlib import Path

from engine.request import WorkKind

COSTS_DIR = Path(__file__).parent / "costs"
DEFAULT_COSTS = COSTS_DIR / "h200_plain.json"
REFERENCE_FAST_COSTS = COSTS_DIR / "h200_fast.json"  # the card every other table is compared against


def gpu_family(device_name: str) -> str | None:
    """The card family a cost table is named for: 'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA H200' -> 'h200',
    'NVIDIA A100-SXM4-80GB' -> 'a100'; None where the name holds no such model number."""
    match = re.search(r"\b([A-Z]{1,2}\d{2,3}[A-Z]?)\b", device_name.upper())
    return match.group(1).lower() if match else None


def fast_costs_for(device_name: str) -> Path:
    """The fast path's cost table for this GPU: `costs/<family>_fast.json` if that family was measured, else
    the H200's (`REFERENCE_FAST_COSTS`; on another card admission then predicts that card's times)."""
    family = gpu_family(device_name)
    path = COSTS_DIR / f"{family}_fast.json" if family else None
    return path if path is not None and path.is_file() else REFERENCE_FAST_COSTS


def interpolate(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """Piecewise-linear y(x) through the points, extended linearly past the last point."""
    if x <= xs[0] or len(xs) == 1:
        return ys[0]
    i = min(bisect.bisect_left(xs, x), len(xs) - 1)  # xs[i-1] < x <= xs[i], or past the end
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True, slots=True)
class Curve:
    """Cost over one axis (batch, or total prefill tokens)."""

    xs: tuple[float, ...]
    ms: tuple[float, ...]

    def __call__(self, x: float) -> float:
        return interpolate(self.xs, self.ms, x)


@dataclass(frozen=True, slots=True)
class Grid:
    """Codec cost over (batch, new frames per row): bilinear, extended like `interpolate`."""

    batches: tuple[float, ...]
    frames: tuple[float, ...]
    ms: tuple[tuple[float, ...], ...]  # [batch index][frames index]

    def __call__(self, batch: float, frames: float) -> float:
        per_batch = tuple(interpolate(self.frames, row, frames) for row in self.ms)
        return interpolate(self.batches, per_batch, batch)


def _check_axis(name: str, xs: list[float], ms: list[float]) -> None:
    if not xs or len(xs) != len(ms):
        raise ValueError(f"cost table {name}: needs equally long, non-empty axis and ms lists")
    if any(b <= a for a, b in zip(xs, xs[1:], strict=False)):
        raise ValueError(f"cost table {name}: axis must be strictly increasing, got {xs}")
    if any(m <= 0 for m in ms):
        raise ValueError(f"cost table {name}: every cost must be positive, got {ms}")


class CostModel:
    """Predicted milliseconds per work unit. Immutable once loaded (answers are memoized)."""

    def __init__(self, table: dict, codec_precision: str | None = None) -> None:
        """`codec_precision`: take the codec's costs from `codec_chunk_<precision>` when the table has that row
        (e.g. tf32 beside a bf16 `codec_chunk`), else from `codec_chunk`."""
        try:
            self.name: str = table.get("name", "unnamed")
            self.step_overhead_ms = float(table.get("step_overhead_ms", 0.0))
            self.decode = self._curve("talker_decode", table["talker_decode"], "batch")
            self.code_predict = self._curve("code_predict", table["code_predict"], "batch")
            self.prefill = self._curve("talker_prefill", table["talker_prefill"], "tokens")
            codec = table.get(f"codec_chunk_{codec_precision}") or table["codec_chunk"]
            batches, frames, grid = codec["batch"], codec["frames"], codec["ms"]
        except KeyError as missing:
            raise ValueError(f"cost table lacks {missing}") from None
        if len(grid) != len(batches):
            raise ValueError("cost table codec_chunk: one ms row per batch size")
        for row in grid:
            _check_axis("codec_chunk", frames, row)
        _check_axis("codec_chunk batch", batches, [1.0] * len(batches))
        self.codec = Grid(tuple(batches), tuple(frames), tuple(tuple(r) for r in grid))
        self._memo: dict[tuple[WorkKind, int, int, int], float] = {}

    @staticmethod
    def _curve(name: str, entry: dict, axis: str) -> Curve:
        xs, ms = entry[axis], entry["ms"]
        _check_axis(name, xs, ms)
        return Curve(tuple(xs), tuple(ms))

    @classmethod
    def load(cls, path: str | Path = DEFAULT_COSTS, codec_precision: str | None = None) -> CostModel:
        with open(path, encoding="utf-8") as f:
            return cls(json.load(f), codec_precision)

    def ms(self, kind: WorkKind, batch: int, frames: int = 1, tokens: int = 10) -> float:
        """One step of `kind` at `batch` rows (already padded); `frames` per codec row; `tokens` per prefill row."""
        key = (kind, batch, frames, tokens)
        cost = self._memo.get(key)
        if cost is None:  # the scheduler asks the same few shapes thousands of times per second
            cost = self._memo[key] = self._interpolate(kind, batch, frames, tokens)
        return cost

    def _interpolate(self, kind: WorkKind, batch: int, frames: int, tokens: int) -> float:
        if kind is WorkKind.TALKER_DECODE:
            cost = self.decode(batch)
        elif kind is WorkKind.CODE_PREDICT:
            cost = self.code_predict(batch)
        elif kind is WorkKind.TALKER_PREFILL:
            cost = self.prefill(batch * tokens)
        else:
            cost = self.codec(batch, frames)
        return cost + self.step_overhead_ms

    def frame_step_ms(self, batch: int) -> float:
        """One talker decode plus one code-predictor frame for `batch` streams."""
        return self.ms(WorkKind.TALKER_DECODE, batch) + self.ms(WorkKind.CODE_PREDICT, batch)

    def frames_per_second(self, batch: int, codec_batch: int, codec_frames: int) -> float:
        """Steady-state generated-and-decoded frames per GPU second at these batch shapes."""
        generate_ms = self.frame_step_ms(batch) / batch
        decode_ms = self.ms(WorkKind.CODEC_CHUNK, codec_batch, codec_frames) / (codec_batch * codec_frames)
        return 1000.0 / (generate_ms + decode_ms)
