"""The executors of the four work kinds behind one call: `Executors.run(plan, inputs) -> StepResult`.

The scheduler decides what runs; the executors only run it. They own every runtime tensor (talker KV
slot cache, code-predictor scratch cache, per-slot generation state, code buffer, codec state pool), all
preallocated here from the engine settings, and they never make a scheduling decision or touch IPC.

    TALKER_PREFILL  talker.TalkerExecutor.prefill        prompt rows -> KV slot, codebook 0 of frame 0
    CODE_PREDICT    code_predictor.CodePredictorExecutor  codebooks 1..15 of a frame, its embedding sum
    TALKER_DECODE   talker.TalkerExecutor.decode         frame + text row -> codebook 0 of the next frame
    CODEC_CHUNK     codec.CodecExecutor.launch           frames -> int16 PCM (first audio decoded in full)

Every executor is plain PyTorch (CPU and CUDA alike). A `FastPath` selection swaps in the GPU fast paths
of engine/fast behind the same calls: `TalkerGraphs`, `CodePredictorGraphs`, and `CodecGraphs` over
`FastCodecDecoder` inside the codec executor. They capture one CUDA graph per shape in `CaptureShapes`
(on a CPU they run the same padded static steps eagerly through PyTorch twins), split cohorts larger than
their largest shape, and take sampler settings only up to a static top-k width, which `check_submit`
enforces at Submit. `capture()` runs once, before any request is admitted (capture writes over slot 0's
state). `run` is the same on either path.

Voices. CustomVoice models speak with a built-in speaker (`Submit.speaker`). Base models speak with a saved
voice (`Submit.voice`), which `VoiceBank` reads from the voice store at Submit (once per save) and the request
keeps until it closes. x-vector mode: the prefill rows are `build_xvector_prefill`'s, embedded by
`embed_voice_prefill` with the voice's x-vector; every later step (decode, code predictor, codec) is the same
as for a built-in speaker, since the x-vector layout's trailing text equals the CustomVoice one. In-context
mode, for a voice saved with a transcript when the whole text is known at Submit (`Submit.text_ended`):
`build_in_context_prefill`'s rows (transcript ids, text ids and reference frames beside each other, in the
Submit's layout), embedded with the x-vector and the reference codes; the decode steps feed the prompt's
trailing text (`RequestState.prompt_trailing`), and the codec stream starts primed with the reference codes
(`CodecExecutor.open(prime=...)`), so the audio is the official [ref; generated] decode with the reference
cut off. Streamed text stays in x-vector mode: an in-context prompt holds the whole text. VoiceDesign models
speak with a voice described in words: the request's instruction (`Submit.instruct_ids`, required) in
`build_voice_design_prefill`'s rows (the CustomVoice layout without a speaker row), in either layout, as
the official `generate_voice_design` (`non_streaming_mode` False or True).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.codec.silence import SilenceConfig, first_frame_skip_applies
from engine.executors.code_predictor import CodePredictorExecutor
from engine.executors.codec import CodecExecutor
from engine.executors.inflight import InFlight, StepResult
from engine.executors.slots import GenerationSlots, check_sampling, new_code_buffer
from engine.executors.talker import TalkerExecutor
from engine.executors.voices import SavedVoice, VoiceBank
from engine.fast.sampling import DEFAULT_TOP_K_CAP, check_top_k
from engine.ipc.messages import Layout, Sampling, Submit
from engine.model.generate import embed_prefill
from engine.model.prompt_cache import PromptHeadCache
from engine.model.qwen3_tts import Qwen3TTS
from engine.model.voices import embed_voice_prefill
from engine.request import TEXT_END, TEXT_PAD, RequestState, WorkKind
from engine.scheduling import Lane, Outcome, Plan
from engine.settings import CaptureShapes, FastPath, KernelOptions
from engine.text.prompt import (
    Prefill,
    VoicePrefill,
    build_in_context_prefill,
    build_prefill,
    build_voice_design_prefill,
    build_xvector_prefill,
)

if TYPE_CHECKING:
    from engine.fast.code_predictor_graph import CodePredictorGraphs
    from engine.fast.talker_graph import TalkerGraphs

log = logging.getLogger("engine")

SERVED_MODEL_TYPES = ("custom_voice", "base", "voice_design")  # `tts_model_type`s the executors run
HIGH_STREAM_PRIORITY = -1  # a CUDA stream priority the block scheduler serves first (lower is higher; 0 the default)


@dataclass(frozen=True, slots=True)
class SubmitShape:
    """What admission needs of a checked Submit: its prefill rows and, in in-context mode, the text ids its
    decode steps feed (`RequestState.prompt_trailing`; None in every other mode)."""

    prefill_len: int
    prompt_trailing: tuple[int, ...] | None = None


@dataclass(slots=True)
class RequestInputs:
    """What the executors read of a request beyond its plan rows: the Submit (voice, instruction,
    sampling, seed) and the live state (text ids received so far)."""

    submit: Submit
    state: RequestState


class Executors:
    def __init__(self, model: Qwen3TTS, *, kv_slots: int, streams: int, max_context: int, max_frames: int,
                 max_batch: int, silence: SilenceConfig, fast: FastPath = FastPath(),  # noqa: B008
                 shapes: CaptureShapes | None = None, codec_precision: str = "tf32",
                 top_k_cap: int = DEFAULT_TOP_K_CAP, codec_stream: bool = True, codec_first: bool = False,
                 kernels: KernelOptions = KernelOptions(), precompile_workers: int = 0,  # noqa: B008
                 voices: VoiceBank | None = None, ragged_codec: bool = False,
                 codec_kernels: str = "fused", codec_layout: str = "channels-last") -> None:  # fmt: skip
        """`fast` picks the executors that run their fast path over `shapes` (required when any does);
        `codec_precision` must match the dtype the codec was loaded in (`executors.codec.codec_dtype`);
        `codec_stream`: on CUDA, codec chunks run on a stream of their own, beside the generation steps;
        `codec_first`: that stream has a high priority, so the GPU schedules the codec's blocks before the
        generation steps' whenever both wait for SMs (graphs replay at the priority of the stream they are
        launched on);
        `kernels`: how the fast talker and code predictor run (`KernelOptions`: the engine's defaults unless given);
        `precompile_workers`: child processes that compile the fused frame's Triton kernels before capture
        (engine/fast/precompile.py; 0: the capture compiles them one by one);
        `voices`: where a Base model's saved voices come from (None: a bank without a store);
        `ragged_codec`: codec plans may give each row its own frame count (`SchedulerConfig.ragged_codec`);
        `codec_kernels`: the fast codec's "ops" or "fused" kernels, `codec_layout` its vocoder's "ncl" or
        "channels-last" activations (`CodecExecutor`)."""
        if model.codec is None:
            raise ValueError("the engine needs a model loaded with its codec")
        if model.config.model_type not in SERVED_MODEL_TYPES:
            raise ValueError(f"the engine serves CustomVoice, Base and VoiceDesign models, not "
                             f"{model.config.model_type!r}")
        if fast.any and shapes is None:
            raise ValueError("the fast path needs its capture shapes (EngineSettings.capture_shapes)")
        config = model.config
        self.model = model
        self.silence = silence
        self.fast = fast
        self.top_k_cap = top_k_cap
        self.precompile_workers = precompile_workers
        self.voices = voices or VoiceBank(None, model_id=config.source, hidden=config.talker.hidden_size,
                                          device=model.device, dtype=model.dtype)
        if self.voices.tokenizer is None:
            self.voices.tokenizer = model.tokenizer  # transcripts are tokenized as the model's text
        self._request_voices: dict[int, tuple[SavedVoice, bool]] = {}  # request id -> (voice, in-context), open..close
        self._prime_keys: dict[str, str] = {}  # voice name -> the save whose primed codec state is cached
        self.prompt_heads = PromptHeadCache()  # prompts' opening rows, embedded once per speaker and language
        self.generation = GenerationSlots(kv_slots, config.talker.hidden_size, config.talker.vocab_size,
                                          device=model.device, dtype=model.dtype)
        self.kv_cache = model.talker.new_cache(kv_slots, max_context)
        self.codes = new_code_buffer(streams, max_frames, model.device)
        cuda = model.device.type == "cuda"
        self.generation_stream = torch.cuda.current_stream(model.device) if cuda else None
        self.codec_stream = self.generation_stream
        if cuda and codec_stream:
            self.codec_stream = torch.cuda.Stream(model.device, priority=HIGH_STREAM_PRIORITY if codec_first else 0)
        # Imported here: engine.fast.talker_graph and code_predictor_graph import engine.executors.slots, so a
        # module-level import would be circular for whoever imports engine.fast first.
        from engine.fast.code_predictor_graph import CodePredictorGraphs, FrameKernels
        from engine.fast.talker_graph import TalkerGraphs, chain_options

        self.talker: TalkerExecutor | TalkerGraphs
        self.code_predictor: CodePredictorExecutor | CodePredictorGraphs
        if fast.talker:
            assert shapes is not None
            chain_rows, chain_tiles = chain_options(kernels.talker_chain)
            self.talker = TalkerGraphs(model, self.generation, self.kv_cache, shapes.batch,
                                       prefill_sizes=shapes.prefill_batch, prefill_buckets=shapes.prefill_buckets,
                                       top_k_cap=top_k_cap, gemv_max_rows=kernels.talker_gemv_rows,
                                       fused_rope=kernels.talker_fused_rope, chain_rows=chain_rows,
                                       chain_tiles=chain_tiles, fused_draw=kernels.talker_fused_draw)  # fmt: skip
        else:
            self.talker = TalkerExecutor(model, self.generation, self.kv_cache)
        if fast.code_predictor:
            assert shapes is not None
            self.code_predictor = CodePredictorGraphs(model, self.generation, self.codes, shapes.batch,
                                                      top_k_cap=top_k_cap,
                                                      kernels=FrameKernels.from_options(kernels))  # fmt: skip
        else:
            self.code_predictor = CodePredictorExecutor(model, self.generation, self.codes, max_batch)
        codec_shapes = (shapes.codec_batch, shapes.codec_frames) if fast.codec and shapes is not None else None
        first_shapes = (shapes.first_chunk_batch, shapes.first_chunk_frames) \
            if codec_shapes is not None and shapes is not None and shapes.first_chunk_batch else None
        self.codec = CodecExecutor(model.codec, self.codes, streams, silence, precision=codec_precision,
                                   graph_shapes=codec_shapes, first_chunk_shapes=first_shapes, ragged=ragged_codec,
                                   kernels=codec_kernels, layout=codec_layout)

    @torch.inference_mode()  # as `run`, which replays what this captures
    def capture(self) -> None:
        """Capture the fast paths' CUDA graphs (off CUDA: build their static steps). Once, before the first
        request is admitted: capturing runs every step on slot 0's state. A no-op for plain executors."""
        if self.codec.open_streams:
            raise RuntimeError("capture the fast paths before any request is admitted")
        self._precompile()
        seconds = {}  # per fast path: the engine's ~3.5 minutes to ready on an H200 are nearly all capture
        for name, executor in (("talker", self.talker), ("code predictor", self.code_predictor),
                               ("codec", self.codec)):  # fmt: skip
            capture = getattr(executor, "capture", None)
            if capture is not None:
                started = time.perf_counter()
                capture()
                seconds[name] = time.perf_counter() - started
        if seconds:
            log.info("captured %s", ", ".join(f"{name} in {s:.1f} s" for name, s in seconds.items()))

    def _precompile(self) -> None:
        """Fill Triton's cache with the fused code-predictor frame's kernels from child processes, in
        parallel, so the capture below loads them instead of compiling dozens one after the other."""
        from engine.fast.code_predictor_graph import CodePredictorGraphs
        from engine.fast.kernels import HAVE_TRITON, INTERPRET
        from engine.fast.precompile import precompile_frames

        predictor = self.code_predictor
        if (not isinstance(predictor, CodePredictorGraphs) or not predictor.kernels.fused or not HAVE_TRITON
                or INTERPRET or self.model.device.type != "cuda" or self.precompile_workers < 1):
            return
        config = self.model.config
        seconds = precompile_frames(config.talker, config.code_predictor, self.model.dtype, predictor.sizes,
                                    predictor.kernels, self.top_k_cap, self.precompile_workers)  # fmt: skip
        log.info("fused code-predictor kernels precompiled by %d processes in %.1f s", self.precompile_workers,
                 seconds)  # fmt: skip

    # ------------------------------------------------------------ request lifecycle

    def check_submit(self, msg: Submit) -> SubmitShape:
        """Validate a Submit against this model; -> its prefill length (and in-context trailing text).
        ValueError names what is wrong."""
        config = self.model.config
        check_sampling(msg.sampling)
        self._check_fast_top_k(msg.sampling)
        self.check_text_ids(msg.text_ids)
        self.check_text_ids(msg.instruct_ids, what="instruct_ids")
        if msg.instruct_ids and not config.supports_instruct:
            raise ValueError(f"the {config.model_size} model does not take instructions")
        if config.is_base:
            if not msg.voice:
                raise ValueError("a Base model speaks with a saved voice: name one (voice), not a speaker")
            if msg.speaker:
                raise ValueError(f"a Base model has no built-in speakers (got speaker {msg.speaker!r})")
            if msg.instruct_ids:
                raise ValueError("a Base model does not take instructions")
            voice = self.voices.resolve(msg.voice)
            if in_context(msg, voice):
                prefill = self._prefill(msg, msg.text_ids, voice)
                assert isinstance(prefill, VoicePrefill)
                return SubmitShape(len(prefill.rows), prefill.trailing)
        elif config.is_voice_design:
            if msg.voice or msg.speaker:
                raise ValueError(f"a VoiceDesign model has no saved voices or built-in speakers (got "
                                 f"{msg.voice or msg.speaker!r}); describe the voice in the instructions")  # fmt: skip
            if not msg.instruct_ids:
                raise ValueError("a VoiceDesign model speaks with a voice described in words: the request needs "
                                 "instructions (instruct_ids)")  # fmt: skip
        elif msg.voice:
            raise ValueError(f"saved voices need a Base model; this {config.model_type} model has built-in speakers")
        # The streaming layout's prefill length does not depend on the text: a placeholder x_1 sizes it.
        text = msg.text_ids or ((0,) if msg.layout is Layout.STREAMING else ())
        return SubmitShape(len(self._prefill(msg, text).rows))

    def _check_fast_top_k(self, sampling: Sampling) -> None:
        """A fast path samples within a static top-k width (`top_k_cap`): wider settings are refused here,
        not discovered in the middle of a batch."""
        checks = []
        if self.fast.talker:
            checks.append(("top_k", sampling.top_k, self.model.config.talker.vocab_size))
        if self.fast.code_predictor:
            checks.append(("subtalker_top_k", sampling.subtalker_top_k, self.model.code_predictor.config.vocab_size))
        for name, top_k, vocab in checks:
            try:
                check_top_k([top_k], self.top_k_cap, vocab)
            except ValueError:
                raise ValueError(f"sampling.{name} {top_k} is above the fast path's top-k cap of {self.top_k_cap} "
                                 f"(use 1..{self.top_k_cap}, or 0 for no top-k)") from None

    def check_text_ids(self, ids: Sequence[int], what: str = "text_ids") -> None:
        vocab = self.model.config.talker.text_vocab_size
        if any(not 0 <= i < vocab for i in ids):
            raise ValueError(f"{what} must lie in [0, {vocab})")

    def open(self, request_id: int, submit: Submit) -> None:
        """Allocate the request's codec stream (at admission, so its slot is ready when frames are); an
        in-context request's starts primed with its voice's reference codes."""
        voice = self.voices.cached(submit.voice) if submit.voice else None
        icl = voice is not None and in_context(submit, voice)
        prime = None
        if icl:
            assert voice is not None and voice.ref_codes is not None
            previous = self._prime_keys.get(submit.voice)
            if previous is not None and previous != voice.key:
                self.codec.forget_prime(previous)  # the name was saved again: its old state is unreachable
            self._prime_keys[submit.voice] = voice.key
            prime = (voice.key, voice.ref_codes)
        # The silent first frame is a stream start's; a primed stream continues the reference (official: no skip).
        skip = not icl and first_frame_skip_applies(enabled=self.silence.skip_silent_first_frame,
                                                    random_weights=self.model.config.random_weights,
                                                    default_sampling=submit.sampling == Sampling(),
                                                    instruct=bool(submit.instruct_ids), frames_decoded=0)
        self.codec.open(request_id, skip_first_frame=skip, prime=prime)
        if voice is not None:
            self._request_voices[request_id] = (voice, icl)

    def close(self, request_id: int) -> None:
        """Free the request's device state that outlives its plan rows. Idempotent."""
        self.codec.close(request_id)
        self._request_voices.pop(request_id, None)

    @property
    def free_codec_states(self) -> int:
        return self.codec.pool.free_slots

    # ------------------------------------------------------------ one plan

    def run(self, plan: Plan, inputs: Mapping[int, RequestInputs]) -> StepResult:
        """Launch one plan and wait for it: `launch` + the device finishing + `finish` (tests, warm-up)."""
        step = self.launch(plan, inputs)
        if step.end is not None:
            step.end.synchronize()
        return step.finish()

    @torch.inference_mode()
    def launch(self, plan: Plan, inputs: Mapping[int, RequestInputs]) -> InFlight:
        """Queue one plan's kernels between two CUDA events on its lane's stream (codec-lane chunks: the codec
        stream, after everything queued on the generation stream so far, which wrote their frames; first-chunk
        plans: the generation stream, behind the code predictor that made their frames); wait for nothing.
        Generation plans are complete at launch (their results stay on the device) unless some row may
        sample EOS; codec plans and EOS reads are `deferred` until their end event fires."""
        codec = plan.kind is WorkKind.CODEC_CHUNK
        stream = self.codec_stream if plan.lane is Lane.CODEC else self.generation_stream
        started = time.perf_counter()
        if stream is None:  # CPU: synchronous; the host wall time is the device time
            finish = self._launch(plan, inputs)
            result = finish()
            return InFlight(plan, lambda: result, deferred=False, wall_ms=(time.perf_counter() - started) * 1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if stream is not self.generation_stream:
            assert self.generation_stream is not None
            stream.wait_stream(self.generation_stream)  # the code predictor wrote these frames there
        with torch.cuda.stream(stream):
            start.record(stream)
            finish = self._launch(plan, inputs)
            end.record(stream)
        deferred = codec or plan.eos_possible
        return InFlight(plan, finish, deferred=deferred, start=start, end=end,
                        wall_ms=(time.perf_counter() - started) * 1000)

    def _launch(self, plan: Plan, inputs: Mapping[int, RequestInputs]) -> Callable[[], StepResult]:
        """Queue the plan on the current stream; -> the host part, to run once the stream has passed it."""
        rows = plan.rows
        kv_slots = [row.kv_slot for row in rows]
        if plan.kind is WorkKind.TALKER_PREFILL:
            requests = [inputs[row.request_id] for row in rows]
            embeds = []
            for row, r in zip(rows, requests, strict=True):
                voice, icl = self._request_voices.get(row.request_id, (None, False))
                prefill = self._prefill(r.submit, r.state.text_ids, voice if icl else None)
                if isinstance(prefill, VoicePrefill):
                    assert voice is not None
                    embed = embed_voice_prefill(self.model, prefill, voice.embedding, voice.ref_codes if icl else None)[0]
                else:
                    embed = embed_prefill(self.model, prefill, self.prompt_heads)  # [L,H]
                assert embed.shape[0] == r.state.prefill_len, "prefill length changed since admission"
                embeds.append(embed)
            self.talker.prefill(kv_slots, embeds, [r.submit.sampling for r in requests],  # type: ignore[arg-type]
                                [r.submit.seed for r in requests])
            return _no_result
        if plan.kind is WorkKind.TALKER_DECODE:
            text_ids = [self._text_id(inputs[row.request_id].state, row.text_index) for row in rows]
            tokens = self.talker.decode_tokens(kv_slots, [row.position for row in rows],  # type: ignore[arg-type]
                                               [row.frame_index for row in rows], text_ids,
                                               [row.eos_allowed for row in rows], read_tokens=plan.eos_possible)
            if tokens is None:
                return _no_result
            host = _to_host(tokens)
            eos_id = self.model.config.talker.codec_eos_id

            def eos_rows() -> StepResult:
                drawn = host.tolist()
                return StepResult(Outcome(eos=frozenset(row.request_id for row, token in zip(rows, drawn, strict=True)
                                                        if row.eos_allowed and token == eos_id)))

            return eos_rows
        if plan.kind is WorkKind.CODE_PREDICT:
            self.code_predictor.predict(kv_slots, [row.codec_slot for row in rows],  # type: ignore[misc]
                                        [row.frame_index for row in rows])
            return _no_result
        ragged = any(row.codec_frames != plan.codec_frames for row in rows)
        finish_audio = self.codec.launch([row.request_id for row in rows], [row.codec_slot for row in rows],  # type: ignore[misc]
                                         [row.frame_index for row in rows], plan.codec_frames,
                                         [row.final_chunk for row in rows],
                                         [row.codec_frames for row in rows] if ragged else None,
                                         first_chunks=plan.first_chunks)

        def audio() -> StepResult:
            pcm = finish_audio()
            return StepResult(Outcome(samples={rid: len(samples) for rid, samples in pcm.items()}), pcm)

        return audio

    def _prefill(self, submit: Submit, text_ids: Sequence[int], in_context_voice: SavedVoice | None = None
                 ) -> Prefill | VoicePrefill:  # fmt: skip
        """The request's prompt; `in_context_voice`: the voice of an in-context request (None otherwise)."""
        if in_context_voice is not None:
            assert in_context_voice.ref_codes is not None
            return build_in_context_prefill(self.model.config.prompt_ids, language=submit.language, text_ids=text_ids,
                                            ref_text_ids=in_context_voice.ref_text_ids,
                                            ref_frames=int(in_context_voice.ref_codes.shape[0]),
                                            streaming=submit.layout is Layout.STREAMING)  # fmt: skip
        if self.model.config.is_voice_design:
            return build_voice_design_prefill(self.model.config.prompt_ids, language=submit.language,
                                              text_ids=text_ids, instruct_ids=submit.instruct_ids,
                                              streaming=submit.layout is Layout.STREAMING)
        if submit.voice:
            return build_xvector_prefill(self.model.config.prompt_ids, language=submit.language, text_ids=text_ids,
                                         streaming=submit.layout is Layout.STREAMING)
        return build_prefill(self.model.config.prompt_ids, speaker=submit.speaker, language=submit.language,
                             text_ids=text_ids, instruct_ids=submit.instruct_ids,
                             streaming=submit.layout is Layout.STREAMING)

    def _text_id(self, state: RequestState, text_index: int) -> int:
        """The text id a talker step feeds: x_(i+1), then tts_eos once, then tts_pad (reference 5.4); in-context
        mode: the prompt's trailing text, then tts_pad."""
        ids = self.model.config.prompt_ids
        if state.prompt_trailing is not None and text_index >= 0:
            return state.prompt_trailing[text_index]
        if text_index == TEXT_END:
            return ids.tts_eos
        if text_index == TEXT_PAD:
            return ids.tts_pad
        return state.text_ids[text_index]


def in_context(submit: Submit, voice: SavedVoice) -> bool:
    """The mode choice: in-context when the voice was saved with a transcript and the whole text is known at
    Submit (its prompt holds the whole text); x-vector mode otherwise."""
    return voice.in_context and submit.text_ended and bool(submit.text_ids)


def _no_result() -> StepResult:
    return StepResult(Outcome())


def _to_host(tokens: torch.Tensor) -> torch.Tensor:
    """Device tokens -> a host tensor filled by an asynchronous copy (read it after the step's end event)."""
    if tokens.device.type != "cuda":
        return tokens
    host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
    host.copy_(tokens, non_blocking=True)
    return host
