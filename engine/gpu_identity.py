"""Which physical GPU an engine runs on: its UUID, as `nvidia-smi -L` and `CUDA_VISIBLE_DEVICES` spell it.

Device indices are relative to `CUDA_VISIBLE_DEVICES` and so differ between processes; the UUID does
not, so it is what the engine reports in `Ready` and what `/ready` shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

UUID_PREFIXES = ("GPU-", "MIG-")


def gpu_uuid(device: torch.device) -> str:
    """"GPU-<uuid>" of the CUDA device `device` names; "" for any other device, or a torch without `.uuid`."""
    if device.type != "cuda":
        return ""
    import torch

    return format_uuid(getattr(torch.cuda.get_device_properties(device), "uuid", None))


def format_uuid(raw: object) -> str:
    """torch prints a bare "ffc79498-8ff3-…"; nvidia-smi prefixes "GPU-" (or "MIG-" for a MIG slice)."""
    text = "" if raw is None else str(raw).strip()
    if not text or text.startswith(UUID_PREFIXES):
        return text
    return "GPU-" + text
