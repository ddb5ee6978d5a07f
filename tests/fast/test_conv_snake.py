"""A vocoder conv with its SnakeBeta in one kernel computes what the conv and the SnakeBeta kernel compute.

The Triton kernel runs in Triton's CPU interpreter (a subprocess: the interpreter is chosen at import time), against
its twin (the conv, then the SnakeBeta twin) over channels-last views with histories, dilations, residuals and
channel counts that fill no tile; and inside the fast codec, whose decodes with `triton_convs` must equal the
channels-last decoder's. On a plain CPU the twin runs in the decoder.
"""

from __future__ import annotations

import pytest
import torch

from engine.codec.config import codec_preset
from engine.codec.stream import CodecStatePool, decode_incremental
from engine.codec.weights import random_codec
from engine.fast.codec_fast import FastCodecDecoder
from tests.codec.helpers import random_codes, relative_l2
from tests.fast.helpers import run_interpreted

INTERPRETED = r"""
import json, torch
from engine.codec.config import codec_preset
from engine.codec.stream import CodecStatePool, decode_incremental
from engine.codec.weights import random_codec
from engine.fast.codec_fast import FastCodecDecoder
from engine.fast.kernels.conv_snake import ConvTile, conv_snake, conv_snake_reference, conv_taps
from engine.fast.kernels.snake import snake_params
from tests.codec.helpers import random_codes, relative_l2


def channels_last(batch, channels, length, dtype, pad=0):
    # [B, C, L] in [B, L, C + pad] memory: a view whose channels are contiguous but rows are strided
    return torch.randn(batch, length, channels + pad).to(dtype)[..., :channels].transpose(1, 2)


torch.manual_seed(0)
result = {"kernel": [], "decode": {}}
for dtype in (torch.float32, torch.bfloat16):
    for batch, c_in, c_out, k, dilation, history, length in [
        (2, 8, 8, 7, 3, 18, 11), (1, 24, 40, 7, 1, 6, 70), (3, 40, 24, 1, 1, 0, 33), (2, 96, 16, 7, 9, 54, 5),
    ]:
        x = channels_last(batch, c_in, history + length, dtype, pad=3)
        taps = conv_taps(torch.randn(c_out, c_in, k).to(dtype) / (c_in * k) ** 0.5)
        alpha, inv_beta = snake_params(torch.randn(c_out).to(dtype) * 0.4, torch.randn(c_out).to(dtype) * 0.4)
        bias = torch.randn(c_out).to(dtype)
        residual = channels_last(batch, c_out, length, dtype)
        for with_residual in (False, True):
            outs = []
            original = channels_last(batch, c_out, length + 4, dtype)  # out: a view after a 4-sample history
            small = ConvTile(block_m=16, block_n=16, block_k=16, num_warps=2, num_stages=2)  # tiles a sweep may pick
            for fn in (conv_snake, lambda *a, **kw: conv_snake(*a, tile=small, **kw), conv_snake_reference):
                buffer = original.transpose(1, 2).clone().transpose(1, 2)  # the same values and memory order
                total = channels_last(batch, c_out, length, dtype) if with_residual else None
                got = fn(x, taps, dilation, alpha, inv_beta, bias=bias, residual=residual if with_residual else None,
                         out=buffer[..., 4:], sum_out=total)
                assert got.data_ptr() == buffer[..., 4:].data_ptr()
                outs.append((buffer.clone(), total))
            (ours, our_sum), (small_tiles, small_sum), (theirs, their_sum) = outs
            result["kernel"].append({
                "dtype": str(dtype), "k": k, "residual": with_residual,
                "out_rel": relative_l2(ours[..., 4:], theirs[..., 4:]),
                "small_tile_rel": relative_l2(small_tiles[..., 4:], theirs[..., 4:]),
                "history_untouched": torch.equal(ours[..., :4], original[..., :4]),
                "sum_rel": relative_l2(our_sum, their_sum) if with_residual else 0.0,
            })
    codes = random_codes(2, 4, seed=2)
    waves = {}
    for triton_convs in (False, True):
        codec = random_codec(codec_preset("tiny"), seed=9).to(dtype)
        precision = "fp32" if dtype == torch.float32 else "bf16"
        fast = FastCodecDecoder(codec, precision, fused_attention=True, channels_last=True, triton_convs=triton_convs)
        pool = CodecStatePool(codec.config, 2, "cpu", codec.dtype)
        slots = [pool.alloc() for _ in range(2)]
        whole = [decode_incremental(fast, pool, slots, codes[..., a:b]) for a, b in ((0, 1), (1, 2))]
        ragged = decode_incremental(fast, pool, slots, codes[..., 2:4], frames=[2, 1])
        waves[triton_convs] = (torch.cat([torch.cat(whole, -1), ragged[:, :1920]], -1).float(), pool.flat.clone())
    result["decode"][str(dtype)] = {
        "wave_rel": relative_l2(waves[True][0], waves[False][0]),
        "state_rel": relative_l2(waves[True][1].float(), waves[False][1].float()),
    }
print(json.dumps(result))
"""


def test_the_conv_and_snakebeta_kernel_matches_its_twin_in_the_triton_interpreter():
    pytest.importorskip("triton")
    result = run_interpreted(INTERPRETED, timeout_s=900)
    assert len(result["kernel"]) == 16
    for case in result["kernel"]:
        # fp32: the conv's summation order only; bf16: plus a last-bit flip of the rounded conv output, carried on
        bound = 1e-5 if case["dtype"] == "torch.float32" else 2e-2
        assert case["out_rel"] < bound and case["small_tile_rel"] < bound, case
        assert case["sum_rel"] < bound, case
        assert case["history_untouched"], case
    assert result["decode"]["torch.float32"]["wave_rel"] < 1e-5, result["decode"]
    assert result["decode"]["torch.float32"]["state_rel"] < 1e-5, result["decode"]
    assert result["decode"]["torch.bfloat16"]["wave_rel"] < 5e-2, result["decode"]


def test_triton_convs_on_a_cpu_decode_as_the_channels_last_decoder():
    codec = random_codec(codec_preset("tiny"), seed=9)
    codes = random_codes(2, 6, seed=3)
    waves = []
    for triton_convs in (False, True):
        fast = FastCodecDecoder(codec, "fp32", channels_last=True, triton_convs=triton_convs)
        pool = CodecStatePool(codec.config, 2, "cpu", codec.dtype)
        slots = [pool.alloc() for _ in range(2)]
        waves.append(torch.cat([decode_incremental(fast, pool, slots, codes[..., a:b]) for a, b in ((0, 2), (2, 6))],
                               dim=-1))  # fmt: skip
    assert relative_l2(waves[1], waves[0]) < 1e-5  # conv1d against conv2d: summation order only


def test_triton_convs_need_the_channels_last_layout():
    with pytest.raises(ValueError, match="channels_last"):
        FastCodecDecoder(random_codec(codec_preset("tiny"), seed=9), "fp32", triton_convs=True)


def test_the_fused_convs_setting_needs_the_channels_last_layout():
    from engine.settings import EngineSettings, parse_args

    assert parse_args(["--model", "tiny", "--socket", "@x", "--codec-kernels", "fused-convs"]).codec_kernels == (
        "fused-convs"
    )
    with pytest.raises(ValueError, match="channels-last"):
        EngineSettings(model="tiny", socket="@x", codec_kernels="fused-convs", codec_layout="ncl")
