"""THE GPU check: every fast path against its plain-PyTorch twin, then timings, the cost-model JSON, a table.

One run, one section per module: "talker/code predictor" here, "codec" from `loadtest.codec_check.run`
when that module exists. On the full-size model with random bf16 weights (never zeros):

1. kernels: each Triton kernel vs its twin (`engine.fast.kernels.selfcheck`);
2. twins: fast vs plain forward on identical inputs and caches. The talker (28 layers) against an fp32
   reference: the fused path's relative L2 error may be at most 1.1x the plain bf16 path's; the code
   predictor against its plain bf16 twin (relative L2 <= 2e-2); the graph sampler vs the plain sampler on
   identical logits and RNG counters (identical tokens);
3. timings: CUDA events around graph replays after warm-up, medians; talker decode at context 512 with
   mixed per-request lengths and repetition penalty on; code-predictor frame; talker prefill per bucket;
4. the cost table (`engine/scheduling/costs/h200_fast.json` format) and a table with each time's ratio to its floor
   (floor = bytes that must stream / 4255 GB/s measured copy bandwidth, h200-floors.md).

    python -m loadtest.gpu_check --out /tmp/gpu_check.json [--costs engine/scheduling/costs/h200_fast.json]
    python -m loadtest.gpu_check --skip-codec --variant wide64+talker_wide64   # a tools/frame_variants.py variant

Needs only torch (and Triton) on the GPU machine: no gateway packages. The JSON's commit is `$VIVACE_GIT_SHA`
when set (a copied tree whose `.git` is stale), else git's HEAD, "+dirty" when tracked files differ from it.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import json
import math
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from engine.fast.measure import cuda_median_ms, relative_l2
from engine.scheduling.costmodel import COSTS_DIR, fast_costs_for, gpu_family
from engine.settings import KernelOptions, add_kernel_arguments
from loadtest.revision import source_revision

COPY_BANDWIDTH = 4255e9  # B/s, measured device-to-device copy on the H200 (h200-floors.md)
BATCHES = (1, 4, 16, 32, 64, 128)
BF16_TOLERANCE = 2e-2
FP32_ERROR_RATIO = 1.1  # fused talker error vs fp32 <= this x the plain bf16 path's error vs fp32 (issue 13)
DEVICE = "cuda"  # a CPU dry run (--dry-run) swaps these for the tiny fp32 model
DTYPE = torch.bfloat16


def nbytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


# ---------------------------------------------------------------- setup


def kernel_options(args: argparse.Namespace) -> KernelOptions:
    """The fast paths' kernel options this run checks (each flag named as the engine's)."""
    return KernelOptions(**{field.name: getattr(args, field.name) for field in dataclasses.fields(KernelOptions)})


def build(args: argparse.Namespace) -> dict[str, Any]:
    from engine.executors.code_predictor import CodePredictorExecutor
    from engine.executors.slots import GenerationSlots, new_code_buffer
    from engine.executors.talker import TalkerExecutor
    from engine.fast.code_predictor_graph import CodePredictorGraphs, FrameKernels
    from engine.fast.talker_graph import TalkerGraphs, chain_options
    from engine.model.weights import load_model

    model = load_model(args.preset, device=DEVICE, dtype=DTYPE)
    c = model.config.talker
    slots_n = max(BATCHES)
    slots = GenerationSlots(slots_n, c.hidden_size, c.vocab_size, device=model.device, dtype=model.dtype)
    cache = model.talker.new_cache(slots_n, args.context + 8)
    codes = new_code_buffer(slots_n, 64, model.device)
    t0 = time.perf_counter()
    options = kernel_options(args)
    kernels = FrameKernels.from_options(options)
    talker_rows, fused_rope, fused_draw = options.talker_gemv_rows, options.talker_fused_rope, options.talker_fused_draw
    chain_rows, chain_tiles = chain_options(options.talker_chain)
    attention: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if args.variant:  # a frame_profile variant instead of the kernel flags (tools/frame_variants.py)
        from tools import frame_variants

        kernels = frame_variants.frame_kernels(args.variant)
        talker_rows, fused_rope, chain_rows, tiles = frame_variants.talker_options(args.variant)
        fused_draw = frame_variants.fused_draw(args.variant)
        chain_tiles = frame_variants.graph_tiles(tiles)
        attention = frame_variants.attention_config(frame_variants.talker_attention(args.variant))
    if kernels.fused and DEVICE == "cuda":  # the frame's Triton kernels compile in parallel children, not serially
        from engine.fast.precompile import default_workers, precompile_frames
        from engine.fast.sampling import DEFAULT_TOP_K_CAP

        precompile_frames(model.config.talker, model.config.code_predictor, DTYPE, BATCHES, kernels,
                          DEFAULT_TOP_K_CAP, default_workers())  # fmt: skip
    fast_talker = TalkerGraphs(model, slots, cache, BATCHES, prefill_sizes=(1, 4), prefill_buckets=(32, 64, 128, 256),
                               gemv_max_rows=talker_rows, fused_rope=fused_rope, chain_rows=chain_rows,
                               chain_tiles=chain_tiles, fused_draw=fused_draw)  # fmt: skip
    # The code-predictor path the engine serves with (--cp-kernels); tools/cp_kernels_check.py compares them.
    fast_cp = CodePredictorGraphs(model, slots, codes, BATCHES, kernels=kernels)
    with attention:  # (a variant's talker attention configuration applies while capturing)
        fast_talker.decode_steps.capture()
        fast_cp.capture()
        prefill_error = None
        try:
            fast_talker.prefill_steps.capture()
        except Exception:  # noqa: BLE001 - report it, keep measuring decode and the code predictor
            prefill_error = traceback.format_exc()
            fast_talker.prefill_steps.keys = ()
    capture_s = time.perf_counter() - t0
    plain_talker = TalkerExecutor(model, slots, cache)
    plain_cp = CodePredictorExecutor(model, slots, codes, max_batch=slots_n)
    return dict(model=model, slots=slots, cache=cache, codes=codes, fast_talker=fast_talker, fast_cp=fast_cp,
                plain_talker=plain_talker, plain_cp=plain_cp, capture_s=capture_s,
                prefill_error=prefill_error)  # fmt: skip


def snapshot(obj: Any) -> dict[str, Any]:
    """Clones of every tensor reachable through an object's attributes (GenerationSlots and its samplers)."""
    out: dict[str, Any] = {}
    for name, value in vars(obj).items():
        if isinstance(value, torch.Tensor):
            out[name] = value.clone()
        elif hasattr(value, "__dict__") and not isinstance(value, torch.device):
            out[name] = snapshot(value)
    return out


