"""Voice-cloning and VoiceDesign reference data computed by the OFFICIAL qwen-tts code (oracle venv only).

One promise: `voices_reference(DIR)` (called by make_reference.py, or `python voices.py --out DIR` alone)
leaves in DIR what tests/parity/test_voice_*.py compare against, produced by the official classes only:

    DIR/ckpt-base/           tiny 1.7B-style Base checkpoint (speaker encoder 64 wide = talker width),
                             speech tokenizer with a randomised ENCODER (codebook buffers included)
    DIR/ckpt-design/         tiny 1.7B-style VoiceDesign checkpoint
    DIR/voices.json + voices.safetensors
        audio.<name>         reference PCM (float32, its own rate) and, from the official path
                             (`create_voice_clone_prompt`: librosa resampling, mel, ECAPA, Mimi encode):
        <name>.mel [frames,128], <name>.spk [64], <name>.codes [T,16]
        prefill.<k>.rows / .trailing
                             official `inputs_embeds` / `trailing_text_hidden` for x-vector, in-context
                             and VoiceDesign requests (fp32 and bf16 loads)
        run.<k>.frames       greedy frames (`do_sample=False`, max_new_tokens=RUN_FRAMES+1)
        run.<k>.wav          the official waveform of that run (in-context: reference part cut off)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE / "stubs"))
    sys.path.insert(0, str(HERE))

import make_reference as mr  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

with contextlib.redirect_stdout(sys.stderr):
    from qwen_tts import Qwen3TTSModel  # noqa: E402
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model  # noqa: E402
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration  # noqa: E402
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram  # noqa: E402

SEED = mr.SEED + 500
RUN_FRAMES = 24
TINY_SPEAKER_ENCODER = {
    "mel_dim": 128,
    "enc_dim": 64,  # = talker hidden: the x-vector is a codec-embedding row
    "enc_channels": [16, 16, 16, 16, 48],
    "enc_kernel_sizes": [5, 3, 3, 3, 1],
    "enc_dilations": [1, 2, 3, 4, 1],
    "enc_attention_channels": 8,
    "enc_res2net_scale": 4,
    "enc_se_channels": 8,
    "sample_rate": 24000,
}
# The tiny Mimi encoder: every structural feature of the released one (SEANet ratios 8,6,5,4 + x2
# downsample to 12.5 Hz, causal convs, 2-layer transformer, split RVQ with input/output projections),
# the released 250-frame sliding window, and 16 quantizers.
BASE_ENCODER = mr.TINY_ENCODER | {"num_filters": 4, "num_hidden_layers": 2, "sliding_window": 250}
AUDIOS = {  # name -> (sample rate, seconds)
    "a24k": (24000, 2.3),
    "a16k": (16000, 1.9),
    "a44k": (44100, 1.1),
    "long24k": (24000, 11.0),  # > 250 encoder-transformer frames (25 Hz): exposes a sliding window
}
REF_TEXT = "Reference words, spoken: naïve café."
TEXT = "Hello iPhone world, it's 2024!"
LONG_TEXT = "Hello iPhone world, it's 2024! This sentence is much longer than the reference audio."
INSTRUCT = "A warm, low female voice; speaks slowly."


def base_config() -> dict:
    cfg = json.loads(json.dumps(mr.TINY_CONFIGS["1b7"]))
    cfg["tts_model_type"] = "base"
    cfg["talker_config"]["spk_id"] = {}
    cfg["talker_config"]["spk_is_dialect"] = {}
    cfg["speaker_encoder_config"] = dict(TINY_SPEAKER_ENCODER)
    return cfg


def design_config() -> dict:
    cfg = json.loads(json.dumps(mr.TINY_CONFIGS["1b7"]))
    cfg["tts_model_type"] = "voice_design"
    cfg["talker_config"]["spk_id"] = {}
    cfg["talker_config"]["spk_is_dialect"] = {}
    return cfg


def randomize_codebooks(codec: torch.nn.Module, seed: int) -> None:
    """The Mimi codebooks are buffers (embed_sum, cluster_usage), which `mr.randomize` leaves at 0 / 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, buf in sorted(codec.named_buffers(), key=lambda item: item[0]):
            if not name.startswith("encoder.quantizer."):
                continue
            if name.endswith("cluster_usage"):
                buf.copy_(0.5 + torch.rand(buf.shape, generator=g))
            elif name.endswith("embed_sum"):
                usage = dict(codec.named_buffers())[name.replace("embed_sum", "cluster_usage")]
                buf.copy_(0.5 * torch.randn(buf.shape, generator=g) * usage[:, None])


