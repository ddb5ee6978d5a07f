"""Engine process entry: settings -> load weights -> allocate -> capture graphs -> warm up -> listen -> serve.

    python -m engine --model tiny|tiny-base|DIR|HF_ID --socket PATH [--device auto|cpu|cuda] [--voices-dir DIR] [...]

CustomVoice models serve their built-in speakers; Base models serve the saved voices of `--voices-dir`
(x-vector mode; Ready lists no speakers) and warm up with an all-zero x-vector that no store holds;
VoiceDesign models speak with the voice each request's instructions describe (required; Ready lists no
speakers) and warm up with a fixed description. Ready names the kind (`model_type`).

The control socket appears only once the engine can serve (weights loaded, caches allocated, fast-path
graphs captured, one warm-up synthesis done), and every gateway link gets `Ready` as it connects. SIGTERM /
SIGINT before that exit at once (status 0); afterwards they start a graceful shutdown (engine/loop.py).
Exit status: 0 after a graceful shutdown, 1 when the device fails, 2 for bad arguments.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engine.settings import EngineSettings, parse_args

if TYPE_CHECKING:
    import torch

    from engine.loop import EngineLoop

log = logging.getLogger("engine")

WARM_UP_TEXT = "Warm up."
WARM_UP_VOICE = "@warm-up"  # never a store name (engine/voice_store.py: names start with [a-z0-9])
WARM_UP_DESCRIPTION = "A calm, clear voice."  # a VoiceDesign model's warm-up instructions


class _Stopped(Exception):
    """SIGTERM arrived before the engine was serving."""


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s engine %(levelname)s %(message)s")
    from engine.ipc.process import die_with_parent

    die_with_parent()  # a gateway killed with SIGKILL must not leave an engine holding the GPU

    def stop_before_serving(signum: int, frame: object) -> None:
        raise _Stopped

    signal.signal(signal.SIGTERM, stop_before_serving)
    signal.signal(signal.SIGINT, stop_before_serving)
    try:
        loop = build(settings)
    except _Stopped:
        log.info("stopped before serving")
        return 0
    return serve(loop, settings)


def build(settings: EngineSettings) -> EngineLoop:
    import torch  # imported here, not at the top: --help and argument errors stay instant

    from engine.executors import HIGH_STREAM_PRIORITY, SERVED_MODEL_TYPES, Executors
    from engine.executors.codec import codec_dtype
    from engine.executors.voices import VoiceBank
    from engine.fast.kernels import HAVE_TRITON
    from engine.gc_watch import freeze_startup_objects, process_watch
    from engine.gpu_identity import gpu_uuid
    from engine.ipc.messages import Ready, Submit
    from engine.loop import EngineLoop
    from engine.model.presets import PRESETS
    from engine.model.weights import load_model
    from engine.scheduling import CostModel, Scheduler
    from engine.text.prompt import languages, speakers

    log.info("settings %s", settings.fingerprint())
    device = _resolve_device(settings.device)
    dtype = _resolve_dtype(settings.dtype, device)
    preset = settings.model.lower() in PRESETS and not Path(settings.model).exists()
    if settings.threads or (device.type == "cpu" and preset):
        torch.set_num_threads(settings.threads or 1)
    started = time.perf_counter()
    fast = settings.fast_path_for(device_kind=device.type, have_triton=HAVE_TRITON)
    codec_precision = settings.codec_precision_for(device.type)
    if fast.any and device.type == "cuda" and not HAVE_TRITON:
        log.warning("--fast-path on without Triton: graphs replay the kernels' PyTorch twins (slow)")
    model = load_model(settings.model, device=device, dtype=dtype, load_format=settings.load_format,
                       download=settings.download, seed=settings.seed,
                       codec_dtype=codec_dtype(codec_precision), voice_models=True)
    config = model.config
    if config.model_type not in SERVED_MODEL_TYPES:
        raise SystemExit(f"error: {settings.model} is a {config.model_type} model; only CustomVoice, Base and "
                         "VoiceDesign models are served")
    from engine.voice_store import VoiceStore

    store = VoiceStore(settings.voices_dir) if settings.voices_dir else None
    voices = VoiceBank(store, model_id=settings.model, hidden=config.talker.hidden_size, device=device, dtype=dtype)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    costs = settings.costs_path(fast, device_name)
    log.info("cost table %s (device %s)", costs.name, device_name or device.type)
    scheduler = Scheduler(settings.scheduler_config(random_weights=config.random_weights, device_kind=device.type),
                          CostModel.load(costs, codec_precision), settings.chunk_policy_object())
    if settings.stream_priority == "generation" and device.type == "cuda":
        # The executors take the current stream as the generation stream: make it one the GPU's block scheduler
        # serves before the codec stream (default priority) whenever both have blocks waiting for SMs.
        torch.cuda.synchronize(device)  # the weights were written on the default stream
        torch.cuda.set_stream(torch.cuda.Stream(device, priority=HIGH_STREAM_PRIORITY))
    executors = Executors(model, kv_slots=settings.kv_slots, streams=settings.streams,
                          max_context=settings.max_context, max_frames=settings.max_frames,
                          max_batch=settings.max_batch, silence=settings.silence_config(), fast=fast,
                          shapes=settings.capture_shapes, codec_precision=codec_precision,
                          codec_stream=settings.codec_stream, codec_first=settings.stream_priority == "codec",
                          kernels=settings.kernel_options, precompile_workers=settings.resolved_precompile_workers, voices=voices,
                          ragged_codec=settings.ragged_codec, codec_kernels=settings.codec_kernels,
                          codec_layout=settings.codec_layout)
    loaded = time.perf_counter()
    executors.capture()  # before the warm-up: capturing writes over slot 0's state
    captured = time.perf_counter()
    log.info("fast path: %s (codec precision %s), captured in %.1f s", fast.describe(), codec_precision,
             captured - loaded)
    ready = Ready(model_id=settings.model, random_weights=config.random_weights,
                  sample_rate=config.codec.output_sample_rate, speakers=speakers(config.prompt_ids),
                  languages=languages(config.prompt_ids), device=str(device), max_batch=settings.max_batch,
                  gpu_uuid=gpu_uuid(device), model_type=config.model_type,
                  takes_instructions=config.supports_instruct and not config.is_base)
    loop = EngineLoop(scheduler, executors, ready, heartbeat_s=settings.heartbeat_s,
                      shutdown_grace_ms=settings.shutdown_grace_ms, max_in_flight=settings.max_in_flight,
                      codec_in_flight=settings.codec_in_flight, split_lanes=settings.split_lanes,
                      slot_wait_ms=settings.slot_wait_ms, stall_dump_s=settings.stall_dump_s)
    assert model.tokenizer is not None
    text_ids = tuple(model.tokenizer.target_ids(WARM_UP_TEXT))
    speaker = ready.speakers[0] if ready.speakers else ""
    saved_voice = ""
    if config.is_base:
        saved_voice = WARM_UP_VOICE
        voices.pin(WARM_UP_VOICE, torch.zeros(config.talker.hidden_size))
    instruct_ids = tuple(model.tokenizer.instruct_ids(WARM_UP_DESCRIPTION)) if config.is_voice_design else ()
    steps = loop.warm_up(Submit(request_id=1, speaker=speaker, language="auto", text_ids=text_ids,
                                text_chars=len(WARM_UP_TEXT), text_ended=True, voice=saved_voice,
                                instruct_ids=instruct_ids))
    voices.unpin(WARM_UP_VOICE)
    process_watch("engine")  # from here on every collection's pause is timed (heartbeat `host.gc`)
    frozen = freeze_startup_objects()  # the model, graphs and caches: no later collection walks them
    log.info("model %s on %s%s (%s, %s weights) loaded in %.1f s; warm-up %.1f s (%s); %d start-up objects frozen "
             "for the garbage collector", settings.model, device,
             f" ({ready.gpu_uuid})" if ready.gpu_uuid else "", dtype,
             "random" if config.random_weights else "real", loaded - started, time.perf_counter() - captured,
             ", ".join(f"{kind.name.lower()} x{n}" for kind, n in steps.items()), frozen)
    if settings.profile_dir:
        from engine.profiling import HostProfiler, StepProfiler

        kind = HostProfiler if settings.profile_kind == "host" else StepProfiler
        profiler = kind(settings.profile_dir, start_after_s=settings.profile_after_s, steps=settings.profile_steps)
        loop.on_turn = lambda plan: profiler.turn(time.monotonic(), None if plan is None else plan.kind.label)
        loop.on_close = profiler.close
        log.info("profiling (%s) %d turns, %.0f s after the first request, into %s", settings.profile_kind,
                 settings.profile_steps, settings.profile_after_s, settings.profile_dir)
    if settings.sync_debug == "warn" and device.type == "cuda":
        torch.cuda.set_sync_debug_mode("warn")  # after warm-up: capture and warm-up sync on purpose
    return loop


def serve(loop: EngineLoop, settings: EngineSettings) -> int:
    from engine.ipc.messages import Error
    from engine.ipc.server import EngineEndpoint

    try:
        endpoint = EngineEndpoint(settings.socket)
    except _Stopped:
        return 0

    def shut_down(signum: int, frame: object) -> None:
        loop.request_shutdown()
        endpoint.wakeup()

    signal.signal(signal.SIGTERM, shut_down)
    signal.signal(signal.SIGINT, shut_down)
    log.info("serving on %s", settings.socket)
    try:
        status = loop.serve(endpoint)
        log.info("shut down")
        return status
    except Exception as error:
        log.exception("engine failed")
        endpoint.send_many([(link, Error(0, "internal", f"engine failed: {error}")) for link in endpoint.links()])
        return 1
    finally:
        endpoint.close()


def _resolve_device(name: str) -> torch.device:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda, but no CUDA device is available")
    return device


def _resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    import torch

    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


if __name__ == "__main__":
    sys.exit(main())
