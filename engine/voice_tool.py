"""A short-lived torch process that turns one reference recording into a saved voice.

One promise: `python -m engine.voice_tool --model M --voices-dir D NAME AUDIO [--transcript T]` decodes
AUDIO (any format PyAV reads; channels averaged to mono at the file's own rate), computes the voice
with M's speaker encoder (and codec encoder with a transcript) on the CPU, publishes it in the store D
(`engine/voice_store.py`) and prints exactly one JSON line: `{"ok": true, "voice": {...index entry}}`, or
`{"ok": false, "code": ..., "message": ...}` for a refusal (exit status 1) or a failure (code internal,
status 3). Status 2: bad arguments.

Only those two encoders are loaded (`engine.model.voice_encoders`: their tensors alone are read from the
checkpoint; the talker, code predictor and codec decoder are never built), with weights equal to the
full model's, so the voice is the one `compute_voice` gives with `load_model(M)`.

It exists so a torch-free process (the gateway) can register voices: it runs this as a subprocess,
with a deadline, and never shares a device with the engines (it runs on the CPU). Limits are checked
before the expensive work: the file's size first, then the decoded duration while decoding.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from engine.voice_store import VoiceLimits, VoiceStore, VoiceStoreError, check_duration, check_name


def decode_audio(path: Path, max_seconds: float) -> tuple[object, int]:
    """-> (float32 mono PCM [n] as numpy, sample rate). Channels are averaged (librosa's mono); decoding
    stops with too_long once the audio passes `max_seconds`."""
    import av
    import numpy as np

    try:
        container = av.open(str(path))
    except (av.error.FFmpegError, OSError) as error:
        raise VoiceStoreError("bad_audio", f"cannot read the reference audio: {error}") from None
    with container:
        streams = container.streams.audio
        if not streams:
            raise VoiceStoreError("bad_audio", "the file has no audio stream")
        stream = streams[0]
        rate = int(stream.rate or stream.codec_context.sample_rate or 0)
        if rate <= 0:
            raise VoiceStoreError("bad_audio", "the audio stream has no sample rate")
        resampler = av.AudioResampler(format="fltp", rate=rate)  # planar float, the stream's own layout
        chunks: list[np.ndarray] = []
        samples = 0
        try:
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    planes = out.to_ndarray()  # [channels, n]
                    chunks.append(planes.mean(axis=0, dtype=np.float32) if planes.shape[0] > 1 else planes[0])
                    samples += planes.shape[1]
                if samples > (max_seconds + 1.0) * rate:
                    check_duration(samples / rate, VoiceLimits(min_seconds=0.0, max_seconds=max_seconds))
        except av.error.FFmpegError as error:
            raise VoiceStoreError("bad_audio", f"cannot decode the reference audio: {error}") from None
    pcm = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    return pcm, rate


def save_voice(*, model: str, voices_dir: str, name: str, audio: Path, transcript: str | None,
               load_format: str = "auto", reserved: tuple[str, ...] = (),
               limits: VoiceLimits = VoiceLimits()) -> dict:  # noqa: B008  # fmt: skip
    """Everything the command does, in this process; -> the saved voice's index entry as a dict."""
    store = VoiceStore(voices_dir, limits)
    check_name(name, reserved)
    if (store.root / name).exists():
        raise VoiceStoreError("exists", f"a voice named {name!r} exists; delete it first")
    size = audio.stat().st_size
    if size > limits.max_audio_bytes:
        raise VoiceStoreError("too_large", f"reference audio is {size} bytes, the limit is {limits.max_audio_bytes}")
    pcm, rate = decode_audio(audio, limits.max_seconds)
    import torch

    from engine.model.voice_encoders import load_voice_encoders
    from engine.voice_store import compute_voice

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))  # beside the engines, not over them
    encoders = load_voice_encoders(model, device="cpu", load_format=load_format)
    voice = compute_voice(encoders, pcm, rate, transcript, limits)
    ext = audio.suffix.lower().lstrip(".") or "bin"
    info = store.save(name, model_id=model, audio=audio.read_bytes(), audio_ext=ext, voice=voice,
                      transcript=transcript, reserved=reserved)  # fmt: skip
    return asdict(info)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.voice_tool", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the Base model the engines serve (same string as their --model)")
    p.add_argument("--load-format", default="auto", choices=("auto", "safetensors", "dummy"))
    p.add_argument("--voices-dir", required=True)
    p.add_argument("--transcript", default=None, help="what the reference says (in-context cloning: also codes)")
    p.add_argument("--reserved", default="", help="comma-separated names a voice may not take (built-ins)")
    p.add_argument("--max-seconds", type=float, default=VoiceLimits.max_seconds)
    p.add_argument("--max-audio-bytes", type=int, default=VoiceLimits.max_audio_bytes)
    p.add_argument("--max-voices", type=int, default=VoiceLimits.max_voices)
    p.add_argument("--max-total-bytes", type=int, default=VoiceLimits.max_total_bytes)
    p.add_argument("name")
    p.add_argument("audio", type=Path)
    args = p.parse_args(argv)
    limits = VoiceLimits(max_voices=args.max_voices, max_audio_bytes=args.max_audio_bytes,
                         max_total_bytes=args.max_total_bytes, max_seconds=args.max_seconds)  # fmt: skip
    try:
        info = save_voice(model=args.model, voices_dir=args.voices_dir, name=args.name, audio=args.audio,
                          transcript=args.transcript or None, load_format=args.load_format,
                          reserved=tuple(n for n in args.reserved.split(",") if n), limits=limits)  # fmt: skip
    except VoiceStoreError as error:
        print(json.dumps({"ok": False, "code": error.code, "message": str(error)}), flush=True)
        return 1
    except Exception as error:  # a model that does not load, a full disk, ...: still one JSON line
        print(json.dumps({"ok": False, "code": "internal", "message": f"{type(error).__name__}: {error}"}), flush=True)
        return 3
    print(json.dumps({"ok": True, "voice": info}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
