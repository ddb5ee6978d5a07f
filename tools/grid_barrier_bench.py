"""What one grid barrier of the persistent code-predictor step costs on its own (GPU only).

    python tools/grid_barrier_bench.py [--barriers 0 1 37 148] [--warps 4]

Launches a kernel of one program per SM that only passes `--barriers` grid barriers (`kernels.cp_step`'s
`_grid_barrier`, the same counter reset at exit), times it with CUDA events (median of 50), and prints us per
launch and per barrier: the floor under the step's 37 barriers, apart from any phase's work.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.fast.measure import cuda_median_ms  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--barriers", type=int, nargs="+", default=[0, 1, 37, 148])
    p.add_argument("--warps", type=int, default=4)
    p.add_argument("--out", default="grid_barrier.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA device")
    import triton
    import triton.language as tl

    from engine.fast.kernels.cp_step import _grid_barrier

    @triton.jit
    def barriers_only(sync_ptr, count):
        nprog = tl.num_programs(0)
        for i in range(count):
            _grid_barrier(sync_ptr, (i + 1) * nprog)
        if tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu") == nprog - 1:
            tl.store(sync_ptr, 0)
            tl.store(sync_ptr + 1, 0)

    programs = torch.cuda.get_device_properties(0).multi_processor_count
    sync = torch.zeros(2, dtype=torch.int32, device="cuda")
    rows = {}
    for count in args.barriers:
        ms = cuda_median_ms(lambda c=count: barriers_only[(programs,)](sync, c, num_warps=args.warps), repeats=50,
                            warmup=5)  # fmt: skip
        rows[count] = {"us": ms * 1000, "us_per_barrier": ms * 1000 / count if count else None}
        print(f"{count:4d} barriers: {ms * 1000:8.2f} us a launch"
              + (f", {ms * 1000 / count:6.2f} us a barrier" if count else ""), flush=True)  # fmt: skip
    assert sync.tolist() == [0, 0], "the counters were not reset"
    Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "programs": programs,
                                          "rows": rows}, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
