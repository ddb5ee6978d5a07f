"""Build tiny official checkpoints and dump reference data computed by the OFFICIAL qwen-tts code.

One promise: `python make_reference.py --out DIR` (run inside `.oracle-venv`, see setup.sh) leaves in DIR
everything tests/parity compares against, all produced by the official classes of `qwen-tts` 0.1.1 with
transformers 4.57.3, never by our code:

    DIR/ckpt-1b7/            tiny 1.7B-style checkpoint (small_to_mtp_projection present), official layout:
        config.json generation_config.json model.safetensors (bf16) vocab.json merges.txt
        tokenizer_config.json speech_tokenizer/{config.json, model.safetensors (fp32, encoder.* too),
        preprocessor_config.json}
    DIR/ckpt-0b6/            tiny 0.6B-style checkpoint (talker width == code-predictor width: identity)
    DIR/tokenization.json    official processor ids of tricky texts; pre-tokenizer rule variants
    DIR/prefill-<size>.json + .safetensors
                             prefill rows [L,H] and trailing text embeddings [n,H] (fp32 and bf16 loads)
                             for every speaker x language form x instruct x layout
    DIR/runs.json + runs.safetensors
                             32-frame greedy runs (frames [32,16], 33rd codebook-0 token) and, along the
                             same history, the official processed probabilities of a sampling run
                             (talker [33,3072] before each codebook-0 draw, code predictor [32,15,2048])
    DIR/codec.json + codec.safetensors
                             random codes [1,16,T] and fp32 waveforms: official decode (300/25 chunking)
                             and one full decoder forward
    DIR/tables.json          name -> shape tables of the official 1.7B / 0.6B models and speech tokenizer
                             built on the meta device from the published configs
    DIR/ckpt-base/, DIR/ckpt-design/, DIR/voices.json + .safetensors
                             voice cloning (Base) and VoiceDesign references: see voices.py

How the processed probabilities are captured: the official `generate` is run with sampling on, and
`torch.multinomial` is replaced for the duration by a recorder that stores the `probs` it is given (the
output of HF's logits processors + softmax, exactly what the official sampler draws from) and returns the
token of the greedy run, so the history is fixed and every number comes from the official modules.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "stubs"))  # torchaudio / sox / onnxruntime import stubs (never installed)
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

with contextlib.redirect_stdout(sys.stderr):  # qwen_tts prints a flash-attn banner on import
    from qwen_tts import Qwen3TTSModel  # noqa: E402
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model  # noqa: E402
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration  # noqa: E402
import synthetic_tokenizer  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

SEED = 20240611
RUN_FRAMES = 32

SPEAKERS = {
    "aiden": 2861,
    "sohee": 2864,
    "ono_anna": 2873,
    "eric": 2875,
    "dylan": 2878,
    "uncle_fu": 3010,
    "ryan": 3061,
    "vivian": 3065,
    "serena": 3066,
}
DIALECTS = {name: False for name in SPEAKERS} | {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
LANGUAGES = {
    "english": 2050,
    "german": 2053,
    "spanish": 2054,
    "chinese": 2055,
    "japanese": 2058,
    "french": 2061,
    "sichuan_dialect": 2062,
    "korean": 2064,
    "russian": 2069,
    "italian": 2070,
    "portuguese": 2071,
    "beijing_dialect": 2074,
}
CODEC_IDS = {
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
}
TOP_LEVEL_IDS = {
    "im_start_token_id": 151644,
    "im_end_token_id": 151645,
    "assistant_token_id": 77091,
    "tts_pad_token_id": 151671,
    "tts_bos_token_id": 151672,
    "tts_eos_token_id": 151673,
}
GENERATION_CONFIG = {
    "do_sample": True,
    "temperature": 0.9,
    "top_k": 50,
    "top_p": 1.0,
    "repetition_penalty": 1.05,
    "subtalker_dosample": True,
    "subtalker_temperature": 0.9,
    "subtalker_top_k": 50,
    "subtalker_top_p": 1.0,
    "max_new_tokens": 8192,
}
TRICKY_TEXTS = [
    "Hello, world!",
    "Hello iPhone world, it's 2024!",
    "camelCase getHTTPResponse XMLHttpRequest iPad MacBook",
    "naïve café résumé Zürich Größe Übermaß",
    "cafe\u0301 decomposed, q\u0301 x\u0308 n\u0303o\u0300 (combining marks)",
    "नमस्ते दुनिया हिन्दी",
    "In 2024, 3.14159 and 1,000,000 people... wait?! (yes) — “quoted” 'single'",
    "don't we'll they're I'm you've it's",
    "你好，世界。今天天气很好！",
    "こんにちは、世界。カタカナ",
    "안녕하세요 세계",
    "Привет, мир!",
    "مرحبا بالعالم",
    "I ❤️ emoji 😀👍🏽 🎉 flags 🇺🇸",
    "tabs\tand  double  spaces",
    "line one\nline two\n",
    "trailing spaces   ",
    "x²+y²=z² ½ № ™",
    "ALLCAPS MixedCASEWord lowercase",
]
INSTRUCTS = [
    "Speak slowly, with a warm and calm voice.",
    "用开心的语气说。",
    "Whisper like a secret: iPhone!",
]
PREFILL_TEXTS = ["Hello iPhone world, it's 2024!", "你好，世界。naïve café 😀"]
USER_LANGUAGES = [
    "english",
    "german",
    "spanish",
    "chinese",
    "japanese",
    "french",
    "korean",
    "russian",
    "italian",
    "portuguese",
]
RUNS = [  # (checkpoint, speaker, language, instruct, streaming)
    ("1b7", "ryan", "english", "", True),
    ("1b7", "vivian", "chinese", INSTRUCTS[0], False),
    ("0b6", "eric", "auto", "", True),
    ("0b6", "aiden", "english", "", False),
]
RUN_TEXT = "Hello iPhone world, it's 2024! naïve café."
CODEC_LENGTHS = [1, 7, 80, 310]


# ------------------------------------------------------------------ configs


def talker_config(
    *,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    text_hidden: int,
    cp_hidden: int,
    cp_layers: int,
    cp_intermediate: int,
) -> dict:
    half = head_dim // 2
    mrope = [half - 2 * (half * 5 // 16), half * 5 // 16, half * 5 // 16]  # [24,20,20] for head_dim 128
    return {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": intermediate,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": {"rope_type": "default", "mrope_section": mrope, "interleaved": True},
        "max_position_embeddings": 32768,
        "vocab_size": 3072,
        "text_vocab_size": 151936,
        "text_hidden_size": text_hidden,
        "num_code_groups": 16,
        "attention_bias": False,
        "position_id_per_seconds": 13,
        "initializer_range": 0.02,
        "spk_id": dict(SPEAKERS),
        "spk_is_dialect": dict(DIALECTS),
        "codec_language_id": dict(LANGUAGES),
        **CODEC_IDS,
        "code_predictor_config": {
            "hidden_size": cp_hidden,
            "num_hidden_layers": cp_layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "intermediate_size": cp_intermediate,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000,
            "vocab_size": 2048,
            "num_code_groups": 16,
            "max_position_embeddings": 65536,
            "attention_bias": False,
            "layer_types": ["full_attention"] * cp_layers,
        },
    }


def model_config(size: str, talker: dict) -> dict:
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": size,
        "tts_model_type": "custom_voice",
        **TOP_LEVEL_IDS,
        "talker_config": talker,
    }


FULL_CONFIGS = {
    "1.7b": model_config(
        "1b7",
        talker_config(
            hidden=2048,
            layers=28,
            heads=16,
            kv_heads=8,
            head_dim=128,
            intermediate=6144,
            text_hidden=2048,
            cp_hidden=1024,
            cp_layers=5,
            cp_intermediate=3072,
        ),
    ),
    "0.6b": model_config(
        "0b6",
        talker_config(
            hidden=1024,
            layers=28,
            heads=16,
            kv_heads=8,
            head_dim=128,
            intermediate=3072,
            text_hidden=2048,
            cp_hidden=1024,
            cp_layers=5,
            cp_intermediate=3072,
        ),
    ),
}
TINY_CONFIGS = {
    "1b7": model_config(
        "1b7",
        talker_config(
            hidden=64,
            layers=2,
            heads=4,
            kv_heads=2,
            head_dim=16,
            intermediate=128,
            text_hidden=48,
            cp_hidden=32,
            cp_layers=2,
            cp_intermediate=64,
        ),
    ),
    "0b6": model_config(
        "0b6",
        talker_config(
            hidden=32,
            layers=2,
            heads=4,
            kv_heads=2,
            head_dim=16,
            intermediate=64,
            text_hidden=48,
            cp_hidden=32,
            cp_layers=2,
            cp_intermediate=64,
        ),
    ),
}
FULL_DECODER = {
    "codebook_size": 2048,
    "codebook_dim": 512,
    "latent_dim": 1024,
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 64,
    "intermediate_size": 1024,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000,
    "max_position_embeddings": 8000,
    "sliding_window": 72,
    "layer_scale_initial_scale": 0.01,
    "num_quantizers": 16,
    "num_semantic_quantizers": 1,
    "upsampling_ratios": [2, 2],
    "upsample_rates": [8, 5, 4, 3],
    "decoder_dim": 1536,
    "attention_bias": False,
    "semantic_codebook_size": 4096,
    "vector_quantization_hidden_dimension": 512,
    "attention_dropout": 0.0,
}
FULL_ENCODER = {  # 3rd-party values (reference 2.4); encoder tensors are exempt from the comparison anyway
    "hidden_size": 512,
    "num_filters": 64,
    "upsampling_ratios": [8, 6, 5, 4],
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "codebook_size": 2048,
    "codebook_dim": 256,
    "num_quantizers": 32,
    "num_semantic_quantizers": 1,
    "sliding_window": 250,
    "frame_rate": 12.5,
}
TINY_DECODER = FULL_DECODER | {
    "codebook_dim": 16,
    "latent_dim": 32,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 32,
    "decoder_dim": 32,
    "vector_quantization_hidden_dimension": 16,
}
TINY_ENCODER = {
    "hidden_size": 16,
    "num_filters": 2,
    "upsampling_ratios": [8, 6, 5, 4],
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 32,
    "codebook_size": 2048,
    "codebook_dim": 8,
    "vector_quantization_hidden_dimension": 8,
    "num_quantizers": 16,
    "num_semantic_quantizers": 1,
    "upsample_groups": 16,
    "frame_rate": 12.5,
}


def write_preprocessor_config(speech_tokenizer_dir: Path) -> None:
    """The released speech tokenizer's preprocessor_config.json (24 kHz Encodec feature extractor)."""
    (speech_tokenizer_dir / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "chunk_length_s": None,
                "feature_extractor_type": "EncodecFeatureExtractor",
                "feature_size": 1,
                "overlap": None,
                "padding_side": "right",
                "padding_value": 0.0,
                "return_attention_mask": True,
                "sampling_rate": 24000,
            },
            indent=2,
        )
    )


