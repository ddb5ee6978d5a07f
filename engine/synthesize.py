"""Command line: synthesize one utterance with the reference generation loop and write a 24 kHz WAV.

    python -m engine.synthesize --model tiny --text "Hello there." --out hello.wav

`--model` is a preset (`tiny`, `1.7b`, `0.6b`: random weights), a checkpoint directory, or a Hugging Face
repo id already in the local cache (`--download` allows fetching it). Writes mono 16-bit PCM with the
standard-library `wave` module and prints what it did, including the real-time factor.
"""

from __future__ import annotations

import argparse
import sys
import time
import wave
from pathlib import Path

import numpy as np

DTYPES = ("float32", "bfloat16", "float16")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine.synthesize", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="preset, checkpoint directory or HF repo id")
    parser.add_argument("--text", required=True)
    parser.add_argument("--out", required=True, type=Path, help="output .wav path")
    parser.add_argument("--speaker", default="ryan")
    parser.add_argument("--language", default="english", help='a language name or "auto"')
    parser.add_argument("--instruct", default="", help="optional style instruction (1.7B only)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--greedy", action="store_true", help="argmax instead of sampling (talker and predictor)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads for torch (default 1: the tiny model gains nothing from more)",
    )
    parser.add_argument("--load-format", default="auto", choices=("auto", "safetensors", "dummy"))
    parser.add_argument("--download", action="store_true", help="allow downloading a HF repo id")
    parser.add_argument("--non-streaming", action="store_true", help="put the whole text in the prefill")
    return parser.parse_args(argv)


def write_wav(path: Path, pcm: np.ndarray, sample_rate: int) -> None:
    """float PCM in [-1, 1] -> mono 16-bit little-endian WAV."""
    samples = np.clip(np.round(pcm * 32767.0), -32768, 32767).astype("<i2")
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(samples.tobytes())


def _check_voice(args: argparse.Namespace) -> None:
    """Validate speaker and language against the model's config with the prompt builder's own rules."""
    from engine.model.config import load_config, preset
    from engine.model.presets import PRESETS
    from engine.text.prompt import build_prefill

    if args.model.lower() in PRESETS and not Path(args.model).exists():
        config = preset(args.model)
    elif Path(args.model, "config.json").is_file():
        config = load_config(args.model)
    else:
        return  # a hub id: checked after it is resolved
    build_prefill(config.prompt_ids, speaker=args.speaker, language=args.language, text_ids=[0])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch  # after argument parsing, so --help stays instant

    torch.set_num_threads(max(1, args.threads))
    from engine.ipc.messages import Sampling
    from engine.model.generate import synthesize
    from engine.model.weights import load_model

    _check_voice(args)  # fail in milliseconds, before loading weights
    started = time.perf_counter()
    model = load_model(
        args.model,
        device=args.device,
        dtype=getattr(torch, args.dtype),
        load_format=args.load_format,
        download=args.download,
    )
    loaded = time.perf_counter()
    sampling = Sampling(greedy=args.greedy, subtalker_greedy=args.greedy)
    pcm = synthesize(
        model,
        args.text,
        speaker=args.speaker,
        language=args.language,
        instruct=args.instruct,
        streaming=not args.non_streaming,
        sampling=sampling,
        seed=args.seed,
    )
    done = time.perf_counter()
    sample_rate = model.config.codec.output_sample_rate
    write_wav(args.out, pcm, sample_rate)
    seconds = len(pcm) / sample_rate
    print(
        f"wrote {args.out}: {seconds:.2f} s of audio ({len(pcm)} samples at {sample_rate} Hz); "
        f"load {loaded - started:.2f} s, synthesis {done - loaded:.2f} s, "
        f"RTF {(done - loaded) / max(seconds, 1e-9):.3f}"
        + (" [random weights]" if model.config.random_weights else "")
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
