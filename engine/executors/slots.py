"""Device state the work kinds hand each other, preallocated once and indexed by slot numbers.

Per talker KV slot (one live generation each; the scheduler hands the numbers out), S = KV slots,
H = talker hidden, V = talker vocabulary:

    hidden       [S,H]    model dtype  last talker hidden state h_k          talker -> code predictor
    code0        [S]      int64        codebook-0 code of the frame in flight talker -> code predictor
    frame_embed  [S,H]    model dtype  sum of the frame's 16 code embeddings code predictor -> talker
    seen         [S,V]    bool         codebook-0 ids generated so far (repetition penalty)
    generated    [S]      int64        how many codebook-0 tokens were drawn
    seeds        [S]      int64        the request's sampling seed (counter-based RNG key)
    penalty      [S,1]    fp32         repetition penalty
    talker / predictor    per-slot sampler settings (greedy, temperature, top-k)

Per codec stream slot (held until the last chunk is decoded, so the talker slot can be reused earlier),
C = codec slots, F = max frames per request:

    codes        [C,F,16] int64        every frame of the request, written by the code predictor,
                                       read by the codec; never copied to the host

Nothing here is allocated per step, so CUDA graphs can later capture reads and writes of these tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from engine.ipc.messages import Sampling
from engine.model.host_copy import device_ids, to_device
from engine.model.rng import seed_tensor
from engine.model.sampling import RowSettings

NUM_CODE_GROUPS = 16


class SamplerSlots:
    """One sampler's settings per slot: greedy [S] bool, temperature [S,1] fp32, top_k [S] int64."""

    def __init__(self, num_slots: int, device: torch.device) -> None:
        self.greedy = torch.zeros(num_slots, dtype=torch.bool, device=device)
        self.temperature = torch.ones(num_slots, 1, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(num_slots, dtype=torch.int64, device=device)
        self._host_top_k = [0] * num_slots  # kmax is a host-side bound: no read-back when a batch is formed

    def set_many(self, index: Tensor, slots: list[int], host_top_k: list[int], greedy: Tensor, temperature: Tensor,
                 top_k: Tensor) -> None:  # fmt: skip
        """Install settings at `slots` (device `index` [n]) from device rows greedy [n] bool, temperature [n]
        fp32 (1.0 where greedy), top_k [n] int64 (`host_top_k`: the same values on the host); queued on the
        current stream, nothing waited for."""
        self.greedy.index_copy_(0, index, greedy)
        self.temperature.index_copy_(0, index, temperature[:, None])
        self.top_k.index_copy_(0, index, top_k)
        for slot, k in zip(slots, host_top_k, strict=True):
            self._host_top_k[slot] = k

    def host_top_k(self, slots: Sequence[int]) -> list[int]:
        """The top-k installed at each slot, from the host copy (reading it never touches the device)."""
        return [self._host_top_k[s] for s in slots]

    def rows(self, index: Tensor, slots: list[int]) -> RowSettings:
        top_ks = self.host_top_k(slots)
        kmax = 0 if any(k == 0 for k in top_ks) else max(top_ks)
        return RowSettings(self.greedy[index], self.temperature[index], self.top_k[index], kmax)


class GenerationSlots:
    """Per-KV-slot tensors shared by the talker and code-predictor executors (layout in the module docstring)."""

    def __init__(self, num_slots: int, hidden: int, vocab: int, *, device: torch.device, dtype: torch.dtype) -> None:
        self.device = device
        self.hidden = torch.zeros(num_slots, hidden, dtype=dtype, device=device)
        self.code0 = torch.zeros(num_slots, dtype=torch.int64, device=device)
        self.frame_embed = torch.zeros(num_slots, hidden, dtype=dtype, device=device)
        self.seen = torch.zeros(num_slots, vocab, dtype=torch.bool, device=device)
        self.generated = torch.zeros(num_slots, dtype=torch.int64, device=device)
        self.seeds = torch.zeros(num_slots, dtype=torch.int64, device=device)
        self.penalty = torch.ones(num_slots, 1, dtype=torch.float32, device=device)
        self.talker = SamplerSlots(num_slots, device)
        self.predictor = SamplerSlots(num_slots, device)

    def start(self, slot: int, sampling: Sampling, seed: int) -> None:
        """A new request takes `slot`: forget the previous owner's history, install this one's settings."""
        self.start_many([slot], [sampling], [seed])

    def start_many(self, slots: list[int], samplings: Sequence[Sampling], seeds: Sequence[int]) -> None:
        """New requests take `slots`: one upload of their settings through pinned memory and a few scatters,
        queued on the current stream (a Python scalar written into a CUDA tensor would wait for the device)."""
        n = len(slots)
        ints = torch.zeros(n, 5, dtype=torch.int64)  # seed, talker greedy, top_k, predictor greedy, top_k
        floats = torch.ones(n, 3, dtype=torch.float32)  # penalty, talker temperature, predictor temperature
        ints[:, 0] = seed_tensor(list(seeds), "cpu")
        for i, s in enumerate(samplings):
            ints[i, 1:] = torch.tensor([s.greedy, s.top_k, s.subtalker_greedy, s.subtalker_top_k])
            floats[i] = torch.tensor([s.repetition_penalty, 1.0 if s.greedy else s.temperature,
                                      1.0 if s.subtalker_greedy else s.subtalker_temperature])  # fmt: skip
        index = device_ids(slots, self.device)
        ints, floats = to_device(ints, self.device), to_device(floats, self.device)
        self.seen.index_fill_(0, index, False)
        self.generated.index_fill_(0, index, 0)
        self.seeds.index_copy_(0, index, ints[:, 0])
        self.penalty.index_copy_(0, index, floats[:, :1])
        self.talker.set_many(index, slots, [s.top_k for s in samplings], ints[:, 1].bool(), floats[:, 1], ints[:, 2])
        self.predictor.set_many(index, slots, [s.subtalker_top_k for s in samplings], ints[:, 3].bool(),
                                floats[:, 2], ints[:, 4])  # fmt: skip

    def index(self, slots: list[int]) -> Tensor:
        return device_ids(slots, self.device)


def check_sampling(sampling: Sampling) -> None:
    """Raise ValueError for settings the samplers cannot run (checked once, at Submit)."""
    RowSettings.talker([sampling], "cpu")
    RowSettings.code_predictor([sampling], "cpu")
    if not sampling.repetition_penalty > 0:
        raise ValueError(f"repetition_penalty must be > 0, got {sampling.repetition_penalty}")


def new_code_buffer(streams: int, max_frames: int, device: torch.device) -> Tensor:
    """codes [C,F,16] int64: every frame of every live codec stream."""
    return torch.zeros(streams, max_frames, NUM_CODE_GROUPS, dtype=torch.int64, device=device)
