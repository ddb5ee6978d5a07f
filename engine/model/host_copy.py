"""Host integer lists to device tensors without synchronising the host with the device.

`torch.tensor(values, device="cuda")` copies from pageable memory and waits for the copy, which waits for
every kernel queued before it: one hidden host-device synchronisation per call. Here the values go into
pinned memory first and up with a non-blocking copy, queued on the current stream like any kernel. The
pinned block comes from PyTorch's caching host allocator, which keeps it until that copy has run.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def device_ids(values: Sequence[int] | Sequence[bool], device: torch.device | str,
               dtype: torch.dtype = torch.int64) -> Tensor:  # fmt: skip
    """values [n] -> a [n] tensor of `dtype` on `device`; on CUDA the copy is queued, not waited for."""
    return to_device(torch.tensor(values, dtype=dtype), device)


def to_device(host: Tensor, device: torch.device | str) -> Tensor:
    """A host tensor -> `device`, through pinned memory and a non-blocking copy on CUDA."""
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
