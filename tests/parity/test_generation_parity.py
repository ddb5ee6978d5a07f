"""Along the official 32-frame greedy history, our processed probabilities equal the official ones.

Reference (tools/oracle/make_reference.py): the official generate in greedy mode gives frames [32,16] and
the 33rd codebook-0 token; the official generate in sampling mode, its draws forced onto that history,
gives the processed probabilities (penalty, EOS mask, suppression, temperature 0.9, top-k 50, softmax)
before each talker draw [33,3072] and each code-predictor draw [32,15,2048].
"""

from __future__ import annotations

import json

import pytest
import torch

from engine.ipc.messages import Sampling
from engine.model.generate import generate_codes, teacher_forced_probs
from engine.text import PromptIds, TextTokenizer, build_prefill
from tests.parity.conftest import Reference

pytestmark = pytest.mark.parity
RUNS = ["1b7.streaming", "1b7.non_streaming", "0b6.streaming", "0b6.non_streaming"]
GREEDY = Sampling(greedy=True, subtalker_greedy=True)
PROB_ATOL = 1e-6


def _setup(reference: Reference, name: str):
    meta = {m["name"]: m for m in reference.json("runs.json")}[name]
    ckpt = reference.root / meta["checkpoint"]
    model = reference.model(meta["checkpoint"], torch.float32)
    ids = PromptIds.from_config(json.loads((ckpt / "config.json").read_text()))
    tokenizer = TextTokenizer.from_dir(ckpt)
    assert tokenizer.target_ids(meta["text"]) == meta["text_ids"]
    prefill = build_prefill(
        ids, speaker=meta["speaker"], language=meta["language"], text_ids=meta["text_ids"],
        instruct_ids=meta["instruct_ids"], streaming=meta["streaming"],
    )  # fmt: skip
    tensors = reference.tensors("runs.safetensors")
    return (
        meta,
        model,
        prefill,
        {k.split(".", 2)[2]: v for k, v in tensors.items() if k.startswith(name + ".")},
    )


@pytest.mark.parametrize("name", RUNS)
def test_processed_probabilities_equal_the_official_ones_at_every_step(
    reference: Reference, name: str
) -> None:
    meta, model, prefill, official = _setup(reference, name)
    frames = official["frames"]
    talker, predictor = teacher_forced_probs(model, prefill, frames, Sampling())
    assert talker.shape == official["talker_probs"].shape and talker.dtype == torch.float32
    assert predictor.shape == official["cp_probs"].shape
    for k in range(talker.shape[0]):
        torch.testing.assert_close(talker[k], official["talker_probs"][k], rtol=0, atol=PROB_ATOL,
                                   msg=f"talker step {k}")  # fmt: skip
    for k in range(predictor.shape[0]):
        torch.testing.assert_close(predictor[k], official["cp_probs"][k], rtol=0, atol=PROB_ATOL,
                                   msg=f"code predictor, frame {k}")  # fmt: skip
    # Temperature and top-k keep the argmax, so the official greedy tokens are the argmax of these rows.
    expected_code0 = torch.cat([frames[:, 0], torch.tensor([meta["last_talker_token"]])])
    assert torch.equal(talker.argmax(-1), expected_code0)
    assert torch.equal(predictor.argmax(-1), frames[:, 1:])


def test_greedy_teacher_forcing_gives_one_hot_rows_at_the_official_tokens(reference: Reference) -> None:
    _meta, model, prefill, official = _setup(reference, "1b7.streaming")
    steps = 8
    frames = official["frames"]
    talker, predictor = teacher_forced_probs(model, prefill, frames, GREEDY, step_count=steps)
    assert talker.shape[0] == steps + 1 and predictor.shape[0] == steps
    assert torch.equal(talker, torch.nn.functional.one_hot(frames[: steps + 1, 0], talker.shape[-1]).float())
    assert torch.equal(predictor.argmax(-1), frames[:steps, 1:])


@pytest.mark.parametrize("name", RUNS)
def test_greedy_generation_reproduces_the_official_32_frames(reference: Reference, name: str) -> None:
    _meta, model, prefill, official = _setup(reference, name)
    frames = generate_codes(model, prefill, GREEDY, seed=0, max_frames=official["frames"].shape[0])
    assert torch.equal(frames.cpu(), official["frames"])
