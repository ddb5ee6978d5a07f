"""Shared pieces of the engine tests: building an in-process engine loop, and the reference output
(`generate_codes` + full codec decode + the same silence trim) a request must reproduce."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from engine.codec.silence import LeadingSilenceTrimmer, SilenceConfig
from engine.executors import Executors
from engine.executors.codec import to_int16
from engine.executors.voices import VoiceBank
from engine.ipc.messages import DoneReason, Layout, Ready, Sampling, Submit
from engine.loop import EngineLoop
from engine.model.generate import decode_codes, generate_codes
from engine.model.qwen3_tts import Qwen3TTS
from engine.scheduling import CostModel, Plan, Scheduler
from engine.settings import CaptureShapes, EngineSettings, FastPath
from engine.text.prompt import build_prefill

SENTENCES = [
    "Hello there, friend.",
    "The quick brown fox jumps.",
    "A short line.",
    "Seven tired zebras watch quietly.",
    "Rain again today?",
    "We will see.",
    "Numbers like 42 count too.",
    "Bright morning light.",
]


def text_ids(model: Qwen3TTS, text: str) -> tuple[int, ...]:
    assert model.tokenizer is not None
    return tuple(model.tokenizer.target_ids(text))


class StepClock:
    """A clock that moves 1 ms each time it is read: the scheduler's choices no longer depend on this
    machine's speed."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        self.now += 1_000_000
        return self.now


def make_loop(model: Qwen3TTS, *, kv_slots: int = 16, max_batch: int = 16, length_model: bool | None = None,
              fast: FastPath = FastPath(), shapes: CaptureShapes | None = None,  # noqa: B008
              voices: VoiceBank | None = None, clock: Callable[[], int] | None = None,
              **settings: object) -> EngineLoop:
    """The engine's loop, scheduler and executors in this process (no IPC), sized like a small engine.
    `fast` selects fast paths (captured over `shapes`, by default the settings' own), as `--fast-path`;
    `voices`: where a Base model's saved voices come from; `clock`: the loop's clock (default: monotonic_ns).
    Codec gathering is off unless `codec_gather_ms` is given: these tests drive `step()` until it idles, and a
    gathering loop idles with codec rows waiting for their window (the serving loop then sleeps until
    `next_wake_ns`; the engine-process tests run the defaults, gathering included)."""
    settings = {"codec_gather_ms": 0.0, **settings}
    s = EngineSettings(model="tiny", socket="@unused", kv_slots=kv_slots, max_batch=max_batch, **settings)  # type: ignore[arg-type]
    random_weights = model.config.random_weights if length_model is None else length_model
    scheduler = Scheduler(s.scheduler_config(random_weights=random_weights, device_kind="cpu"),
                          CostModel.load(s.costs_path(fast)), s.chunk_policy_object())
    executors = Executors(model, kv_slots=s.kv_slots, streams=s.streams, max_context=s.max_context,
                          max_frames=s.max_frames, max_batch=s.max_batch, silence=s.silence_config(), fast=fast,
                          shapes=shapes or s.capture_shapes, codec_precision=s.codec_precision_for("cpu"), voices=voices,
                          ragged_codec=s.ragged_codec, codec_kernels=s.codec_kernels,
                          codec_layout=s.codec_layout)
    executors.capture()
    ready = Ready("tiny", random_weights, 24000, ("ryan",), ("auto",), "cpu", s.max_batch)
    return EngineLoop(scheduler, executors, ready) if clock is None else EngineLoop(scheduler, executors, ready,
                                                                                     clock=clock)


def submit(model: Qwen3TTS, request_id: int, text: str, *, seed: int = 0, sampling: Sampling = Sampling(),  # noqa: B008
           speaker: str = "ryan", language: str = "english", layout: Layout = Layout.STREAMING) -> Submit:
    return Submit(request_id=request_id, speaker=speaker, language=language, text_ids=text_ids(model, text),
                  text_chars=len(text), text_ended=True, layout=layout, seed=seed, sampling=sampling)