def speech_tokenizer_config(decoder: dict, encoder: dict) -> dict:
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
        "decoder_config": decoder,
        "encoder_config": encoder,
    }


# ------------------------------------------------------------------ checkpoint building


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Non-trivial seeded values for every parameter (norm weights and scales included, nothing left at 0/1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters(), key=lambda item: item[0]):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("cluster_usage"):
                value = 0.5 + torch.rand(p.shape, generator=g)  # EMA counts: positive
            elif name.endswith("embedding_sum"):
                value = noise  # rescaled by cluster_usage below
            elif p.ndim == 1 and leaf == "bias":
                value = 0.05 * noise
            elif p.ndim == 1 and leaf in ("alpha", "beta"):
                value = 0.2 * noise  # SnakeBeta log-parameters
            elif p.ndim == 1 and leaf in ("scale", "gamma"):
                value = 0.1 + 0.05 * noise  # LayerScale / ConvNeXt gamma: make the branches matter
            elif p.ndim == 1:
                value = 1.0 + 0.2 * noise  # RMSNorm / LayerNorm weights
            elif "embedding" in name or "embed" in leaf:
                value = noise
            else:
                fan_in = p.shape[1] * (p[0, 0].numel() if p.ndim > 2 else 1)
                if (
                    p.ndim == 3 and "upsample" not in name and ".block.1." in name
                ):  # transposed conv [in,out,k]
                    fan_in = p.shape[0] * p.shape[2] // max(1, p.shape[2] // 2)
                value = noise / math.sqrt(fan_in)
            p.copy_(value.to(p.dtype))
        for name, p in module.named_parameters():
            if name.endswith("embedding_sum"):
                usage = dict(module.named_parameters())[name.replace("embedding_sum", "cluster_usage")]
                p.mul_(usage[:, None])