def build_voice_checkpoint(out: Path, config: dict, seed: int) -> None:
    torch.manual_seed(seed)
    model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**config))
    mr.randomize(model, seed)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    published = config | {"transformers_version": "4.57.3", "torch_dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(published, indent=2))
    (out / "generation_config.json").write_text(json.dumps(mr.GENERATION_CONFIG, indent=2))
    mr.synthetic_tokenizer.write_tokenizer(out)

    codec_config = Qwen3TTSTokenizerV2Config(**mr.speech_tokenizer_config(mr.TINY_DECODER, BASE_ENCODER))
    codec = Qwen3TTSTokenizerV2Model(codec_config)
    mr.randomize(codec, seed + 1)
    randomize_codebooks(codec, seed + 2)
    with torch.no_grad():
        codec.decoder.decoder[-1].conv.weight.mul_(1 / 64)  # keep the waveform mostly inside the clamp
    st = out / "speech_tokenizer"
    codec.save_pretrained(st, safe_serialization=True)
    (st / "config.json").write_text(
        json.dumps(mr.speech_tokenizer_config(mr.TINY_DECODER, BASE_ENCODER), indent=2)
    )
    mr.write_preprocessor_config(st)


def synthetic_audio(rate: int, seconds: float, seed: int) -> np.ndarray:
    """A voiced, speech-like float32 signal in [-1, 1]: harmonics with vibrato, syllable envelope, noise."""
    g = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    f0 = 120 + 30 * np.sin(2 * math.pi * 0.7 * t) + 10 * np.sin(2 * math.pi * 5.1 * t)
    phase = 2 * math.pi * np.cumsum(f0) / rate
    voice = sum(np.sin(k * phase + g.uniform(0, 6)) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * np.sin(2 * math.pi * 3.3 * t) ** 2
    x = 0.25 * envelope * voice + 0.02 * g.standard_normal(t.shape)
    return np.clip(x, -1, 1).astype(np.float32)


class _Captured(Exception):
    pass


def capture_prefill(tts: Qwen3TTSModel, call) -> dict:
    record: dict = {}

    def capture(**kwargs):
        record["rows"] = kwargs["inputs_embeds"][0].detach().float().clone()
        record["trailing"] = kwargs["trailing_text_hidden"][0].detach().float().clone()
        raise _Captured

    tts.model.talker.generate = capture
    try:
        call()
    except _Captured:
        pass
    finally:
        del tts.model.talker.generate
    return record


def greedy(tts: Qwen3TTSModel, call) -> tuple[torch.Tensor, np.ndarray]:
    box: dict = {}
    inner = tts.model.generate

    def keep(**kwargs):
        box["codes"] = inner(**kwargs)[0]
        return box["codes"], None

    tts.model.generate = keep
    try:
        wavs, sr = call(do_sample=False, subtalker_dosample=False, max_new_tokens=RUN_FRAMES + 1)
    finally:
        del tts.model.generate
    assert sr == 24000
    return box["codes"][0].clone(), wavs[0]


def voices_reference(out: Path) -> None:
    build_voice_checkpoint(out / "ckpt-base", base_config(), SEED)
    build_voice_checkpoint(out / "ckpt-design", design_config(), SEED + 50)
    tensors: dict[str, torch.Tensor] = {}
    meta: dict = {"audios": {}, "prefill": [], "runs": [], "run_frames": RUN_FRAMES}

    base = {
        dt: mr.load_official(out / "ckpt-base", dtype)
        for dt, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
    }
    tts = base["fp32"]
    items = {}
    for k, (name, (rate, seconds)) in enumerate(AUDIOS.items()):
        pcm = synthetic_audio(rate, seconds, SEED + k)
        (item,) = tts.create_voice_clone_prompt(ref_audio=(pcm, rate), ref_text=REF_TEXT)
        items[name] = item
        tensors[f"audio.{name}"] = torch.from_numpy(pcm.copy())
        tensors[f"{name}.spk"] = item.ref_spk_embedding.float().contiguous()
        tensors[f"{name}.codes"] = item.ref_code.to(torch.int64).contiguous()
        wav24 = pcm if rate == 24000 else mr_resample(pcm, rate)
        mel = mel_spectrogram(torch.from_numpy(wav24)[None], n_fft=1024, num_mels=128, sampling_rate=24000,
                              hop_size=256, win_size=1024, fmin=0, fmax=12000)  # fmt: skip
        tensors[f"{name}.mel"] = mel[0].T.contiguous()
        tensors[f"{name}.pcm24k"] = torch.from_numpy(wav24.copy())
        meta["audios"][name] = {"rate": rate, "samples": int(pcm.shape[0])}

    # ---- prompt rows: x-vector and in-context (Base), instruction (VoiceDesign)
    variants = []
    for mode in ("xvector", "icl"):
        for language in ("english", "auto", "Chinese"):
            for streaming in (True, False):
                # in-context: a text longer than the reference codes (text left for the trailing queue)
                # and one shorter than them (the text track padded with tts_pad)
                pairs = ((LONG_TEXT, "a24k"), (TEXT, "long24k")) if mode == "icl" else ((TEXT, "a24k"),)
                for text, audio in pairs:
                    variants.append({"model": "base", "mode": mode, "language": language,
                                     "streaming": streaming, "text": text, "audio": audio})  # fmt: skip
    for language in ("english", "auto"):
        for streaming in (True, False):
            for instruct in (INSTRUCT, ""):
                variants.append({"model": "design", "mode": "design", "language": language,
                                 "streaming": streaming, "text": TEXT, "instruct": instruct})  # fmt: skip
    design = {
        dt: mr.load_official(out / "ckpt-design", dtype)
        for dt, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
    }
    for k, v in enumerate(variants):
        for dt in ("fp32", "bf16"):
            if v["model"] == "base":
                model = base[dt]
                item = items[v["audio"]]
                prompt = [type(item)(ref_code=None if v["mode"] == "xvector" else item.ref_code,
                                     ref_spk_embedding=item.ref_spk_embedding,
                                     x_vector_only_mode=v["mode"] == "xvector", icl_mode=v["mode"] == "icl",
                                     ref_text=REF_TEXT)]  # fmt: skip

                def call(model=model, prompt=prompt, v=v):
                    model.generate_voice_clone(text=v["text"], language=v["language"],
                                               voice_clone_prompt=prompt, non_streaming_mode=not v["streaming"])  # fmt: skip
            else:
                model = design[dt]

                def call(model=model, v=v):
                    model.generate_voice_design(text=v["text"], instruct=v["instruct"], language=v["language"],
                                                non_streaming_mode=not v["streaming"])  # fmt: skip

            rec = capture_prefill(model, call)
            tensors[f"prefill.{k}.{dt}.rows"] = rec["rows"].contiguous()
            tensors[f"prefill.{k}.{dt}.trailing"] = rec["trailing"].contiguous()
        v["prefill_len"] = int(rec["rows"].shape[0])
        v["text_ids"] = tts._tokenize_texts([tts._build_assistant_text(v["text"])])[0][0, 3:-5].tolist()
        v["ref_ids"] = tts._tokenize_texts([tts._build_ref_text(REF_TEXT)])[0][0, 3:-2].tolist()
        if v.get("instruct"):
            v["instruct_ids"] = tts._tokenize_texts([tts._build_instruct_text(v["instruct"])])[0][0].tolist()
        meta["prefill"].append(v)

    # ---- greedy runs (fp32)
    runs = [("xvector", True, "english"), ("xvector", False, "auto"), ("icl", True, "english")]
    for mode, streaming, language in runs:
        item = items["a24k"]
        prompt = [type(item)(ref_code=None if mode == "xvector" else item.ref_code,
                             ref_spk_embedding=item.ref_spk_embedding, x_vector_only_mode=mode == "xvector",
                             icl_mode=mode == "icl", ref_text=REF_TEXT)]  # fmt: skip
        name = f"{mode}.{'streaming' if streaming else 'non_streaming'}"
        frames, wav = greedy(tts, lambda prompt=prompt, streaming=streaming, language=language, **kw: (
            tts.generate_voice_clone(text=TEXT, language=language, voice_clone_prompt=prompt,
                                     non_streaming_mode=not streaming, **kw)))  # fmt: skip
        if frames.shape[0] < 8:
            raise RuntimeError(f"greedy {name} ended after {frames.shape[0]} frames (EOS); change SEED")
        tensors[f"run.{name}.frames"] = frames.to(torch.int64).contiguous()
        tensors[f"run.{name}.wav"] = torch.from_numpy(np.ascontiguousarray(wav)).float()
        meta["runs"].append({"name": name, "mode": mode, "streaming": streaming, "language": language,
                             "text": TEXT, "audio": "a24k", "frames": int(frames.shape[0])})  # fmt: skip
    meta["ref_text"] = REF_TEXT
    meta["tables"] = full_size_tables()
    save_file(tensors, str(out / "voices.safetensors"))
    (out / "voices.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1))


def full_size_tables() -> dict[str, dict[str, list[int]]]:
    """name -> shape tables of the official full-size Base (1.7B, 0.6B) and VoiceDesign (1.7B) models,
    built on the meta device from the CustomVoice configs with the published Base / VoiceDesign changes
    (`tts_model_type`; Base: `speaker_encoder_config` with enc_dim = talker width, defaults otherwise)."""
    tables = {}
    for name, size, model_type in (("1.7b-base", "1.7b", "base"), ("0.6b-base", "0.6b", "base"),
                                   ("1.7b-voice-design", "1.7b", "voice_design")):  # fmt: skip
        cfg = json.loads(json.dumps(mr.FULL_CONFIGS[size]))
        cfg["tts_model_type"] = model_type
        cfg["talker_config"]["spk_id"], cfg["talker_config"]["spk_is_dialect"] = {}, {}
        if model_type == "base":
            cfg["speaker_encoder_config"] = {
                "enc_dim": cfg["talker_config"]["hidden_size"],
                "sample_rate": 24000,
            }
        with torch.device("meta"):
            model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**cfg))
        tables[name] = {k: list(v.shape) for k, v in model.state_dict().items()}
    return tables


def mr_resample(pcm: np.ndarray, rate: int) -> np.ndarray:
    import librosa

    return librosa.resample(y=pcm.astype(np.float32), orig_sr=rate, target_sr=24000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    voices_reference(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
