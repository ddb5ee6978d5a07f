"""tools/conv_snake_bench.py on a CPU (`--dry-run`): it finds every conv of a codec step on both decoders and
writes a timing per tile for each distinct one (the times themselves mean nothing off the GPU), through the path
the GPU takes (warm-ups, the replay-safety check, the calls a graph would capture, run eagerly)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.codec.config import codec_preset
from engine.codec.layers import DecoderBlock
from engine.fast.kernels.conv_snake import conv_snake
from tools import conv_snake_bench as bench

ROOT = Path(__file__).resolve().parents[2]


def test_the_tile_sweep_runs_on_a_cpu_and_accounts_for_every_conv_of_the_step(tmp_path: Path):
    out = tmp_path / "sweep.json"
    run = subprocess.run([sys.executable, "tools/conv_snake_bench.py", "--dry-run", "--shapes", "1x1", "2x4",
                          "--calls-per-graph", "3", "--repeats", "1", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    tiles = len(result["tiles"])
    assert tiles > 1 and result["tiles"][0] == {"block_m": 64, "block_n": 128, "block_k": None, "num_warps": 4,
                                                "num_stages": 3}  # the default tile first  # fmt: skip
    # a dry run caps the calls per graph at 2 and keeps the smaller --repeats
    assert result["timing"] == {"mode": "cpu-eager", "calls_per_graph": 2, "repeats": 1, "warmups": bench.WARMUPS}
    convs = 1 + 2 * len(DecoderBlock.DILATIONS) * len(codec_preset("tiny").upsample_rates)  # decoder.0, two per residual unit
    for shape in result["shapes"]:
        assert sum(call["count"] for call in shape["calls"]) == convs
        assert all(len(call["tile_ms"]) == tiles and call["baseline_ms"] > 0 for call in shape["calls"])
        # no call of the decoder writes over its own input: every output is timed where the step writes it
        assert all(call["redirected"] == [] and call["baseline_redirected"] == [] for call in shape["calls"])
    assert "| 1 x 1 |" in run.stdout and "best tile over every shape" in run.stdout
    assert "where the GPU captures them into a CUDA graph" in run.stdout


def _conv_args(batch: int = 2, c: int = 8, length: int = 12, k: int = 3, dilation: int = 2) -> tuple[tuple, dict]:
    """A conv_snake call as the decoder's conv2 makes it: channels-last x, residual and outputs."""
    gen = torch.Generator().manual_seed(0)

    def channels_last(channels: int, steps: int) -> torch.Tensor:
        return torch.randn(batch, steps, channels, generator=gen).transpose(1, 2)

    x = channels_last(c, length + (k - 1) * dilation)
    taps = torch.randn(k, c, c, generator=gen) / c
    alpha, inv_beta = torch.rand(c, generator=gen) + 0.5, torch.rand(c, generator=gen) + 0.5
    kwargs = {"bias": torch.randn(c, generator=gen), "residual": channels_last(c, length),
              "out": channels_last(c, length), "sum_out": channels_last(c, length)}  # fmt: skip
    return (x, taps, dilation, alpha, inv_beta), kwargs


def test_an_output_written_over_an_input_is_redirected_and_the_check_catches_it_if_not():
    args, kwargs = _conv_args()
    kwargs["sum_out"] = kwargs["residual"]  # the running sum written back into the residual: added again per replay
    with pytest.raises(RuntimeError, match="changed its input residual"):
        bench.check_replayable(conv_snake, args, kwargs)
    safe, swapped = bench.replay_safe(conv_snake, args, kwargs)
    assert swapped == ["sum_out"]
    assert safe["sum_out"].data_ptr() != kwargs["residual"].data_ptr()
    assert safe["sum_out"].shape == kwargs["residual"].shape and safe["sum_out"].stride() == kwargs["residual"].stride()
    assert safe["out"] is kwargs["out"] and safe["residual"] is kwargs["residual"]  # the rest untouched
    conv_snake(*args, **safe)  # the warm-up
    bench.check_replayable(conv_snake, args, safe)


def test_outputs_in_views_of_another_buffer_are_left_where_the_step_writes_them():
    args, kwargs = _conv_args()
    buffer = torch.empty(2, 4 + 12, 8).transpose(1, 2)  # the next conv's input, history first: out is its body
    kwargs["out"] = buffer[..., 4:]
    safe, swapped = bench.replay_safe(conv_snake, args, kwargs)
    assert swapped == [] and safe["out"] is kwargs["out"]
    conv_snake(*args, **safe)
    bench.check_replayable(conv_snake, args, safe)


def test_the_check_catches_outputs_that_accumulate_over_runs():
    def accumulate(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
        return out.add_(x)

    x, out = torch.ones(4, 4), torch.zeros(4, 4)
    accumulate(x, out=out)
    with pytest.raises(RuntimeError, match="wrote out differently"):
        bench.check_replayable(accumulate, (x,), {"out": out})


def test_a_timed_call_is_warmed_up_checked_then_run_calls_times_per_repeat_on_the_cpu():
    runs = []

    def call(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
        runs.append(1)
        return torch.mul(x, 2, out=out)

    ms = bench.time_call(call, (torch.ones(3),), {"out": torch.empty(3)}, "cpu", repeats=3, calls=5)
    assert ms > 0 and len(runs) == bench.WARMUPS + 1 + 3 * 5


def test_the_recorded_step_runs_with_cudnn_benchmark_on_so_the_timed_calls_find_their_algorithms_cached(
    monkeypatch: pytest.MonkeyPatch,
):
    from engine.codec.weights import random_codec
    from engine.executors.codec import codec_dtype
    from engine.fast import codec_fast

    flags = []
    real = codec_fast.conv_snake

    def spy(*args, **kwargs):
        flags.append(torch.backends.cudnn.benchmark)
        return real(*args, **kwargs)

    monkeypatch.setattr(codec_fast, "conv_snake", spy)
    codec = random_codec(codec_preset("tiny"), device="cpu", dtype=codec_dtype("bf16"), seed=bench.SEED)
    decoder = codec_fast.FastCodecDecoder(codec, "bf16", fused_attention=True, channels_last=True, triton_convs=True)
    before = torch.backends.cudnn.benchmark
    calls = bench._record(decoder, 1, 1, "cpu")
    assert calls and flags and all(flags)  # the history steps and the recorded one
    assert torch.backends.cudnn.benchmark == before  # put back