def restore(obj: Any, saved: dict[str, Any]) -> None:
    """Copy a snapshot back in place: captured graphs keep the tensors' addresses."""
    for name, value in saved.items():
        if isinstance(value, dict):
            restore(getattr(obj, name), value)
        else:
            getattr(obj, name).copy_(value)


def fill_state(env: dict[str, Any], lengths: list[int]) -> None:
    """Random per-slot state and KV contents at the given lengths (a prefill's worth, without running one)."""
    from engine.ipc.messages import Sampling

    model, slots, cache = env["model"], env["slots"], env["cache"]
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    for slot in range(len(lengths)):
        slots.start(slot, Sampling(greedy=slot % 4 == 3), seed=slot)
        cache.lengths[slot] = lengths[slot]
    cache.kv.normal_(generator=gen)
    slots.hidden.normal_(generator=gen)
    slots.frame_embed.normal_(generator=gen)
    slots.code0.random_(0, model.config.talker.num_codes, generator=gen)
    slots.seen.copy_(torch.rand(slots.seen.shape, device=DEVICE, generator=gen) < 0.05)  # penalty on


def load_talker_step(talker: Any, b: int, lengths: list[int]) -> None:
    """A captured talker decode step's inputs for timing: slots 0..b-1 at `lengths`, each fed text id 1000 and
    frame 2, EOS never drawn (every row keeps generating, so each replay does the same work)."""
    talker.inputs.load(b, kv_slot=list(range(b)), position=lengths, text_row=talker.text.rows_for([1000] * b),
                       frame=[2] * b, eos_never=[1] * b)  # fmt: skip


# ---------------------------------------------------------------- correctness