def build_checkpoint(out: Path, size: str, seed: int) -> None:
    config = Qwen3TTSConfig(**TINY_CONFIGS[size])
    torch.manual_seed(seed)
    model = Qwen3TTSForConditionalGeneration(config)
    randomize(model, seed)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    # save_pretrained's config.json cannot be read back by the official config class (its sub-config dicts
    # gain keys the speaker-encoder config rejects); write the published layout instead.
    published = TINY_CONFIGS[size] | {"transformers_version": "4.57.3", "torch_dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(published, indent=2))
    (out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2))
    synthetic_tokenizer.write_tokenizer(out)

    codec_config = Qwen3TTSTokenizerV2Config(**speech_tokenizer_config(TINY_DECODER, TINY_ENCODER))
    codec = Qwen3TTSTokenizerV2Model(codec_config)
    randomize(codec, seed + 1)
    with torch.no_grad():  # keep the waveform mostly inside the [-1, 1] clamp so comparisons are informative
        codes = torch.randint(0, 2048, (1, 16, 24), generator=torch.Generator().manual_seed(seed))
        codec.decoder.decoder[-1].conv.bias.mul_(0.1)
        for _ in range(60):  # halve the last conv until almost nothing clips (output is linear in it)
            if float((codec.decoder(codes).abs() >= 1).float().mean()) < 0.002:
                break
            codec.decoder.decoder[-1].conv.weight.mul_(0.5)
    st = out / "speech_tokenizer"
    codec.save_pretrained(st, safe_serialization=True)
    write_preprocessor_config(st)


