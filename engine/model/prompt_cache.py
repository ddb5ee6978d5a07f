"""`PromptHeadCache`: the embedded rows that open a prompt, computed once per speaker and language, not per request.

Runtime state for `generate.embed_prefill(..., cache=)`. A CustomVoice prompt opens with rows that do not depend
on its text (reference section 5): the role ids `<|im_start|> assistant \\n`, then special-text rows (`tts_pad`,
`tts_bos`) over codec rows (think tokens, language, speaker, pad). Only the rows from the first text token on
differ between requests. Embedding them costs three text projections, a codec lookup and a dozen adds, ~25
small kernels and four host-to-device copies a request, all on the host's path to the request's first audio;
cached, a streaming prompt's head costs nothing and its one text row a single projection.

The head is cut where the prompt's own GEMM grouping is cut (`generate._project_text`: the role ids are one
projection, the special ids another, every later run of text ids its own), so the cached rows are bitwise the
rows the whole prompt would have produced. A prompt that opens with instruction ids has no head (they are
text). Keys are the head's (text id, codec id) pairs; the cache keeps the `max_entries` most recently used.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import Tensor

HeadKey = tuple[tuple[int | None, int | None], ...]


class PromptHeadCache:
    def __init__(self, max_entries: int = 256) -> None:
        if max_entries < 1:
            raise ValueError("a prompt head cache holds at least one entry")
        self.max_entries = max_entries
        self._rows: OrderedDict[HeadKey, Tensor] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: HeadKey) -> Tensor | None:
        rows = self._rows.get(key)
        if rows is None:
            self.misses += 1
            return None
        self.hits += 1
        self._rows.move_to_end(key)
        return rows

    def put(self, key: HeadKey, rows: Tensor) -> None:
        """rows [L, hidden]: the head's embedded rows (kept as they are: callers must not write into them)."""
        self._rows[key] = rows
        self._rows.move_to_end(key)
        while len(self._rows) > self.max_entries:
            self._rows.popitem(last=False)

    def __len__(self) -> int:
        return len(self._rows)
