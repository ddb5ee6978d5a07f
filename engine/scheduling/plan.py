"""The records the scheduler hands out and takes back: a Plan of rows to run, the Outcome of running it,
and the Admission verdict on a new request. Frozen data only, no logic beyond derived properties.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from engine.request import TEXT_PAD, WorkKind


class Lane(Enum):
    """Where a plan's kernels queue on the device: the generation steps' stream, or the codec's own stream
    beside it. Each lane has its own in-flight bound, so a long codec plan never holds generation back."""

    GENERATION = "generation"
    CODEC = "codec"


ALL_LANES = frozenset(Lane)


class PlanRow(NamedTuple):
    """One request's part of a batch. `frame_index`: prefill 0; code predictor: the frame it completes;
    talker decode: the frame whose codes it feeds (it samples codebook 0 of frame_index + 1);
    codec: the first frame it decodes. `position` is the talker position of the row's first new token.

    A NamedTuple rather than a frozen dataclass (immutable either way, same fields and repr): the scheduler
    builds one per row of every plan, up to 128 a plan and hundreds of plans a second, and a frozen
    dataclass's __init__ (one object.__setattr__ per field) costs about four times a tuple's."""

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
    # Codec plans of newcomers' first chunks only: they run on the generation lane, right behind the code
    # predictor that made their frames, instead of queuing behind the codec lane's longer plans.
    first_chunks: bool = False

    @property
    def lane(self) -> Lane:
        return Lane.CODEC if self.kind is WorkKind.CODEC_CHUNK and not self.first_chunks else Lane.GENERATION

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
    rule: str = ""  # which rule refused: "request" | "slots" | "utilization" | "pressure" | "ttfa"

    @property
    def slots_full(self) -> bool:
        """Refused only because every KV or codec slot is taken (it may wait for one)."""
        return self.rule == "slots"