def load_official(ckpt: Path, dtype: torch.dtype) -> Qwen3TTSModel:
    with contextlib.redirect_stdout(sys.stderr):
        return Qwen3TTSModel.from_pretrained(str(ckpt), dtype=dtype)


# ------------------------------------------------------------------ tokenization


def tokenization_reference(ckpt: Path, work: Path) -> dict:
    tts = load_official(ckpt, torch.float32)
    processor_ids = lambda s: tts.processor(text=s)["input_ids"][0]  # noqa: E731
    out: dict = {
        "texts": TRICKY_TEXTS,
        "plain": [processor_ids(t) for t in TRICKY_TEXTS],
        "target_wrapped": [processor_ids(tts._build_assistant_text(t)) for t in TRICKY_TEXTS],
        "instructs": INSTRUCTS,
        "instruct_wrapped": [processor_ids(tts._build_instruct_text(t)) for t in INSTRUCTS],
        "processor_pre_tokenizer": type(tts.processor.tokenizer.backend_tokenizer.pre_tokenizer[0]).__name__,
        "rule_variants": {},
    }
    # The local-directory regex rule: same tokenizer files next to config.json variants.
    variants = {
        "v4.57.3": "4.57.3",
        "v4.57.1": "4.57.1",
        "v5.0.0": "5.0.0",
        "no_config": None,
        "no_version": "",
    }
    for name, version in variants.items():
        d = work / f"tok-{name}"
        d.mkdir(parents=True)
        for f in ("vocab.json", "merges.txt", "tokenizer_config.json"):
            shutil.copy(ckpt / f, d / f)
        if version is not None:
            cfg = {"model_type": "qwen3_tts"} | ({"transformers_version": version} if version else {})
            (d / "config.json").write_text(json.dumps(cfg))
        tok = AutoTokenizer.from_pretrained(str(d), fix_mistral_regex=True)
        out["rule_variants"][name] = {
            "config": None
            if version is None
            else ({"model_type": "qwen3_tts"} | ({"transformers_version": version} if version else {})),
            "ids": [tok(t)["input_ids"] for t in TRICKY_TEXTS],
        }
    stock = AutoTokenizer.from_pretrained(str(ckpt))  # no fix flag: the stock Qwen2 regex (hub-id behaviour)
    out["stock_regex_ids"] = [stock(t)["input_ids"] for t in TRICKY_TEXTS]
    return out


