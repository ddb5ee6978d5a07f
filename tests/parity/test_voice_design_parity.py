"""VoiceDesign generation parity on the tiny VoiceDesign checkpoint: the engine's greedy frames are the official ones.

The official runs (tests/parity/oracle_voice_design.py, in the oracle venv) are `generate_voice_design(text,
instruct, language, non_streaming_mode=..., do_sample=False, subtalker_dosample=False, max_new_tokens=25)`,
fp32, streaming (english) and non-streaming (auto). Our side is the engine itself: its scheduler and
executors in this process (tests/engine/helpers.py `make_loop`), one greedy Submit carrying the official
instruction as `instruct_ids`, no speaker, in the run's layout. The engine runs to its own end (EOS or the
runaway guard: the checkpoint has random but real-format weights); its first frames must equal the official
ones exactly.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.ipc.messages import Layout, Sampling, Submit
from tests.engine.helpers import make_loop, run_to_completion
from tests.parity.conftest import ORACLE_TIMEOUT_S, ROOT, VENV_PYTHON, Reference

SCRIPT = Path(__file__).with_name("oracle_voice_design.py")
GREEDY = Sampling(greedy=True, subtalker_greedy=True)
RUNS = ["streaming", "non_streaming"]


@pytest.fixture(scope="module")
def official(reference: Reference) -> tuple[dict[str, dict], dict[str, torch.Tensor]]:
    """The official greedy VoiceDesign runs, computed once per oracle output and script version."""
    out = reference.root / f"voice-design-{hashlib.sha256(SCRIPT.read_bytes()).hexdigest()[:12]}"
    if not (out / "voice_design.json").is_file():
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        proc = subprocess.run(
            [str(VENV_PYTHON), str(SCRIPT), "--ckpt", str(reference.root / "ckpt-design"), "--out", str(out)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=ORACLE_TIMEOUT_S,
        )  # fmt: skip
        if proc.returncode != 0 or not (out / "voice_design.json").is_file():
            pytest.fail(f"{SCRIPT.name} failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}", pytrace=False)
    runs = {run["name"]: run for run in json.loads((out / "voice_design.json").read_text())["runs"]}
    return runs, load_file(str(out / "voice_design.safetensors"))


@pytest.mark.parametrize("name", RUNS)
def test_greedy_voice_design_frames_of_the_engine_equal_the_official_generate(reference: Reference, official,
                                                                              name: str) -> None:  # fmt: skip
    runs, tensors = official
    run, theirs = runs[name], tensors[f"run.{name}.frames"]
    assert run["frames"] == theirs.shape[0] == run["max_frames"]  # official cut at max_new_tokens, not at EOS
    model = reference.voice_model("ckpt-design")
    assert model.config.is_voice_design and not model.config.random_weights
    assert model.tokenizer.target_ids(run["text"]) == run["text_ids"]
    assert model.tokenizer.instruct_ids(run["instruct"]) == run["instruct_ids"]
    loop = make_loop(model, kv_slots=2, max_batch=2)
    msg = Submit(request_id=1, speaker="", language=run["language"], text_ids=tuple(run["text_ids"]),
                 text_chars=len(run["text"]), text_ended=True, instruct_ids=tuple(run["instruct_ids"]),
                 layout=Layout.STREAMING if run["streaming"] else Layout.NON_STREAMING, sampling=GREEDY)  # fmt: skip
    results, frames = run_to_completion(loop, [msg])
    ours = frames[1].cpu()
    assert results[1].done is not None and ours.shape[0] >= theirs.shape[0], (results[1].error, ours.shape)
    head = ours[: theirs.shape[0]]
    assert torch.equal(head, theirs), f"first differing frame {int((head != theirs).any(1).int().argmax())}"
