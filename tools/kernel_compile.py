"""Compile one Triton kernel specialization for a GPU architecture on a machine without a GPU (Triton + its ptxas).

    from tools.kernel_compile import compile_for
    compile_for(kernel, {"BLOCK": 64, ...}, {"idx_ptr": "*i64"}, num_warps=4)  -> {"registers", "spills", "shared"}
    compile_for(..., census=True)  -> also "instructions" and the SASS opcode counts ("BAR", "SHFL", "LDG", ...)

Arguments named in `constants` are constexprs (constexpr parameters with a default take it when left out); the
other arguments ending in `_ptr` are pointers (bf16 unless `pointers` names another type), `eps` and `scale` fp32,
the rest i32. Pointers and the arguments named in
`aligned` (strides) are compiled as multiples of 16, as Triton specializes them at a launch where they are
(without it, loads that are vectors at run time compile to 2-byte ones). This is how the CPU suite looks at the
code paths Triton's interpreter never runs (programmatic dependent launch, inline PTX, in-kernel clocks):
`tests/fast/test_kernels_compile.py`, `tools/gemv_tiles.py --compile-only`.

    python tools/kernel_compile.py      # the census of the attention kernels' forms (below), sm_90

The census counts each instruction of the SASS once (a loop's body once); programs x warps x instructions is
the issue work a launch puts on the SMs, which is what bounds a latency-bound kernel of many small programs
(the code predictor's attention at B = 64: 512 programs).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

FLOAT_SCALARS = ("eps", "scale")


def compile_for(kernel: Any, constants: dict[str, Any], pointers: dict[str, str] | None = None, *,
                num_warps: int = 4, arch: int = 90, num_stages: int | None = None, aligned: tuple[str, ...] = (),
                census: bool = False) -> dict[str, int]:  # fmt: skip
    """-> registers and spilled bytes a thread, shared bytes a program, of `kernel` compiled for sm_`arch`
    (`num_stages`: Triton's software-pipelining depth; None: its default); with `census`, the SASS's instruction
    count and opcode counts (`sass_census`). `aligned`: i32 arguments compiled as multiples of 16 (the pointers
    always are, when `aligned` or `census` is given)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    pointers = pointers or {}
    # constexpr parameters left out take their defaults, as a launch that does not pass them does
    defaults = {param.name: param.default for param in kernel.params if param.is_constexpr and param.has_default}
    constants = {**{name: value for name, value in defaults.items() if name not in constants}, **constants}
    signature: dict[str, str] = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in pointers:  # (a pointer's element type, or another type: "tensordesc<bf16[1,32]>")
            signature[name] = pointers[name]
        elif name.endswith("_ptr"):
            signature[name] = pointers.get(name, "*bf16")
        else:
            signature[name] = "fp32" if name in FLOAT_SCALARS else "i32"
    attrs = {}
    if aligned or census:
        attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in kernel.arg_names
                 if (name.endswith("_ptr") and name not in constants) or name in aligned}  # fmt: skip
    source = ASTSource(kernel, signature, constexprs=constants, attrs=attrs)
    options = {"num_warps": num_warps, **({} if num_stages is None else {"num_stages": num_stages})}
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    info = {**resource_usage(compiled.asm["cubin"]), "shared": compiled.metadata.shared}
    return {**info, **sass_census(compiled.asm["cubin"])} if census else info


def _backend_tool(name: str) -> Path:
    from triton.backends.nvidia import compiler as nvidia

    return Path(nvidia.__file__).parent / "bin" / name


