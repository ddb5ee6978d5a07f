"""The GPU's nanosecond clock inside a Triton kernel, for in-kernel timelines (diagnostics, never the default path).

`globaltimer()` reads %globaltimer, which all SMs share, so stamps from different programs of one launch compare.
Inline PTX: CUDA only, never under Triton's interpreter (callers keep their timeline off there).
"""

from __future__ import annotations

from engine.fast.kernels import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def globaltimer():
        """The GPU's nanosecond clock (%globaltimer, shared by all SMs) as an int64 scalar."""
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                         pack=1)  # fmt: skip

    @triton.jit
    def sm_id():
        """The SM this program runs on (%smid) as an int32 scalar."""
        return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
