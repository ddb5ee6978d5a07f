"""Precompiling the fused code-predictor frame: sizes are dealt across children, a child's job carries
exactly the engine's shapes and kernel settings, and the child runs the fused frame from that job alone."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from engine.fast.code_predictor_graph import FrameKernels
from engine.fast.kernels.gemv import GemvConfig
from engine.fast.precompile import deal, job_json, run_job
from engine.model.config import preset


def test_sizes_are_dealt_largest_first_and_every_size_once() -> None:
    shares = deal((1, 2, 4, 8, 16, 32, 64, 128), 3)
    assert shares == [[128, 16, 2], [64, 8, 1], [32, 4]]
    assert deal((4, 1, 4), 8) == [[4], [1]]  # duplicates once, no empty shares
    assert deal((1, 2), 0) == [[2, 1]]  # at least one child


def test_a_job_round_trips_the_engines_shapes_and_tiles() -> None:
    config = preset("1.7b")
    kernels = FrameKernels(gemv_max_rows=32, gemv={"qkv": GemvConfig(block_n=64, num_warps=8)}, radix_bits=3)
    job = json.loads(job_json(config.talker, config.code_predictor, torch.bfloat16, [8, 2], kernels, 64))
    assert job["predictor"]["hidden_size"] == config.code_predictor.hidden_size
    assert job["talker_hidden"] == config.talker.hidden_size and job["talker_vocab"] == config.talker.vocab_size
    assert job["dtype"] == "bfloat16" and job["sizes"] == [8, 2] and job["top_k_cap"] == 64
    assert job["kernels"]["gemv"]["qkv"] == {"block_n": 64, "block_k": 512, "num_warps": 8, "use_dot": None,
                                            "loop_stages": 0, "split_k": 1, "tma": False}
    assert job["kernels"]["radix_bits"] == 3 and job["kernels"]["gemv_max_rows"] == 32
    assert job["kernels"]["dot_gemv"]["32"]["down"]["block_n"] == kernels.dot_gemv[32]["down"].block_n


def test_a_child_runs_the_fused_frame_from_its_job_alone() -> None:
    config = preset("tiny")
    job = json.loads(job_json(config.talker, config.code_predictor, torch.float32, [1, 2, 4], FrameKernels(), 50))
    job["device"] = "cpu"
    run_job(job)  # the stand-in model has every attribute the frame reads: no error is the specification
    child = subprocess.run([sys.executable, "-m", "engine.fast.precompile", "--job", json.dumps(job)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert child.returncode == 0, child.stderr