def fp32_reference(env: dict[str, Any]) -> dict[str, Any]:
    """The plain talker in fp32 on the same (bf16-valued) weights, with its own slots and cache: the reference
    both bf16 paths are measured against."""
    from engine.executors.slots import GenerationSlots
    from engine.executors.talker import TalkerExecutor

    model = env["model"]
    talker32 = copy.deepcopy(model.talker).float()
    c = model.config.talker
    slots = GenerationSlots(max(BATCHES), c.hidden_size, c.vocab_size, device=model.device, dtype=torch.float32)
    cache = talker32.new_cache(max(BATCHES), env["cache"].max_len)
    # What TalkerExecutor reads of a model: its talker and config (a shallow copy of the nn.Module would share
    # its submodule table, and replacing the talker there would replace the bf16 model's too).
    model32 = SimpleNamespace(talker=talker32, config=model.config)
    return dict(talker=talker32, slots=slots, cache=cache,
                executor=TalkerExecutor(model32, slots, cache))  # type: ignore[arg-type]


def load_reference(ref: dict[str, Any], saved: tuple[Any, ...]) -> None:
    """Give the fp32 reference the bf16 run's starting state (values converted by copy_)."""
    ref["cache"].kv.copy_(saved[0])
    restore(ref["slots"], saved[1])
    ref["cache"].lengths[:] = saved[2]


def error_ratio(fast: torch.Tensor, plain: torch.Tensor, reference: torch.Tensor) -> tuple[float, float, float]:
    """-> (fast's error, plain's error, their ratio), each relative L2 against the fp32 reference."""
    fast_error, plain_error = relative_l2(fast.float(), reference), relative_l2(plain.float(), reference)
    return fast_error, plain_error, fast_error / max(plain_error, 1e-12)


def check_twins(env: dict[str, Any]) -> dict[str, float | bool]:
    """Talker decode at 8 rows and at 1 row (keys ending in _b1), prefill, then the code predictor; every talker
    error also against the fp32 reference."""
    out: dict[str, float | bool] = {}
    ref = fp32_reference(env)
    for b, suffix in ((8, ""), (1, "_b1")):
        out.update({f"{key}{suffix}": value for key, value in check_decode(env, ref, b).items()})
    if env["prefill_error"] is None:
        out.update(check_prefill(env, ref))
    del ref
    return out | check_code_predictor(env, [100 + 37 * i for i in range(8)])


def check_decode(env: dict[str, Any], ref: dict[str, Any], b: int) -> dict[str, float]:
    """One talker decode step of b rows: fast graph, plain bf16 executor and the fp32 reference from identical
    caches and state."""
    model, slots, cache, fast_talker = env["model"], env["slots"], env["cache"], env["fast_talker"]
    out: dict[str, float] = {}
    lengths = [100 + 37 * i for i in range(b)]
    fill_state(env, lengths + [0] * (max(BATCHES) - b))
    rows = list(range(b))
    args = (rows, lengths, [3] * b, [1000 + i for i in rows], [False] * b)
    saved = (cache.kv.clone(), snapshot(slots), list(cache.lengths))
    fast_talker.decode(*args, read_tokens=False)
    fast_hidden, fast_kv = slots.hidden[:b].clone(), cache.kv[:, :, :b].clone()
    cache.kv.copy_(saved[0])
    restore(slots, saved[1])
    cache.lengths[:] = saved[2]
    env["plain_talker"].decode(*args, read_tokens=False)
    plain_hidden = slots.hidden[:b]
    out["talker_decode_hidden"] = relative_l2(fast_hidden, plain_hidden)
    out["talker_decode_logits"] = relative_l2(model.talker.logits(fast_hidden), model.talker.logits(plain_hidden))
    out["talker_decode_kv"] = relative_l2(fast_kv, cache.kv[:, :, :b])
    load_reference(ref, saved)
    ref["executor"].decode(*args, read_tokens=False)
    ref_hidden = ref["slots"].hidden[:b]
    (out["talker_decode_hidden_fast_vs_fp32"], out["talker_decode_hidden_plain_vs_fp32"],
     out["talker_decode_hidden_ratio"]) = error_ratio(fast_hidden, plain_hidden, ref_hidden)
    (out["talker_decode_logits_fast_vs_fp32"], out["talker_decode_logits_plain_vs_fp32"],
     out["talker_decode_logits_ratio"]) = error_ratio(
        ref["talker"].logits(fast_hidden.float()), ref["talker"].logits(plain_hidden.float()),
        ref["talker"].logits(ref_hidden))  # fmt: skip
    return out