def reference(model: Qwen3TTS, msg: Submit, silence: SilenceConfig | None = None) -> tuple[torch.Tensor, np.ndarray]:
    """The request alone through the reference loop -> (frames [T,16], the int16 PCM the engine must publish)."""
    prefill = build_prefill(model.config.prompt_ids, speaker=msg.speaker, language=msg.language,
                            text_ids=msg.text_ids, instruct_ids=msg.instruct_ids,
                            streaming=msg.layout is Layout.STREAMING)
    codes = generate_codes(model, prefill, msg.sampling, msg.seed, text_chars=msg.text_chars)
    trimmer = LeadingSilenceTrimmer(silence or SilenceConfig())
    pcm = trimmer.push(decode_codes(model, codes))
    return codes, to_int16(np.concatenate([pcm, trimmer.finish()]))


def record_plans(loop: EngineLoop) -> list[Plan]:
    """Every plan the loop launches from now on, in launch order (the executors' `launch`, wrapped)."""
    plans: list[Plan] = []
    launch = loop.executors.launch

    def recording_launch(plan: Plan, inputs):  # type: ignore[no-untyped-def]
        plans.append(plan)
        return launch(plan, inputs)

    loop.executors.launch = recording_launch  # type: ignore[method-assign]
    return plans


def assert_reference_audio(model: Qwen3TTS, msg: Submit, outcome: Finished) -> None:
    """The request completed and published its reference audio (a full decode) within 1 LSB."""
    assert outcome.error is None and outcome.done.reason is DoneReason.COMPLETED, outcome.error
    _, expected = reference(model, msg)
    assert len(outcome.samples) == len(expected)
    assert int(np.abs(outcome.samples.astype(np.int32) - expected).max()) <= 1


LINK = 7  # any link id: the in-process loop routes replies by it


class Finished:
    """What one request published: its PCM (in order, checked contiguous), its Done, any Error."""

    def __init__(self) -> None:
        self.pcm = bytearray()
        self.firsts = 0
        self.done = None
        self.error = None

    @property
    def samples(self) -> np.ndarray:
        return np.frombuffer(bytes(self.pcm), dtype="<i2")


def run_to_completion(loop: EngineLoop, msgs: list[Submit], max_steps: int = 20_000,
                      submit_at: list[int] | None = None) -> tuple[dict[int, Finished], dict[int, torch.Tensor]]:
    """Submit every request at once (or msgs[i] before loop step submit_at[i]), step until all ended ->
    (published output, generated frames) per request."""
    from engine.ipc.messages import Audio, Done, Error

    submit_at = submit_at or [0] * len(msgs)
    code_slots = {}

    def submit_due(step: int) -> None:
        now = loop.clock()
        for msg, at in zip(msgs, submit_at, strict=True):
            if at == step:
                loop.handle(LINK, msg, now)
                state = loop.request_state(LINK, msg.request_id)
                assert state is not None, f"request {msg.request_id} was refused: {loop.take_replies()}"
                code_slots[msg.request_id] = state.codec_slot

    results = {msg.request_id: Finished() for msg in msgs}
    frames: dict[int, torch.Tensor] = {}
    for step in range(max_steps):
        submit_due(step)
        ran = loop.step()
        for link, reply in loop.take_replies():
            assert link == LINK
            r = results[reply.request_id]
            assert r.done is None, f"{reply} after Done"
            if isinstance(reply, Audio):
                assert reply.start_sample == len(r.pcm) // 2, "audio is not contiguous"
                r.firsts += reply.first
                r.pcm += reply.pcm
            elif isinstance(reply, Done):
                r.done = reply
                # Now, not after the run: a finished request's codec slot goes to the next request admitted.
                codes = loop.executors.codes
                if codes.is_cuda:
                    torch.cuda.synchronize(codes.device)  # whichever stream wrote the slot has finished
                frames[reply.request_id] = codes[code_slots[reply.request_id], : reply.frames].clone()
            elif isinstance(reply, Error):
                r.error = reply
        if not ran and step >= max(submit_at) and all(r.done is not None for r in results.values()):
            break
    assert all(r.done is not None for r in results.values()), "requests did not finish"
    return results, frames
