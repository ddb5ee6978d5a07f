"""Compile the fused code-predictor frame's Triton kernels in parallel child processes, before capture.

The fused frame (`code_predictor_graph`, `FrameKernels.fused`) launches a few Triton kernels per layer,
and each (product, token-row count, prologue/epilogue flags) pair is its own specialisation: over the
eight capture sizes that is dozens of compiles, which one process runs one after the other (minutes on a
cold cache). Compiled kernels land in Triton's on-disk cache (`TRITON_CACHE_DIR`, default
`~/.triton/cache`), keyed by source, signature and GPU, so any process that runs the same kernels on
the same shapes fills it for all the others. Here each child builds a code predictor of the serving
model's shapes with random weights (values do not change what is compiled) and runs the eager frame
once for its share of the batch sizes; the engine's own warm-up and capture then load every kernel
from the cache.

    parent: precompile_frames(config, dtype, sizes, kernels, top_k_cap, workers)
              -> `python -m engine.fast.precompile --job JSON` x workers, sizes dealt round-robin
    child:  CUDA context, code predictor [random], slots [max size], `_frame(n)` per size, exit 0

A failed child costs nothing but time: the parent logs it and the engine compiles what is missing
itself. Off CUDA, or without Triton, there is nothing to compile and nothing runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence

import torch
from torch import nn

from engine.model.config import CodePredictorConfig, TalkerConfig

log = logging.getLogger("engine")

DEFAULT_WORKERS = 8
CHILD_TIMEOUT_S = 600.0


def default_workers() -> int:
    """One child per CPU core the engine may use, at most `DEFAULT_WORKERS` (each holds a CUDA context)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(DEFAULT_WORKERS, cores))


def deal(sizes: Sequence[int], workers: int) -> list[list[int]]:
    """Batch sizes dealt to at most `workers` children, largest first, so each child's slowest compile
    (the widest row blocks) overlaps the others'; empty shares are dropped."""
    shares: list[list[int]] = [[] for _ in range(max(1, workers))]
    for i, size in enumerate(sorted(set(sizes), reverse=True)):
        shares[i % len(shares)].append(size)
    return [share for share in shares if share]


def job_json(talker: TalkerConfig, predictor: CodePredictorConfig, dtype: torch.dtype, sizes: Sequence[int],
             kernels: object, top_k_cap: int) -> str:  # fmt: skip
    """What one child needs to compile exactly the engine's kernels, as one JSON argument."""
    return json.dumps({
        "talker_hidden": talker.hidden_size, "talker_vocab": talker.vocab_size,
        "predictor": dataclasses.asdict(predictor), "dtype": str(dtype).removeprefix("torch."),
        "sizes": list(sizes), "kernels": dataclasses.asdict(kernels),  # type: ignore[call-overload]
        "top_k_cap": top_k_cap,
    })  # fmt: skip


