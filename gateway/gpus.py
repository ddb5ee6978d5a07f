"""Which GPU each engine process gets: engine i takes the i-th GPU the server was given.

The server is given the GPUs in its own `CUDA_VISIBLE_DEVICES` (indices or `GPU-…`/`MIG-…` UUIDs, in
that order) or, when that is unset, every GPU of the host: 0, 1, …. A user's `CUDA_VISIBLE_DEVICES=2,3`
with `--engines 2` starts engine 0 with `CUDA_VISIBLE_DEVICES=2` and engine 1 with `=3`, so each engine
sees exactly one GPU, as `cuda:0`. Fewer GPUs than engines is `NotEnoughGpus`, raised before any engine
starts; more is fine (the extra GPUs stay idle). One engine on CUDA, engines on CPU and fake engines
inherit the server's environment unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.settings import Settings

# One directory per GPU the NVIDIA driver manages (inside a container: the GPUs handed to it).
HOST_GPUS_DIR = Path("/proc/driver/nvidia/gpus")


class NotEnoughGpus(ValueError):
    """--engines asks for more engines than the server was given GPUs (or names one GPU twice)."""


def visible_gpus(value: str | None) -> tuple[str, ...] | None:
    """The entries of a `CUDA_VISIBLE_DEVICES` value, or None when it is unset (every GPU of the host).

    Like CUDA, the list ends at the first empty or negative entry, so "" and "-1" give no GPU at all.
    """
    if value is None:
        return None
    entries: list[str] = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry or entry.startswith("-"):
            break
        entries.append(entry)
    return tuple(entries)


def host_gpu_count(gpus_dir: Path = HOST_GPUS_DIR) -> int | None:
    """GPUs the NVIDIA driver shows this process; None when it cannot tell (no driver, not Linux)."""
    try:
        return sum(1 for _ in gpus_dir.iterdir())
    except OSError:
        return None


def engine_gpus(settings: Settings, host_gpus: int | None = None) -> tuple[str | None, ...]:
    """Each engine's `CUDA_VISIBLE_DEVICES`, in engine order; None: inherit the server's environment.

    `host_gpus`, the GPUs of the host (default: `host_gpu_count()`), counts only when the server's own
    `CUDA_VISIBLE_DEVICES` is unset. When it cannot be told, engine i simply gets GPU i unchecked.
    """
    n = settings.engines
    if n == 1 or settings.device == "cpu" or settings.fake_engine:
        return (None,) * n
    if settings.gpus is None:
        count = host_gpu_count() if host_gpus is None else host_gpus
        if count is not None and count < n:
            raise NotEnoughGpus(f"--engines {n} needs {n} GPUs (one per engine), but the host shows {count}")
        return tuple(str(i) for i in range(n))
    given = settings.gpus
    if len(given) < n:
        listed = ",".join(given) or "none"
        raise NotEnoughGpus(
            f"--engines {n} needs {n} GPUs (one per engine), but CUDA_VISIBLE_DEVICES gives {len(given)}: {listed}"
        )
    chosen = given[:n]
    twice = sorted({gpu for gpu in chosen if chosen.count(gpu) > 1})
    if twice:
        raise NotEnoughGpus(
            f"CUDA_VISIBLE_DEVICES names GPU {', '.join(twice)} more than once; one engine per GPU"
        )
    return chosen
