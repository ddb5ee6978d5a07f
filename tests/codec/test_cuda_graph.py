"""The streaming step has fixed shapes and no host syncs: it captures in a CUDA graph and replays bitwise."""

from __future__ import annotations

import pytest
import torch

from engine.codec.config import codec_preset
from engine.codec.stream import CodecStatePool, decode_incremental
from engine.codec.weights import random_codec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_streaming_step_replays_in_a_cuda_graph_bitwise_equal_to_eager(dtype):
    decoder = random_codec(codec_preset("full"), device="cuda", dtype=dtype, seed=1)
    batch, frames = 8, 4
    pool = CodecStatePool(decoder.config, batch, "cuda", dtype)
    slots = [pool.alloc() for _ in range(batch)]
    for i, slot in enumerate(slots):  # every stream at its own position, some past the 72-frame window
        history = torch.randint(0, 2048, (1, 16, 1 + 13 * i), device="cuda")
        decode_incremental(decoder, pool, [slot], history, check_code_values=False)

    positions, state = pool.gather(torch.tensor(slots, device="cuda"))
    codes = torch.randint(0, 2048, (batch, 16, frames), device="cuda")
    with torch.no_grad():
        eager_wav, eager_state = decoder.forward_stream(codes, positions, state)
        static = (codes.clone(), positions.clone(), {k: v.clone() for k, v in state.items()})
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                decoder.forward_stream(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graph_wav, graph_state = decoder.forward_stream(*static)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(graph_wav, eager_wav)
    assert all(torch.equal(graph_state[name], eager_state[name]) for name in eager_state)
