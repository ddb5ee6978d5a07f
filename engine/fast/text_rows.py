"""The talker's projected text rows, kept on the device: a decode step gathers P(id) instead of computing it.

P(id) = text_projection(text_embedding[id]) (two [n, 2048] x [2048, 2048] products with bias and a SiLU) depends on
the text id alone, and a request feeds one id per step from a vocabulary its text uses over and over. Computed
inside every captured decode step it cost ~15 us of kernel time and 5 launches a step (H100, 64 rows); here each
id is projected once, the first time a step needs it, and the step reads its row.

    rows [capacity, hidden]   row r holds P(id) for the id that `_row_of` (host dict id -> r) maps to r
    staging                   StaticInputs("text_id", "row") [largest step]: the new ids and their rows sent
                              in one pinned copy, as the step's own inputs are (no host-device sync)

A step's ids not held yet are projected together in one eager product before the step's replay, on the same
stream, so the replay reads finished rows. A full table starts over (every row free again): the step that fills
it projects all of its own ids afresh, and earlier replays have already read the rows it overwrites (one
stream, in order). Rows are the same function of the id as the per-step product (the same modules, in the
model's dtype); which other ids share the product changes only bf16 GEMM rounding, as a step's batch size does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from engine.fast.graphs import StaticInputs

# Distinct text ids held at once (4 KiB a row at the 1.7B model's 2048-wide bf16 rows: 16 MiB). A long or many-voiced
# workload refills the table now and then, one product of a step's ids each time.
DEFAULT_TEXT_ROWS = 4096


class ProjectedText:
    def __init__(self, project: Callable[[Tensor], Tensor], hidden: int, *, capacity: int, max_step_rows: int,
                 dtype: torch.dtype, device: torch.device) -> None:  # fmt: skip
        """`project`: ids [k] -> P(ids) [k, hidden]; `max_step_rows`: the most ids one step asks for."""
        if capacity < max_step_rows:
            raise ValueError(f"{capacity} text rows cannot hold one step's {max_step_rows} ids")
        self.project = project
        self.capacity = capacity
        self.rows = torch.zeros(capacity, hidden, dtype=dtype, device=device)  # [capacity, hidden]
        self._staging = StaticInputs(("text_id", "row"), max_step_rows, device)
        self._row_of: dict[int, int] = {}
        self.projected = 0  # ids projected so far (a step's misses)
        self.refills = 0  # times the full table started over

    def rows_for(self, ids: Sequence[int]) -> list[int]:
        """The table row holding P(id) for each id, projecting (on the current stream) the ids not held yet."""
        missing = set(ids).difference(self._row_of)
        if missing:
            if len(self._row_of) + len(missing) > self.capacity:
                self._row_of.clear()
                self.refills += 1
                missing = set(ids)
            new = sorted(missing)
            rows = list(range(len(self._row_of), len(self._row_of) + len(new)))
            self._row_of.update(zip(new, rows, strict=True))
            self._write(new, rows)
            self.projected += len(new)
        return [self._row_of[i] for i in ids]

    def _write(self, ids: list[int], rows: list[int]) -> None:
        count = len(ids)
        self._staging.load(count, text_id=ids, row=rows)
        projected = self.project(self._staging["text_id"][:count])  # [count, hidden]
        self.rows.index_copy_(0, self._staging["row"][:count], projected.to(self.rows.dtype))
