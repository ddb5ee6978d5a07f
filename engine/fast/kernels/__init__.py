"""Triton kernels of the fast path, each with its plain-PyTorch twin beside it (same function, same rounding).

Every public function here dispatches: Triton on CUDA tensors (or on CPU tensors under TRITON_INTERPRET=1,
which is how CPU tests exercise the kernels), the PyTorch twin otherwise. `selfcheck.check_kernels` runs
every kernel against its twin on random inputs; the GPU check and the CPU tests both call it.
"""

from __future__ import annotations

import os

import torch

try:  # Triton is optional: CPU-only installs run the twins.
    import triton  # noqa: F401

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def use_triton(x: torch.Tensor) -> bool:
    """Kernels run on CUDA tensors, or anywhere in interpreter mode; `VIVACE_FAST_KERNELS=0` forces the twins."""
    if not HAVE_TRITON or os.environ.get("VIVACE_FAST_KERNELS", "1") == "0":
        return False
    return x.is_cuda or INTERPRET
