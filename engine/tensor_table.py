"""Compare a checkpoint's tensor-name/shape table with the one a config expects; say every difference.

Torch-free: both weight loaders (model and codec) read shapes from safetensors headers and call this before
loading a single tensor, so a wrong file fails with one message naming what is missing, misshapen or extra.
"""

from __future__ import annotations

Shape = tuple[int, ...]


def table_problems(expected: dict[str, Shape], found: dict[str, Shape], limit: int = 8) -> list[str]:
    """-> one line per kind of mismatch (missing, wrong shape, unexpected); [] when the tables agree."""
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    wrong = sorted(f"{k}: file {found[k]}, expected {expected[k]}" for k in set(expected) & set(found)
                   if found[k] != expected[k])  # fmt: skip
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing tensor(s): {_preview(missing, limit)}")
    if wrong:
        problems.append(f"{len(wrong)} tensor(s) with the wrong shape: {_preview(wrong, limit)}")
    if extra:
        problems.append(f"{len(extra)} unexpected tensor(s): {_preview(extra, limit)}")
    return problems


def _preview(items: list[str], limit: int) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... (+{len(items) - limit} more)" if len(items) > limit else "")
