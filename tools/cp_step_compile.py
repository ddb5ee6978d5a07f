"""Compile the persistent code-predictor step kernel for a GPU architecture without a GPU (Triton + ptxas only).

    python tools/cp_step_compile.py [--arch 90] [--model 1.7b] [--tokens 1 2] [--block-n 32] [--stages 3]

Prints per variant: registers and spills per thread, shared memory per program, and whether one program fits an
SM (the grid barrier needs every program resident). Exit status 1 when any variant fails to compile or to fit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.kernel_compile import compile_for  # noqa: E402

H100_SHARED_BYTES = 227 * 1024  # the opt-in shared memory of one sm_90 program


def compile_step(arch: int, model: str, tokens: int, block_n: int, block_k: int, stages: int, warps: int, split: int,
                 has_index: bool, persistent: bool, queries_first: bool = False) -> dict[str, int]:  # fmt: skip
    import triton

    from engine.fast.kernels.cp_step import PHASES_PER_LAYER, _cp_step_kernel
    from engine.model.config import preset

    c = preset(model).code_predictor
    hid, heads, kv_heads, d = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    kin = c.input_size
    group = heads // kv_heads
    constants = dict(
        T=tokens, KIN=kin, HID=hid, H=heads, KV=kv_heads, D=d, INTER=c.intermediate_size, VOCAB=c.vocab_size,
        L=c.num_layers, BLOCK_L=triton.next_power_of_2(c.num_code_groups), QKV=(heads + 2 * kv_heads) * d, G=group,
        GP=triton.next_power_of_2(group), BLOCK_H=triton.next_power_of_2(hid), HAS_INDEX=has_index,
        HAS_PROJ=kin != hid, SPLIT=split, PROJ_SLICES=split if kin != hid else 1, BLOCK_R=64, BLOCK_N=block_n,
        BLOCK_K=block_k, STAGES=stages,
        DTYPE=triton.language.bfloat16, DOT_DTYPE=triton.language.bfloat16, PRECISION="tf32",
        PERSISTENT=persistent, PREFETCH=persistent, LAYER_PHASES=PHASES_PER_LAYER, TIMELINE=persistent,
        QUERIES_FIRST=queries_first and tokens == 1,
    )  # fmt: skip
    pointers = {"index_ptr": "*i64", "sync_ptr": "*i32", "stamps_ptr": "*i64"}
    return compile_for(_cp_step_kernel, constants, pointers, num_warps=warps, arch=arch)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--model", default="1.7b")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 2])
    p.add_argument("--block-n", type=int, default=32)
    p.add_argument("--block-k", type=int, default=128)
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--warps", type=int, default=4)
    p.add_argument("--split-k", type=int, default=4)
    args = p.parse_args(argv)
    ok = True
    for tokens in args.tokens:
        for persistent in (True, False):
            name = f"T={tokens} {'persistent' if persistent else 'phased'}"
            try:
                info = compile_step(args.arch, args.model, tokens, args.block_n, args.block_k, args.stages,
                                    args.warps, args.split_k, tokens == 1, persistent)  # fmt: skip
            except Exception as error:  # noqa: BLE001 (report every variant)
                print(f"{name}: FAILED {type(error).__name__}: {str(error)[:2000]}")
                ok = False
                continue
            fits = info["shared"] <= H100_SHARED_BYTES and info["spills"] == 0
            ok &= info["shared"] <= H100_SHARED_BYTES
            print(f"{name}: {info['registers']} registers, {info['spills']} spilled, {info['shared']} B shared"
                  f"{'' if fits else '  (does not fit)'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
