"""The codec step's one-kernel state write-back leaves the pool exactly as one `index_copy_` per state tensor does.

The kernel runs in Triton's CPU interpreter (a subprocess: the interpreter is chosen at import time) on the new
state of real tiny-codec steps (conv-buffer tails, fresh rings, a ragged step's windows), padding rows that all
point at the scratch row, and sources whose strides cannot be merged.
"""

from __future__ import annotations

import pytest
import torch

from engine.fast.kernels.state_scatter import _merged
from tests.fast.helpers import run_interpreted

INTERPRETED = r"""
import json, torch
from engine.codec.config import codec_preset
from engine.codec.stream import CodecStatePool
from engine.codec.weights import random_codec
from engine.fast.codec_fast import FastCodecDecoder
from engine.fast.kernels.state_scatter import StateScatter
from tests.codec.helpers import random_codes

torch.manual_seed(0)
result = {}
for dtype in (torch.float32, torch.bfloat16):
    codec = random_codec(codec_preset("tiny"), seed=3).to(dtype)
    fast = FastCodecDecoder(codec, "fp32" if dtype == torch.float32 else "bf16")
    pool = CodecStatePool(codec.config, 6, "cpu", dtype)
    slots = [pool.alloc() for _ in range(6)]
    pool.flat.normal_()  # every row holds a distinct old state
    for case, (index, frames, ragged) in {
        "whole": ([4, 1, 3], 2, None),
        "padded": ([2, 5, 5, 5], 1, None),  # rows 1..3: padding, all on row 5 (the scratch row's role)
        "ragged": ([0, 3], 3, torch.tensor([1, 3])),
    }.items():
        index = torch.tensor(index)
        positions, state = pool.gather(index)
        _, new = fast.forward_stream(random_codes(len(index), frames, seed=1), positions, state, ragged)
        new["pre_conv"] = new["pre_conv"].transpose(1, 2).contiguous().transpose(1, 2)  # runs across rows
        ring = new["pre_transformer.layers.0.k"]
        wide = torch.zeros(*ring.shape[:2], ring.shape[2] + 2, ring.shape[3] + 1, dtype=dtype)
        new["pre_transformer.layers.0.k"] = wide[:, :, : ring.shape[2], : ring.shape[3]]  # strides that do not merge
        new["pre_transformer.layers.0.k"].copy_(ring)
        twin, kernel = pool.flat.clone(), pool.flat.clone()
        for flat in (twin, kernel):
            views = {name: flat[:, a:b].view(flat.shape[0], *pool.tensors[name].shape[1:])
                     for name, (a, b) in pool.columns.items()}
            scatter = StateScatter(flat, pool.columns, views)
            if flat is twin:
                for name, tensor in views.items():
                    tensor.index_copy_(0, index, new[name])
            else:
                scatter(index, new)
                scatter(index, new)  # the second call rewrites its tables in place
        unique = [r for r in range(6) if int((index == r).sum()) < 2]
        result[f"{dtype}-{case}"] = {
            "equal": bool(torch.equal(twin[unique], kernel[unique])),
            "changed": bool(not torch.equal(kernel[index], pool.flat[index])),
            # a row written by several padding rows holds one writer's whole new state
            "duplicate_is_a_writer": all(
                any(torch.equal(kernel[r], torch.cat([new[name][i].reshape(-1) for name in pool.columns]))
                    for i in range(len(index)) if int(index[i]) == r)
                for r in range(6) if int((index == r).sum()) > 1),
        }
print(json.dumps(result))
"""


def test_the_one_kernel_write_back_equals_index_copy_per_tensor_in_the_triton_interpreter():
    pytest.importorskip("triton")
    result = run_interpreted(INTERPRETED, timeout_s=600)
    assert len(result) == 6
    for case, checks in result.items():
        assert checks == {"equal": True, "changed": True, "duplicate_is_a_writer": True}, case


def test_sources_are_described_as_rows_and_runs_or_copied_when_their_strides_do_not_merge():
    buffer = torch.zeros(3, 8, 20)
    tail = buffer[..., 14:]  # a conv buffer's last 6 samples: 8 runs of 6
    assert _merged(tail)[1:] == (20, 1, 8, 6)
    ring = torch.zeros(3, 4, 7, 5)  # contiguous: one run of 140
    assert _merged(ring)[1:] == (1, 1, 1, 140) and _merged(ring)[0] is ring
    across = torch.zeros(3, 5, 7, 4).permute(0, 3, 1, 2)  # [4, 5, 7] with strides [1, 28, 4]: [4, 35] runs
    assert _merged(across)[1:] == (1, 4, 4, 35) and _merged(across)[0] is across
    odd = torch.randn(3, 4, 10, 6)[:, :, :5, :3]  # three dims that do not merge
    copy, stride_r, stride_l, rows, length = _merged(odd)
    assert copy.is_contiguous() and torch.equal(copy, odd) and (rows, length, stride_l) == (1, 60, 1)