# ------------------------------------------------------------------ prefill


class _Captured(Exception):
    pass


def prefill_variants() -> list[dict]:
    variants = []
    for i, speaker in enumerate(SPEAKERS):
        explicit = USER_LANGUAGES[i % len(USER_LANGUAGES)]
        if DIALECTS[speaker] and explicit == "chinese":
            explicit = "english"
        forms = [explicit, "auto"] + (["chinese"] if DIALECTS[speaker] else [])
        for j, language in enumerate(forms):
            for instruct in ("", INSTRUCTS[(i + j) % len(INSTRUCTS)]):
                for streaming in (True, False):
                    k = len(variants)
                    variants.append(
                        {
                            "speaker": speaker.title() if k % 2 else speaker,  # names are case-insensitive
                            "language": language.upper() if k % 3 == 0 else language,
                            "instruct": instruct,
                            "streaming": streaming,
                            "text": PREFILL_TEXTS[k % 2],
                        }
                    )
    return variants


def capture_prefill(tts: Qwen3TTSModel, v: dict) -> dict:
    record: dict = {}
    inner_generate = tts.model.generate

    def recording_generate(**kwargs):
        record["input_ids"] = kwargs["input_ids"][0][0].tolist()
        instruct = kwargs["instruct_ids"][0]
        record["instruct_ids"] = [] if instruct is None else instruct[0].tolist()
        return inner_generate(**kwargs)

    def capture(**kwargs):
        record["rows"] = kwargs["inputs_embeds"][0].detach().clone()
        record["trailing"] = kwargs["trailing_text_hidden"][0].detach().clone()
        record["tts_pad"] = kwargs["tts_pad_embed"].reshape(-1).detach().clone()
        raise _Captured

    tts.model.generate = recording_generate
    tts.model.talker.generate = capture
    try:
        tts.generate_custom_voice(
            text=v["text"],
            speaker=v["speaker"],
            language=v["language"],
            instruct=v["instruct"] or None,
            non_streaming_mode=not v["streaming"],
        )
    except _Captured:
        pass
    finally:
        del tts.model.generate, tts.model.talker.generate
    return record


def prefill_reference(ckpt: Path, out: Path, size: str) -> None:
    variants = prefill_variants()
    tensors: dict[str, torch.Tensor] = {}
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        tts = load_official(ckpt, dtype)
        for k, v in enumerate(variants):
            rec = capture_prefill(tts, v)
            tensors[f"{k}.{dtype_name}.rows"] = rec["rows"].float().contiguous()
            tensors[f"{k}.{dtype_name}.trailing"] = rec["trailing"].float().contiguous()
            v["input_ids"], v["instruct_ids"] = rec["input_ids"], rec["instruct_ids"]
            v["prefill_len"] = int(rec["rows"].shape[0])
    save_file(tensors, str(out / f"prefill-{size}.safetensors"))
    (out / f"prefill-{size}.json").write_text(json.dumps(variants, ensure_ascii=False, indent=1))


# ------------------------------------------------------------------ 32-frame runs


def run_greedy(tts: Qwen3TTSModel, run: dict) -> tuple[torch.Tensor, int]:
    box: dict = {}
    inner = tts.model.talker.generate

    def keep(**kwargs):
        box["result"] = inner(**kwargs)
        return box["result"]

    tts.model.talker.generate = keep
    try:
        codes_list, _ = tts.model.generate(
            **run["generate_kwargs"], do_sample=False, subtalker_dosample=False, max_new_tokens=RUN_FRAMES + 1
        )
    finally:
        del tts.model.talker.generate
    frames = codes_list[0]
    sequences = box["result"].sequences[0]
    if frames.shape != (RUN_FRAMES, 16) or sequences.shape[0] != RUN_FRAMES + 1:
        raise RuntimeError(f"greedy run ended early (EOS?): frames {tuple(frames.shape)}; change SEED")
    return frames.clone(), int(sequences[-1])


def run_forced_sampling(tts: Qwen3TTSModel, run: dict, frames: torch.Tensor, last: int):
    forced = [int(frames[0, 0])]
    for k in range(RUN_FRAMES):
        forced += [int(c) for c in frames[k, 1:]]
        forced.append(int(frames[k + 1, 0]) if k + 1 < RUN_FRAMES else last)
    talker_probs: list[torch.Tensor] = []
    cp_probs: list[torch.Tensor] = []
    feed = iter(forced)
    original = torch.multinomial

    def recorder(probs, num_samples, *args, **kwargs):
        (talker_probs if probs.shape[-1] == 3072 else cp_probs).append(probs[0].detach().float().clone())
        token = next(feed)
        return torch.full((probs.shape[0], num_samples), token, dtype=torch.long, device=probs.device)

    torch.multinomial = recorder
    try:
        codes_list, _ = tts.model.generate(
            **run["generate_kwargs"],
            do_sample=True,
            subtalker_dosample=True,
            temperature=0.9,
            top_k=50,
            top_p=1.0,
            subtalker_temperature=0.9,
            subtalker_top_k=50,
            subtalker_top_p=1.0,
            repetition_penalty=1.05,
            max_new_tokens=RUN_FRAMES + 1,
        )
    finally:
        torch.multinomial = original
    if not torch.equal(codes_list[0], frames):
        raise RuntimeError("forced sampling run did not reproduce the greedy history")
    if len(talker_probs) != RUN_FRAMES + 1 or len(cp_probs) != RUN_FRAMES * 15:
        raise RuntimeError(
            f"unexpected draw count: talker {len(talker_probs)}, code predictor {len(cp_probs)}"
        )
    return torch.stack(talker_probs), torch.stack(cp_probs).reshape(RUN_FRAMES, 15, -1)


def runs_reference(out: Path) -> None:
    tensors: dict[str, torch.Tensor] = {}
    meta = []
    loaded: dict[str, Qwen3TTSModel] = {}
    for size, speaker, language, instruct, streaming in RUNS:
        tts = loaded.get(size) or load_official(out / f"ckpt-{size}", torch.float32)
        loaded[size] = tts
        input_ids = tts._tokenize_texts([tts._build_assistant_text(RUN_TEXT)])
        instruct_ids = tts._tokenize_texts([tts._build_instruct_text(instruct)])[0] if instruct else None
        run = {
            "generate_kwargs": {
                "input_ids": input_ids,
                "instruct_ids": [instruct_ids],
                "languages": [language],
                "speakers": [speaker],
                "non_streaming_mode": not streaming,
            }
        }
        torch.manual_seed(SEED)
        frames, last = run_greedy(tts, run)
        talker, cp = run_forced_sampling(tts, run, frames, last)
        name = f"{size}.{'streaming' if streaming else 'non_streaming'}"
        tensors[f"{name}.frames"] = frames.to(torch.int64).contiguous()
        tensors[f"{name}.talker_probs"] = talker.contiguous()
        tensors[f"{name}.cp_probs"] = cp.contiguous()
        meta.append(
            {
                "name": name,
                "checkpoint": f"ckpt-{size}",
                "speaker": speaker,
                "language": language,
                "instruct": instruct,
                "streaming": streaming,
                "text": RUN_TEXT,
                "text_ids": input_ids[0][0, 3:-5].tolist(),
                "instruct_ids": [] if instruct_ids is None else instruct_ids[0].tolist(),
                "last_talker_token": last,
            }
        )
    save_file(tensors, str(out / "runs.safetensors"))
    (out / "runs.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1))


# ------------------------------------------------------------------ codec


def codec_reference(out: Path) -> None:
    tts = load_official(out / "ckpt-1b7", torch.float32)
    speech = tts.model.speech_tokenizer
    g = torch.Generator().manual_seed(SEED + 7)
    tensors: dict[str, torch.Tensor] = {}
    for length in CODEC_LENGTHS:
        codes = torch.randint(0, 2048, (1, 16, length), generator=g)
        wavs, sr = speech.decode([{"audio_codes": codes[0].T}])  # official path: 300/25 chunked decode
        assert sr == 24000
        with torch.no_grad():
            full = speech.model.decoder(codes)[:, 0]
        tensors[f"{length}.codes"] = codes.contiguous()
        tensors[f"{length}.official"] = torch.from_numpy(wavs[0]).float()[None].contiguous()
        tensors[f"{length}.full"] = full.float().contiguous()
    save_file(tensors, str(out / "codec.safetensors"))
    (out / "codec.json").write_text(json.dumps({"checkpoint": "ckpt-1b7", "lengths": CODEC_LENGTHS}))


# ------------------------------------------------------------------ tables


def tables_reference(out: Path) -> None:
    tables: dict[str, dict[str, list[int]]] = {}
    with torch.device("meta"):
        for name, cfg in FULL_CONFIGS.items():
            model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**cfg))
            tables[name] = {k: list(v.shape) for k, v in model.state_dict().items()}
        codec = Qwen3TTSTokenizerV2Model(
            Qwen3TTSTokenizerV2Config(**speech_tokenizer_config(FULL_DECODER, FULL_ENCODER))
        )
        tables["speech_tokenizer"] = {k: list(v.shape) for k, v in codec.state_dict().items()}
    tables["configs"] = {  # type: ignore[assignment]
        **FULL_CONFIGS,
        "speech_tokenizer": speech_tokenizer_config(FULL_DECODER, FULL_ENCODER),
    }
    (out / "tables.json").write_text(json.dumps(tables, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if (args.out / "manifest.json").is_file():
        print(args.out)
        return
    torch.set_num_threads(min(4, os.cpu_count() or 1))
    started = time.time()
    work = args.out.with_name(f"{args.out.name}.tmp-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    steps: dict[str, float] = {}

    def mark(step: str) -> None:
        steps[step] = round(time.time() - started, 1)
        print(f"make_reference: {step} done at {steps[step]} s", file=sys.stderr)

    for size, seed in (("1b7", SEED), ("0b6", SEED + 100)):
        build_checkpoint(work / f"ckpt-{size}", size, seed)
    mark("checkpoints")
    (work / "tokenization.json").write_text(
        json.dumps(tokenization_reference(work / "ckpt-1b7", work / "scratch"), ensure_ascii=False, indent=1)
    )
    shutil.rmtree(work / "scratch")
    mark("tokenization")
    for size in ("1b7", "0b6"):
        prefill_reference(work / f"ckpt-{size}", work, size)
    mark("prefill")
    runs_reference(work)
    mark("runs")
    codec_reference(work)
    mark("codec")
    tables_reference(work)
    mark("tables")
    import voices  # after the steps above: it imports this file as a module

    voices.voices_reference(work)
    mark("voices")
    import qwen_tts
    import transformers

    manifest = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "qwen_tts": getattr(qwen_tts, "__version__", "0.1.1"),
        "seed": SEED,
        "seconds": steps,
    }
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1))
    if args.out.exists():
        shutil.rmtree(args.out)
    work.rename(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
