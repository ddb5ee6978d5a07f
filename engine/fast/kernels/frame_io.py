"""The code predictor's frame in and out, one kernel each: what `CodePredictorGraphs` otherwise does with ~9 small
PyTorch launches around the 15 steps (gathers by KV slot, a stack, copies, a cast, two index_puts).

    frame_start   per row b at slot s = index[b], c0 = code0[s]:
                  x[2b] = hidden[s];  x[2b+1] = table[c0];  frame[b, 0] = c0;  acc[b] = fp32(table[c0])
    frame_end     codes[stream[b], frames[b], :] = frame[b, :];  frame_embed[s] = acc[b] rounded to its dtype

    hidden [S,H], table [V,H] and frame_embed [S,H] in the model's dtype; code0 [S] int64; x [2B,H] (the first
    step's token rows: the talker's hidden state, then its code's embedding); frame [B,G] int64; acc [B,H] fp32
    (the frame's running code-embedding sum); codes [C,F,G] int64

Pure data movement and one rounding (fp32 -> the model's dtype, to nearest even in integer arithmetic,
`snake.round_to`, as `Tensor.to` rounds and as Triton's interpreter would not): bitwise the PyTorch twins' results. Padded rows repeat the last real row (`graphs.pad_rows`): they write the same values to
the same places, as the twins' index_puts do.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.fast.kernels import HAVE_TRITON, use_triton

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from engine.fast.kernels.snake import TRITON_DTYPES, round_to

    @triton.jit
    def _frame_start_kernel(index_ptr, hidden_ptr, code0_ptr, table_ptr, x_ptr, frame_ptr, acc_ptr, hidden_size,
                            stride_frame, BLOCK_H: tl.constexpr):  # fmt: skip
        b = tl.program_id(0)
        h = tl.arange(0, BLOCK_H)
        mask = h < hidden_size
        slot = tl.load(index_ptr + b)
        code = tl.load(code0_ptr + slot)
        tl.store(frame_ptr + b * stride_frame, code)
        state = tl.load(hidden_ptr + slot * hidden_size + h, mask=mask)
        embedded = tl.load(table_ptr + code * hidden_size + h, mask=mask)
        tl.store(x_ptr + (2 * b) * hidden_size + h, state, mask=mask)
        tl.store(x_ptr + (2 * b + 1) * hidden_size + h, embedded, mask=mask)
        tl.store(acc_ptr + b * hidden_size + h, embedded.to(tl.float32), mask=mask)

    @triton.jit
    def _frame_end_kernel(index_ptr, stream_ptr, frames_ptr, frame_ptr, acc_ptr, codes_ptr, embed_ptr, hidden_size,
                          groups, stride_frame, stride_stream, stride_codes_frame, DTYPE: tl.constexpr,
                          BLOCK_H: tl.constexpr, BLOCK_G: tl.constexpr):  # fmt: skip
        b = tl.program_id(0)
        g = tl.arange(0, BLOCK_G)
        h = tl.arange(0, BLOCK_H)
        slot = tl.load(index_ptr + b)
        stream = tl.load(stream_ptr + b)
        number = tl.load(frames_ptr + b)
        row = tl.load(frame_ptr + b * stride_frame + g, mask=g < groups)
        tl.store(codes_ptr + stream * stride_stream + number * stride_codes_frame + g, row, mask=g < groups)
        total = round_to(tl.load(acc_ptr + b * hidden_size + h, mask=h < hidden_size), DTYPE)  # then exact
        tl.store(embed_ptr + slot * hidden_size + h, total.to(DTYPE), mask=h < hidden_size)


def frame_start_reference(index: Tensor, hidden: Tensor, code0: Tensor, table: Tensor, x: Tensor, frame: Tensor,
                          acc: Tensor) -> None:  # fmt: skip
    """The twin: the gathers, the stack and the copies `CodePredictorGraphs` runs without the kernel."""
    codes = code0[index]
    embedded = table[codes]
    frame[:, 0] = codes
    x.copy_(torch.stack((hidden[index], embedded), dim=1).view(x.shape))
    acc.copy_(embedded.to(torch.float32))


def frame_start(index: Tensor, hidden: Tensor, code0: Tensor, table: Tensor, x: Tensor, frame: Tensor,
                acc: Tensor) -> None:  # fmt: skip
    """Fills x [2B,H], frame[:, 0] and acc [B,H] fp32 for the rows at slots index [B] (module docstring)."""
    if not use_triton(hidden):
        frame_start_reference(index, hidden, code0, table, x, frame, acc)
        return
    rows, hidden_size = index.shape[0], hidden.shape[1]
    assert hidden.is_contiguous() and table.is_contiguous() and x.is_contiguous() and acc.is_contiguous()
    assert x.shape == (2 * rows, hidden_size) and frame.stride(1) == 1
    _frame_start_kernel[(rows,)](index, hidden, code0, table, x, frame, acc, hidden_size, frame.stride(0),
                                 BLOCK_H=triton.next_power_of_2(hidden_size))  # fmt: skip


def frame_end_reference(index: Tensor, streams: Tensor, frames: Tensor, frame: Tensor, acc: Tensor, codes: Tensor,
                        frame_embed: Tensor) -> None:  # fmt: skip
    """The twin: the two index_puts (and the cast) `CodePredictorGraphs` runs without the kernel."""
    codes[streams, frames] = frame
    frame_embed[index] = acc.to(frame_embed.dtype)


def frame_end(index: Tensor, streams: Tensor, frames: Tensor, frame: Tensor, acc: Tensor, codes: Tensor,
              frame_embed: Tensor) -> None:  # fmt: skip
    """codes[streams[b], frames[b]] = frame[b] and frame_embed[index[b]] = acc[b] (module docstring)."""
    if not use_triton(frame_embed):
        frame_end_reference(index, streams, frames, frame, acc, codes, frame_embed)
        return
    rows, groups = frame.shape
    hidden_size = frame_embed.shape[1]
    assert frame_embed.is_contiguous() and acc.is_contiguous() and codes.stride(2) == 1 and frame.stride(1) == 1
    _frame_end_kernel[(rows,)](index, streams, frames, frame, acc, codes, frame_embed, hidden_size, groups,
                               frame.stride(0), codes.stride(0), codes.stride(1), DTYPE=TRITON_DTYPES[frame_embed.dtype],
                               BLOCK_H=triton.next_power_of_2(hidden_size),
                               BLOCK_G=triton.next_power_of_2(groups))  # fmt: skip