def check_prefill(env: dict[str, Any], ref: dict[str, Any]) -> dict[str, float]:
    """Talker prefill: B=4, mixed prompt lengths in the 64 bucket; fast and plain bf16 against fp32."""
    from engine.ipc.messages import Sampling

    model, slots, fast_talker = env["model"], env["slots"], env["fast_talker"]
    out: dict[str, float] = {}
    rows = [0, 1, 2, 3]
    embeds = [torch.randn(n, model.config.talker.hidden_size, device=DEVICE, dtype=model.dtype) for n in (40, 64, 33, 51)]
    samplings, seeds = [Sampling()] * 4, [1, 2, 3, 4]
    fast_talker.prefill(rows[:4], embeds, samplings, seeds)
    fast_hidden, fast_code0 = slots.hidden[:4].clone(), slots.code0[:4].clone()
    env["plain_talker"].prefill(rows[:4], embeds, samplings, seeds)
    out["talker_prefill_hidden"] = relative_l2(fast_hidden, slots.hidden[:4])
    out["talker_prefill_tokens_agree"] = float((fast_code0 == slots.code0[:4]).float().mean())
    ref["executor"].prefill(rows[:4], [e.float() for e in embeds], samplings, seeds)
    (out["talker_prefill_hidden_fast_vs_fp32"], out["talker_prefill_hidden_plain_vs_fp32"],
     out["talker_prefill_hidden_ratio"]) = error_ratio(fast_hidden, slots.hidden[:4], ref["slots"].hidden[:4])
    return out


def check_code_predictor(env: dict[str, Any], lengths: list[int]) -> dict[str, float | bool]:
    from engine.fast.sampling import sample_tokens
    from engine.model import sampling as sampler
    from engine.model.rng import seed_tensor

    model, slots, fast_cp = env["model"], env["slots"], env["fast_cp"]
    out: dict[str, float | bool] = {}
    b = len(lengths)
    rows = list(range(b))
    # Code predictor: teacher-forced step-1 logits (fast fused forward vs plain forward), then whole frames.
    fill_state(env, lengths + [0] * (max(BATCHES) - b))
    predictor = model.code_predictor
    x = torch.stack((slots.hidden[:b], model.talker.embed_codec(slots.code0[:b])), dim=1)  # [b,2,H]
    plain_hidden = predictor(x, predictor.new_cache(b), start=0)[:, 1]
    with torch.inference_mode():
        caches = [fast_cp.cache.layer(i) for i in range(predictor.config.num_layers)]
        rows_t, two = torch.arange(b, device=DEVICE), torch.arange(2, device=DEVICE).repeat(b)
        fast_h = fast_cp._forward(x.reshape(2 * b, -1), rows_t[:, None].expand(b, 2).reshape(-1), two, caches,
                                  two + 1).view(b, 2, -1)[:, 1]  # fmt: skip
    out["cp_step1_hidden"] = relative_l2(fast_h, plain_hidden)
    out["cp_step1_logits"] = relative_l2(predictor.logits(1, fast_h), predictor.logits(1, plain_hidden))
    saved = snapshot(slots)
    fast_cp.predict(rows, rows, [0] * b)
    fast_codes = env["codes"][:b, 0].clone()
    restore(slots, saved)
    env["plain_cp"].predict(rows, rows, [0] * b)
    out["cp_frame_codes_agree"] = float((fast_codes == env["codes"][:b, 0]).float().mean())
    # Sampler: identical logits and counters -> identical tokens (sampled and greedy rows, top-k 50 and off).
    gen = torch.Generator(device=DEVICE).manual_seed(9)
    logits = torch.randn(64, 3072, device=DEVICE, generator=gen) * 3
    greedy = torch.arange(64, device=DEVICE) % 5 == 0
    top_k = torch.where(torch.arange(64, device=DEVICE) % 3 == 0, 0, 50)
    temperature = torch.full((64, 1), 0.9, device=DEVICE)
    seeds, frames = seed_tensor(list(range(64)), DEVICE), torch.arange(64, device=DEVICE)
    settings = sampler.RowSettings(greedy, temperature, top_k, 0)
    plain_tokens = sampler.draw(sampler.processed_probs(logits, settings), seeds, frames, 3)
    fast_tokens = sample_tokens(logits, greedy, temperature, top_k, 64, seeds, frames, 3)
    out["sampler_tokens_identical"] = bool(torch.equal(plain_tokens, fast_tokens))
    return out


