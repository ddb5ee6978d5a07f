"""Prompt pools: JSONL files of {"id", "text"} objects, by default the shipped Seed-TTS English set."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT_POOL = Path(__file__).parent / "data" / "seed-tts-eval-en.jsonl"


@dataclass(frozen=True, slots=True)
class Prompt:
    id: str
    text: str


def load_prompts(path: str | Path | None = None) -> list[Prompt]:
    """Read a pool; every line must be an object with a string `text` (and an `id`, else the line number)."""
    path = Path(path) if path is not None else DEFAULT_POOL
    prompts: list[Prompt] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str) or not row["text"].strip():
                raise ValueError(f"{path}:{number}: expected an object with a non-empty string 'text'")
            prompt_id = str(row.get("id", number))
            if prompt_id in seen:
                raise ValueError(f"{path}:{number}: duplicate id {prompt_id!r}")
            seen.add(prompt_id)
            prompts.append(Prompt(prompt_id, row["text"]))
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts
