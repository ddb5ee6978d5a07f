"""The executors on a CUDA device: the same request batch reproduces the reference loop run alone there
(tiny model, fp32), and the full-size random-weight model runs every work kind in bf16."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.ipc.messages import DoneReason, Layout, Sampling
from engine.model.weights import load_model
from engine.request import WorkKind, length_model_frames
from engine.settings import FastPath
from tests.engine.helpers import SENTENCES, make_loop, reference, run_to_completion, submit

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("sampling", [Sampling(greedy=True, subtalker_greedy=True), Sampling()], ids=["greedy", "sampled"])
def test_batched_requests_on_cuda_equal_each_request_alone(sampling: Sampling) -> None:
    model = load_model("tiny", device="cuda")
    loop = make_loop(model)
    msgs = [submit(model, i + 1, text, seed=50 + i, sampling=sampling,
                   layout=Layout.NON_STREAMING if i % 3 == 2 else Layout.STREAMING)
            for i, text in enumerate(SENTENCES[:6])]
    results, frames = run_to_completion(loop, msgs)
    assert loop.lifetime_max_batch[WorkKind.TALKER_DECODE] > 1
    for msg in msgs:
        codes, pcm = reference(model, msg)
        result = results[msg.request_id]
        assert result.done.reason is DoneReason.COMPLETED
        assert torch.equal(frames[msg.request_id], codes)
        # Tokens are exact; the PCM is not bit-exact on CUDA: cuDNN picks other convolution algorithms (and
        # TF32) for a chunk than for the whole sequence. Measured on an H200: at most 87 LSB (0.27% of full scale).
        assert np.abs(result.samples.astype(np.int32) - pcm).max() <= 256


def test_full_size_random_model_runs_every_work_kind_in_bf16() -> None:
    model = load_model("1.7b", device="cuda", dtype=torch.bfloat16)
    loop = make_loop(model, kv_slots=16, max_batch=16, max_context=1024, prefill_token_buckets=(64, 128, 256))
    msgs = [submit(model, i + 1, SENTENCES[i % len(SENTENCES)], seed=i) for i in range(16)]
    results, _ = run_to_completion(loop, msgs)
    for msg in msgs:
        assert results[msg.request_id].done.frames == length_model_frames(msg.text_chars)
    assert loop.lifetime_max_batch[WorkKind.CODE_PREDICT] == 16


@pytest.mark.parametrize(("codec_fill_frames", "codec_kernels", "codec_layout"),
                         [(4, "fused", "channels-last"), (0, "ops", "ncl"), (4, "ops", "ncl"), (0, "fused", "ncl"),
                          (4, "fused", "ncl"), (4, "fused-convs", "channels-last")],
                         ids=["defaults", "plain", "early-rows-only", "fused-codec-kernels-only", "ncl", "fused-convs"])
def test_codec_lanes_on_cuda_give_each_request_what_it_gets_alone(codec_fill_frames: int, codec_kernels: str,
                                                                  codec_layout: str) -> None:
    """The fast codec on its two runners: newcomers' first chunks replay on the generation stream while the codec
    stream replays other streams' chunks, both over one state pool; neither may touch the other's rows. With and
    without early codec rows, the fused codec kernels and the channels-last vocoder (all on by default)."""
    model = load_model("tiny", device="cuda")
    loop = make_loop(model, fast=FastPath(codec=True), codec_fill_frames=codec_fill_frames,
                     codec_kernels=codec_kernels, codec_layout=codec_layout)
    msgs = [submit(model, i + 1, text, seed=70 + i) for i, text in enumerate(SENTENCES)]
    results, frames = run_to_completion(loop, msgs, submit_at=[0, 0, 4, 9, 15, 24, 35, 50])  # staggered arrivals
    codec = loop.executors.codec
    assert codec.first_graphs is not None and codec.first_graphs.replays > 0 and codec.graphs is not None
    assert codec.graphs.replays > 0
    # The codec lane's graphs replay beside the generation stream's: captured on a stream of their own, their GEMMs
    # have a cuBLAS workspace of their own; the first-chunk runner's replay on the generation stream, like the rest.
    shared = torch.cuda.graphs.graph.default_capture_stream
    assert codec.graphs.capture_stream is not None and codec.graphs.capture_stream != shared
    assert codec.first_graphs.capture_stream is None
    for msg in msgs:
        codes, pcm = reference(model, msg)
        assert torch.equal(frames[msg.request_id], codes)
        samples = results[msg.request_id].samples.astype(np.int32)
        assert samples.shape == pcm.shape, (msg.request_id, samples.shape, pcm.shape)
        off = np.abs(samples - pcm)
        assert off.max() <= 256, (msg.request_id, int(off.max()), int((off > 256).sum()), int(np.argmax(off > 256)))