def precompile_frames(talker: TalkerConfig, predictor: CodePredictorConfig, dtype: torch.dtype,
                      sizes: Sequence[int], kernels: object, top_k_cap: int, workers: int) -> float:
    """Run the children (at most `workers`, sizes dealt by `deal`) and wait for them; -> wall seconds.
    Never raises for a child's failure: the engine then compiles the rest itself."""
    started = time.perf_counter()
    children = []
    for share in deal(sizes, workers):
        command = [sys.executable, "-m", "engine.fast.precompile", "--job",
                   job_json(talker, predictor, dtype, share, kernels, top_k_cap)]  # fmt: skip
        children.append((share, subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
    failed = 0
    for share, child in children:
        try:
            _, err = child.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            _, err = child.communicate()
        if child.returncode != 0:
            failed += 1
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            log.warning("precompiling code-predictor sizes %s failed (status %s): %s", share, child.returncode,
                        " | ".join(tail))  # fmt: skip
    log.info("precompile: %d of %d children compiled their sizes", len(children) - failed, len(children))
    return time.perf_counter() - started


class _PredictorOnly(nn.Module):
    """The parts of `Qwen3TTS` the code-predictor frame reads: the predictor, the talker's codebook-0
    embedding (`talker.embed_codec`, and its table as `talker.model.codec_embedding` for the frame-input
    kernel), device and dtype."""

    def __init__(self, talker_hidden: int, talker_vocab: int, predictor: CodePredictorConfig) -> None:
        super().__init__()
        from engine.model.code_predictor import CodePredictor

        self.code_predictor = CodePredictor(predictor)
        self.talker = _CodecEmbedding(talker_vocab, talker_hidden)

    @property
    def device(self) -> torch.device:
        return self.talker.model.codec_embedding.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.talker.model.codec_embedding.weight.dtype


class _CodecEmbedding(nn.Module):
    """The talker's codebook-0 table where the talker keeps it (`model.codec_embedding`)."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.codec_embedding = nn.Embedding(vocab, hidden)

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.codec_embedding(ids)


@torch.inference_mode()
def run_job(job: dict) -> None:
    """The child: the eager fused frame once per size, on a random-weight predictor of the job's shapes."""
    from engine.executors.slots import GenerationSlots, new_code_buffer
    from engine.fast.code_predictor_graph import CodePredictorGraphs, FrameKernels
    from engine.fast.kernels.gemv import GemvConfig
    from engine.ipc.messages import Sampling
    from engine.model.layers import RotaryEmbedding

    dtype = getattr(torch, job["dtype"])
    device = torch.device(job.get("device", "cuda"))  # tests run the same job on the CPU twins
    predictor = CodePredictorConfig(**job["predictor"])
    with torch.device("meta"):  # as engine.model.weights builds the serving model: no CPU copy
        model = _PredictorOnly(job["talker_hidden"], job["talker_vocab"], predictor)
    model = model.to(dtype=dtype).to_empty(device=device)
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.reset_inv_freq()  # fp32 table on the device
    for parameter in model.parameters():
        parameter.data.normal_(0.0, 0.02)  # finite values: what is compiled does not depend on them
    spec = dict(job["kernels"])
    spec["gemv"] = {name: GemvConfig(**tile) for name, tile in spec["gemv"].items()}
    spec["dot_gemv"] = {int(rows): {name: GemvConfig(**tile) for name, tile in tiles.items()}
                        for rows, tiles in spec["dot_gemv"].items()}  # (JSON keys are strings)  # fmt: skip
    sizes = sorted(job["sizes"])
    slots = GenerationSlots(sizes[-1], job["talker_hidden"], job["talker_vocab"], device=device, dtype=dtype)
    slots.start_many(list(range(sizes[-1])), [Sampling()] * sizes[-1], list(range(sizes[-1])))
    graphs = CodePredictorGraphs(model, slots, new_code_buffer(sizes[-1], 4, device), sizes,  # type: ignore[arg-type]
                                 use_graphs=False, top_k_cap=job["top_k_cap"], kernels=FrameKernels(**spec))  # fmt: skip
    for size in sizes:
        graphs.predict(list(range(size)), list(range(size)), [0] * size)
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    """`--job JSON`: be one child. `--preset NAME`: fill the cache for that model's default engine shapes
    (e.g. while building a container image on a GPU host) and print the seconds it took."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", help="JSON from job_json (a child of precompile_frames)")
    parser.add_argument("--preset", default="1.7b", help="model shapes (engine.model.config.preset)")
    parser.add_argument("--workers", type=int, default=default_workers())
    args = parser.parse_args(argv)
    if args.job:
        run_job(json.loads(args.job))
        return 0
    from engine.fast.code_predictor_graph import FrameKernels
    from engine.fast.sampling import DEFAULT_TOP_K_CAP

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from engine.model.config import preset
    from engine.settings import EngineSettings

    config, settings = preset(args.preset), EngineSettings(args.preset, "")
    seconds = precompile_frames(config.talker, config.code_predictor, torch.bfloat16,
                                settings.capture_shapes.batch, FrameKernels(), DEFAULT_TOP_K_CAP, args.workers)
    print(f"precompiled the fused code-predictor frame for batches {settings.capture_shapes.batch} "
          f"with {args.workers} processes in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
