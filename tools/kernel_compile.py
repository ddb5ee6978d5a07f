"""Compile one Triton kernel specialization for a GPU architecture on a machine without a GPU (Triton + its ptxas).

    from tools.kernel_compile import compile_for
    compile_for(kernel, {"BLOCK": 64, ...}, {"idx_ptr": "*i64"}, num_warps=4)  -> {"registers", "spills", "shared"}

Arguments named in `constants` are constexprs; the other arguments ending in `_ptr` are pointers (bf16 unless
`pointers` names another type), `eps` and `scale` fp32, the rest i32. This is how the CPU suite looks at the code
paths Triton's interpreter never runs (programmatic dependent launch, inline PTX, in-kernel clocks):
`tests/fast/test_kernels_compile.py`, `tools/gemv_tiles.py --compile-only`.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

FLOAT_SCALARS = ("eps", "scale")


def compile_for(kernel: Any, constants: dict[str, Any], pointers: dict[str, str] | None = None, *,
                num_warps: int = 4, arch: int = 90, num_stages: int | None = None) -> dict[str, int]:  # fmt: skip
    """-> registers and spilled bytes a thread, shared bytes a program, of `kernel` compiled for sm_`arch`
    (`num_stages`: Triton's software-pipelining depth; None: its default)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    pointers = pointers or {}
    signature: dict[str, str] = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = pointers.get(name, "*bf16")
        else:
            signature[name] = "fp32" if name in FLOAT_SCALARS else "i32"
    source = ASTSource(kernel, signature, constexprs=constants)
    options = {"num_warps": num_warps, **({} if num_stages is None else {"num_stages": num_stages})}
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    return {**resource_usage(compiled.asm["cubin"]), "shared": compiled.metadata.shared}


def resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers and spilled bytes per thread from the cubin (`cuobjdump`, shipped with Triton's backend)."""
    from triton.backends.nvidia import compiler as nvidia

    tool = Path(nvidia.__file__).parent / "bin" / "cuobjdump"
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
