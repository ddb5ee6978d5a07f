"""Voice generation parity on the tiny Base checkpoint: greedy frames and the in-context waveform.

The official runs are `generate_voice_clone(..., do_sample=False, subtalker_dosample=False,
max_new_tokens=N+1)` with the official voice-clone prompt (x-vector streaming / non-streaming, in-context
streaming), fp32. Our side starts from the official x-vector and reference codes, builds the prompt,
generates greedily (max_frames=N) and, in-context, decodes reference + generated codes and cuts the
reference part as the official wrapper does. Also: full-size Base / VoiceDesign presets have exactly the
official tensor tables.
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.ipc.messages import Sampling
from engine.model.config import preset
from engine.model.voices import decode_in_context, embed_voice_prefill, generate_voice_codes
from engine.model.weights import expected_tensor_table
from engine.text.prompt import build_in_context_prefill, build_xvector_prefill
from tests.parity.conftest import relative_l2

RUNS = ["xvector.streaming", "xvector.non_streaming", "icl.streaming"]
GREEDY = Sampling(greedy=True, subtalker_greedy=True)


def _run(reference, voices, name: str) -> tuple[dict, torch.Tensor, torch.Tensor]:
    meta, ref = voices
    run = next(r for r in meta["runs"] if r["name"] == name)
    model = reference.voice_model("ckpt-base")
    text_ids = model.tokenizer.target_ids(run["text"])
    ids = model.config.prompt_ids
    codes = ref[f"{run['audio']}.codes"]
    if run["mode"] == "xvector":
        prefill = build_xvector_prefill(
            ids, language=run["language"], text_ids=text_ids, streaming=run["streaming"]
        )
    else:
        prefill = build_in_context_prefill(
            ids, language=run["language"], text_ids=text_ids, ref_text_ids=model.tokenizer.target_ids(meta["ref_text"]),
            ref_frames=codes.shape[0], streaming=run["streaming"],
        )  # fmt: skip
    rows, trailing, pad = embed_voice_prefill(model, prefill, ref[f"{run['audio']}.spk"], codes)
    frames = generate_voice_codes(model, rows, trailing, pad, GREEDY, seed=0, max_frames=meta["run_frames"])
    return run, frames, codes


@pytest.mark.parametrize("name", RUNS)
def test_greedy_voice_clone_frames_equal_the_official_generate(reference, voices, name: str) -> None:
    _, ref = voices
    run, frames, _ = _run(reference, voices, name)
    theirs = ref[f"run.{name}.frames"]
    assert run["frames"] == theirs.shape[0] >= 8
    assert frames.shape == theirs.shape
    assert torch.equal(frames.cpu(), theirs), (
        f"first differing frame {int((frames.cpu() != theirs).any(1).int().argmax())}"
    )


def test_in_context_waveform_equals_the_official_with_the_reference_part_cut(reference, voices) -> None:
    _, ref = voices
    _, frames, codes = _run(reference, voices, "icl.streaming")
    model = reference.voice_model("ckpt-base")
    wav = torch.from_numpy(decode_in_context(model, codes, frames))
    theirs = ref["run.icl.streaming.wav"]
    assert wav.shape == theirs.shape
    assert relative_l2(wav, theirs) <= 1e-4


@pytest.mark.parametrize("name", ["1.7b-base", "0.6b-base", "1.7b-voice-design"])
def test_full_size_voice_presets_have_the_official_tensor_tables(voices, name: str) -> None:
    meta, _ = voices
    ours = expected_tensor_table(preset(name))
    theirs = {k: tuple(v) for k, v in meta["tables"][name].items()}
    assert ours == theirs
    expected_params = {
        "1.7b-base": 1_928_677_440,
        "0.6b-base": 914_643_008,
        "1.7b-voice-design": 1_916_676_352,
    }
    assert sum(math.prod(s) for s in ours.values()) == expected_params[name]


def test_the_engine_tokenizes_a_voice_transcript_as_the_official_reference_text(reference, voices) -> None:
    meta, _ = voices
    model = reference.voice_model("ckpt-base")
    official = {tuple(p["ref_ids"]) for p in meta["prefill"] if p["model"] == "base"}
    assert len(official) == 1
    assert tuple(model.tokenizer.reference_ids(meta["ref_text"])) == official.pop()