def sass_census(cubin: bytes) -> dict[str, int]:
    """-> {"instructions": n, opcode: count} of the cubin's SASS (`nvdisasm`, shipped with Triton's backend);
    opcodes without their modifiers (BAR.SYNC.DEFER_BLOCKING counts as BAR)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(_backend_tool("nvdisasm")), "-c", f.name], capture_output=True, text=True).stdout
    counts: dict[str, int] = {"instructions": 0}
    for line in text.splitlines():  # "        /*0040*/                   LDG.E.U16 R2, desc[UR4][R2.64] ;"
        found = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if found:
            counts["instructions"] += 1
            counts[found.group(1)] = counts.get(found.group(1), 0) + 1
    return counts


def resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers and spilled bytes per thread from the cubin (`cuobjdump`, shipped with Triton's backend)."""
    tool = _backend_tool("cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    registers = re.search(r"REG:(\d+)", text)
    stack = re.search(r"STACK:(\d+)", text)
    spills = sum(int(v) for v in re.findall(r"(?:LOCAL|SPILL)[A-Z_]*:(\d+)", text))
    return {"registers": int(registers.group(1)) if registers else -1,
            "spills": spills + (int(stack.group(1)) if stack else 0)}  # fmt: skip


def have_ptxas() -> bool:
    """Whether Triton's NVIDIA backend (with its ptxas) is installed."""
    try:
        from triton.backends.nvidia import compiler
    except ImportError:
        return False
    return (Path(compiler.__file__).parent / "bin" / "ptxas").exists()


ATTENTION_POINTERS = {"slots_ptr": "*i64", "lengths_ptr": "*i64", "m_ptr": "*fp32", "l_ptr": "*fp32",
                      "acc_ptr": "*fp32", "count_ptr": "*i32", "stamps_ptr": "*i64"}  # fmt: skip
STRIDES = ("stride_s", "stride_k", "stride_l")


def attention_census() -> list[tuple[str, int, dict[str, int]]]:
    """The attention kernels' forms at full size: (name, warps a B = 64 launch runs, compile census)."""
    import triton.language as tl

    from engine.fast.kernels.cp_attention import _cp_attention_kernel
    from engine.fast.kernels.decode_attention import _split_rope_kernel

    rows: list[tuple[str, int, dict[str, int]]] = []
    cp = dict(T=1, H=16, K=8, G=2, GP=2, D=128, BLOCK_L=16, DTYPE=tl.bfloat16, PDL=True, EARLY=True, HW=True,
              QSPLIT=1)
    for per_head in (False, True):
        for warps in (4, 2, 1):
            info = compile_for(_cp_attention_kernel, {**cp, "PER_HEAD": per_head}, num_warps=warps, aligned=STRIDES,
                               census=True)  # fmt: skip
            name = f"cp_attention {'per-head' if per_head else 'broadcast'}, {warps} warp{'s' * (warps > 1)}"
            rows.append((name, 64 * 8 * warps, info))
    info = compile_for(_cp_attention_kernel, {**cp, "PER_HEAD": True, "QSPLIT": 2}, num_warps=1, aligned=STRIDES,
                       census=True)  # fmt: skip
    rows.append(("cp_attention per-head, 2 programs a kv head, 1 warp", 64 * 16, info))
    talker = dict(H=16, KV=8, G=2, GP=16, D=128, SPLITS=2, CHUNK=32, BLOCK=32, PRECISION="tf32", INTERLEAVED=True,
                  MERGE_LAST=False, PDL=True, TIMELINE=0, TMA=False)  # fmt: skip
    for q_heads in (False, True):
        info = compile_for(_split_rope_kernel, {**talker, "Q_HEADS": q_heads}, ATTENTION_POINTERS, aligned=STRIDES,
                           census=True)  # fmt: skip
        rows.append((f"talker split+rope{', q heads' if q_heads else ''}, 4 warps", 64 * 8 * 2 * 4, info))
    return rows


def main() -> None:
    print(f"{'kernel form (sm_90)':<40} {'regs':>4} {'instr':>6} {'BAR':>4} {'SHFL':>5} {'warp-instr at B=64':>19}")
    for name, warps, info in attention_census():
        print(f"{name:<40} {info['registers']:>4} {info['instructions']:>6} {info.get('BAR', 0):>4} "
              f"{info.get('SHFL', 0):>5} {warps * info['instructions'] / 1e6:>17.2f}M")  # fmt: skip


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
