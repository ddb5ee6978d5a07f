"""Greedy VoiceDesign frames computed by the OFFICIAL qwen-tts code (oracle venv only; never imported by tests).

One promise: `python oracle_voice_design.py --ckpt DIR/ckpt-design --out OUT` leaves in OUT what
tests/parity/test_voice_design_parity.py compares against, produced by the official classes only:

    OUT/voice_design.json          the runs: text, instruct, language, streaming, the official text and
                                   instruct ids, and how many frames each run gave
    OUT/voice_design.safetensors   run.<name>.frames: `generate_voice_design(..., do_sample=False,
                                   subtalker_dosample=False, max_new_tokens=RUN_FRAMES + 1)` frames [T,16]

It reuses tools/oracle/voices.py (the tiny checkpoint it built, its greedy capture, its text and
instruction) without changing it. Run by tests/parity/conftest-style fixtures with the oracle venv's python.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ORACLE = Path(__file__).resolve().parents[2] / "tools" / "oracle"
sys.path.insert(0, str(ORACLE / "stubs"))
sys.path.insert(0, str(ORACLE))

import make_reference as mr  # noqa: E402
import torch  # noqa: E402
import voices as vo  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

RUNS = (("streaming", True, "english"), ("non_streaming", False, "auto"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    tts = mr.load_official(args.ckpt, torch.float32)
    tensors: dict[str, torch.Tensor] = {}
    runs = []
    for name, streaming, language in RUNS:
        frames, _ = vo.greedy(tts, lambda streaming=streaming, language=language, **kw: tts.generate_voice_design(
            text=vo.TEXT, instruct=vo.INSTRUCT, language=language, non_streaming_mode=not streaming, **kw))  # fmt: skip
        tensors[f"run.{name}.frames"] = frames.to(torch.int64).contiguous()
        runs.append({
            "name": name, "streaming": streaming, "language": language, "text": vo.TEXT, "instruct": vo.INSTRUCT,
            "frames": int(frames.shape[0]), "max_frames": vo.RUN_FRAMES,
            "text_ids": tts._tokenize_texts([tts._build_assistant_text(vo.TEXT)])[0][0, 3:-5].tolist(),
            "instruct_ids": tts._tokenize_texts([tts._build_instruct_text(vo.INSTRUCT)])[0][0].tolist(),
        })  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(args.out / "voice_design.safetensors"))
    (args.out / "voice_design.json").write_text(json.dumps({"runs": runs}, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