# ---------------------------------------------------------------- timings and floors


def measure(env: dict[str, Any], context: int) -> dict[str, Any]:
    model, cache = env["model"], env["cache"]
    fast_talker, fast_cp = env["fast_talker"], env["fast_cp"]
    kv_per_position = 2 * model.config.talker.num_layers * model.config.talker.num_kv_heads * model.config.talker.head_dim * 2
    talker_weights = nbytes(model.talker.model.layers) + nbytes(model.talker.model.norm) + nbytes(model.talker.codec_head)
    cp = model.code_predictor
    groups = cp.config.num_code_groups - 1
    cp_bytes = groups * (nbytes(cp.model.layers) + nbytes(cp.small_to_mtp_projection) + nbytes(cp.lm_head[0]))
    gen = torch.Generator().manual_seed(1)
    result: dict[str, Any] = {"talker_decode": {}, "code_predict": {}, "talker_prefill": {}}
    for b in BATCHES:
        lengths = torch.randint(context // 2, context, (b,), generator=gen).tolist()  # mixed, up to the context
        fill_state(env, lengths + [0] * (max(BATCHES) - b))
        rows = list(range(b))
        load_talker_step(fast_talker, b, lengths)
        ms = cuda_median_ms(lambda b=b: fast_talker.decode_steps.replay(b), repeats=50, warmup=5)
        floor = (talker_weights + kv_per_position * sum(lengths)) / COPY_BANDWIDTH * 1e3
        result["talker_decode"][b] = {"ms": ms, "floor_ms": floor, "mean_context": sum(lengths) / b}
        fast_cp.inputs.load(b, kv_slot=rows, stream=rows, frame=[0] * b)
        ms = cuda_median_ms(lambda b=b: fast_cp.steps.replay(b), repeats=50, warmup=5)
        result["code_predict"][b] = {"ms": ms, "floor_ms": cp_bytes / COPY_BANDWIDTH * 1e3}
    for n, length in fast_talker.prefill_steps.keys:
        fast_talker.inputs.load(n, kv_slot=list(range(n)), position=[length] * n, text_row=[0] * n, frame=[0] * n,
                                eos_never=[1] * n)  # fmt: skip
        ms = cuda_median_ms(lambda k=(n, length): fast_talker.prefill_steps.replay(k), repeats=50, warmup=5)
        floor = (talker_weights + kv_per_position * n * length) / COPY_BANDWIDTH * 1e3
        result["talker_prefill"][f"{n}x{length}"] = {"tokens": n * length, "ms": ms, "floor_ms": floor}
    del cache
    return result


def cost_table(timings: dict[str, Any], codec: dict[str, Any] | None, commit: str,
               gpu: str = "NVIDIA H200") -> dict[str, Any]:
    """The fast-path cost table of this card (`gpu`, torch's device name) from this run's timings, named for its
    family (`h100_fast`; install it as `engine/scheduling/costs/<name>.json`). The codec's rows in other
    precisions (`codec_chunk_tf32`, from `tools/codec_profile.py --grid`) and, when this run skipped the codec, its
    `codec_chunk` too are carried over from the repository's table of the same family, else from the H200's, and
    then the sources say so: another card's codec times, to be measured on this one."""
    family = gpu_family(gpu) or "h200"
    plain = json.loads((COSTS_DIR / "h200_plain.json").read_text())
    carried_from = fast_costs_for(gpu)  # the engine's own choice: this family's table, else the H200's
    current = json.loads(carried_from.read_text())
    foreign = "" if carried_from.stem == f"{family}_fast" else f" (carried from {carried_from.name}: not measured on the {gpu})"
    prefill = sorted({v["tokens"]: v["ms"] for v in timings["talker_prefill"].values()}.items())
    carried = {k: v for k, v in current.items() if k.startswith("codec_chunk_")}
    sources = {k: v + foreign for k, v in current.get("sources", {}).items() if k.startswith("codec_chunk")}
    if codec:
        sources["codec_chunk"] = f"gpu_check codec section (commit {commit})"
    return {
        "name": f"{family}_fast",
        "description": f"Fast path (fused Triton kernels, CUDA graphs) on one {gpu}, Qwen3-TTS-12Hz-1.7B, bf16, "
                       "random weights; written by loadtest/gpu_check.py from its own measurements.",
        "sources": {
            "talker_decode": f"gpu_check, graph replay medians, mixed per-request context up to 512 (commit {commit})",
            "code_predict": f"gpu_check, one graph per frame (15 steps + sampling), medians (commit {commit})",
            "talker_prefill": f"gpu_check, prefill graphs per (batch, bucket), total padded tokens (commit {commit})",
            **sources,
        },
        "step_overhead_ms": plain.get("step_overhead_ms", 0.1),
        "talker_decode": {"batch": list(BATCHES), "ms": [round(timings["talker_decode"][b]["ms"], 4) for b in BATCHES]},
        "code_predict": {"batch": list(BATCHES), "ms": [round(timings["code_predict"][b]["ms"], 4) for b in BATCHES]},
        "talker_prefill": {"tokens": [t for t, _ in prefill], "ms": [round(m, 4) for _, m in prefill]},
        "codec_chunk": (codec or {}).get("codec_chunk", current["codec_chunk"]),
        **carried,
    }


def table(timings: dict[str, Any]) -> str:
    lines = ["B    talker ms (x floor)   CP frame ms (x floor)   frame step ms (x floor)"]
    for b in BATCHES:
        t, c = timings["talker_decode"][b], timings["code_predict"][b]
        frame, floor = t["ms"] + c["ms"], t["floor_ms"] + c["floor_ms"]
        lines.append(f"{b:<4} {t['ms']:7.3f} ({t['ms'] / t['floor_ms']:4.2f}x)      {c['ms']:7.3f} "
                     f"({c['ms'] / c['floor_ms']:5.2f}x)        {frame:7.3f} ({frame / floor:4.2f}x)")  # fmt: skip
    lines.append("prefill: " + ", ".join(f"{k} {v['ms']:.3f} ms ({v['ms'] / v['floor_ms']:.2f}x)"
                                         for k, v in timings["talker_prefill"].items()))  # fmt: skip
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def talker_section(args: argparse.Namespace, section: dict[str, Any]) -> None:
    """Fills `section` stage by stage, so a failure keeps what the earlier stages found."""
    from engine.fast.kernels.selfcheck import check_kernels

    with torch.inference_mode():
        section["kernels_bf16"] = check_kernels("cuda", torch.bfloat16)
        section["kernels_fp32"] = check_kernels("cuda", torch.float32)
        env = build(args)
        section["capture_s"] = env["capture_s"]
        section["prefill_error"] = env["prefill_error"]
        try:
            section["twins"] = check_twins(env)
        except Exception:  # noqa: BLE001 - still measure
            section["twins"] = {"error": traceback.format_exc()}
        section["timings"] = measure(env, args.context)
    twins = section["twins"]
    # kernels the checked configuration does not serve are reported, not failed (the talker's one-kernel draw
    # while --talker-fused-draw is off)
    unused = set() if env["fast_talker"].fused_draw else {"talker_draw"}
    failures = [k for k, v in section["kernels_bf16"].items() if v > 1e-2 and k not in unused]
    failures += [k for k, v in section["kernels_fp32"].items() if v > 1e-4 and k not in unused]
    # The talker's fused path may differ from the plain bf16 path by more than 2e-2 after 28 layers, as long as
    # it is as close to the fp32 reference as the plain path: at most FP32_ERROR_RATIO times the plain error.
    failures += [k for k in ("talker_decode_hidden_ratio", "talker_decode_logits_ratio", "talker_decode_hidden_ratio_b1",
                             "talker_decode_logits_ratio_b1", "talker_prefill_hidden_ratio")
                 if twins.get(k, math.inf) > FP32_ERROR_RATIO]  # fmt: skip
    failures += [k for k in ("cp_step1_hidden", "cp_step1_logits") if twins.get(k, 1.0) > BF16_TOLERANCE]
    failures += [] if twins.get("sampler_tokens_identical") else ["sampler_tokens_identical"]
    section["failures"] = failures


def dry_run(args: argparse.Namespace) -> int:
    """The correctness half on the CPU with the tiny fp32 model: proves the script before device time is spent."""
    global DEVICE, DTYPE
    DEVICE, DTYPE, args.preset = "cpu", torch.float32, "tiny"
    with torch.inference_mode():
        twins = check_twins(build(args))
    print(json.dumps(twins, indent=1))
    return 0 if twins["sampler_tokens_identical"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="gpu_check.json", help="raw JSON results")
    p.add_argument("--costs", default=None, help="write the cost-model JSON here (e.g. engine/scheduling/costs/h200_fast.json)")
    p.add_argument("--context", type=int, default=512, help="largest talker context of the decode timings")
    p.add_argument("--skip-talker", action="store_true")
    p.add_argument("--skip-codec", action="store_true")
    p.add_argument("--preset", default="1.7b", help="model shape (random weights)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny model: correctness only, no timings")
    add_kernel_arguments(p, KernelOptions())  # every kernel option as the engine's, with its default
    p.add_argument("--variant", default=None,
                   help="instead of the kernel flags, a variant of tools/frame_variants.py (a repository checkout; "
                        "knockouts refused), e.g. wide64+talker_wide64: its correctness and frame-step table")
    args = p.parse_args(argv)
    if args.variant:
        from tools import frame_variants

        if problem := frame_variants.refusal(args.variant):
            p.error(problem)
        if "ko_" in args.variant:
            p.error(f"variant {args.variant!r}: a knockout leaves kernels out, its results are meaningless")
    if args.dry_run:
        return dry_run(args)
    if not torch.cuda.is_available():
        p.error("no CUDA device: run on the GPU machine, or use --dry-run for the CPU correctness half")
    commit = source_revision()
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "commit": commit,
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "command": " ".join(sys.argv),
        "options": dataclasses.asdict(kernel_options(args)), "variant": args.variant,
    }  # fmt: skip
    try:
        import triton

        report["triton"] = triton.__version__
    except ImportError:
        report["triton"] = None
    codec: dict[str, Any] | None = None
    if not args.skip_codec:
        try:
            from loadtest import codec_check

            codec = codec_check.run(args)
            report["codec"] = codec
        except ImportError:
            report["codec"] = "loadtest.codec_check not present"
        except Exception:  # noqa: BLE001 - one section's failure must not hide the others
            report["codec"] = {"error": traceback.format_exc()}
    ok = True
    if not args.skip_talker:
        section: dict[str, Any] = {}
        report["talker_code_predictor"] = section
        try:
            talker_section(args, section)
            ok = not section["failures"]
            if args.costs:
                costs = cost_table(section["timings"], codec, commit, report["gpu"])
                Path(args.costs).write_text(json.dumps(costs, indent=2) + "\n")
                print(f"cost table {costs['name']} written to {args.costs}: the engine reads it as "
                      f"engine/scheduling/costs/{costs['name']}.json")
        except Exception:  # noqa: BLE001
            section["error"] = traceback.format_exc()
            ok = False
    Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
    section = report.get("talker_code_predictor", {})
    if "error" in section:
        print(json.dumps({k: v for k, v in section.items() if k != "error"}, indent=1, default=str)[-6000:])
        print(section["error"])
    elif section:
        print(json.dumps({"kernels_bf16": section["kernels_bf16"], "twins": section["twins"]}, indent=1))
        print(f"capture {section['capture_s']:.1f} s; failures: {section['failures'] or 'none'}")
        print(f"== talker / code predictor ({report['gpu']}, torch {report['torch']}, commit {commit[:10]})")
        print(table(section["timings"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
