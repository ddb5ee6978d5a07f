"""The engine with `--fast-path on` (tiny model, CPU: the fast objects run their padded static steps through
the kernels' PyTorch twins) publishes exactly what `--fast-path off` publishes: the same tokens, and PCM
within 1 LSB, for concurrent requests of different lengths with streamed text; cohorts larger than the
largest captured shape run as several captured steps; a top-k the fast path cannot sample is refused at
Submit; and the real process wires it all up (capture before warm-up, every slot free afterwards)."""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.executors import Executors
from engine.executors.talker import TalkerExecutor
from engine.fast.code_predictor_graph import CodePredictorGraphs, FrameKernels
from engine.fast.sampling import DEFAULT_TOP_K_CAP
from engine.fast.talker_graph import CHAIN_ROWS, TalkerGraphs
from engine.ipc.client import EngineLink
from engine.ipc.messages import (
    AppendText,
    Audio,
    Done,
    DoneReason,
    EndText,
    Error,
    Heartbeat,
    Layout,
    Sampling,
    Submit,
)
from engine.ipc.process import engine_command, spawn_engine, stop_engine, wait_for_socket
from engine.loop import EngineLoop
from engine.model.qwen3_tts import Qwen3TTS
from engine.request import WorkKind, length_model_frames
from engine.settings import CaptureShapes, EngineSettings, FastPath, KernelOptions, parse_args
from tests.engine.helpers import LINK, SENTENCES, Finished, make_loop, reference, submit, text_ids

REPO = Path(__file__).resolve().parents[2]
ALL_FAST = FastPath(talker=True, code_predictor=True, codec=True)
GREEDY = Sampling(greedy=True, subtalker_greedy=True)


@pytest.fixture(scope="module")
def fast_model(tiny_model: Qwen3TTS) -> Qwen3TTS:
    """Its own copy: the fast path fuses the projection weights and re-points the model's parameters."""
    return copy.deepcopy(tiny_model)


# ------------------------------------------------------------ driving the loop in this process


def _streamed(model: Qwen3TTS, request_id: int, text: str, *, seed: int, sampling: Sampling = Sampling()  # noqa: B008
              ) -> tuple[Submit, list[AppendText]]:  # fmt: skip
    """The first word as the Submit (text still open), each further word as an AppendText."""
    words = text.split(" ")
    pieces = [text_ids(model, w if i == 0 else " " + w) for i, w in enumerate(words)]
    head = Submit(request_id, "ryan", "english", pieces[0], len(words[0]), False, seed=seed, sampling=sampling)
    return head, [AppendText(request_id, ids, len(" " + w)) for ids, w in zip(pieces[1:], words[1:], strict=True)]


def _run(loop: EngineLoop, complete: list[Submit], streamed: list[tuple[Submit, list[AppendText]]],
         every: int = 3, max_steps: int = 20_000) -> tuple[dict[int, Finished], dict[int, torch.Tensor]]:  # fmt: skip
    """Submit everything at once, then feed each streamed request one word every `every` steps, then its
    EndText; step until all ended -> (published output, generated frames) per request."""
    now = loop.clock()
    for msg in [*complete, *(head for head, _ in streamed)]:
        loop.handle(LINK, msg, now)
    ids = [m.request_id for m in complete] + [head.request_id for head, _ in streamed]
    code_slots = {}
    for rid in ids:
        state = loop.request_state(LINK, rid)
        assert state is not None, f"request {rid} was refused: {loop.take_replies()}"
        code_slots[rid] = state.codec_slot
    feeds = {head.request_id: [*words, EndText(head.request_id)] for head, words in streamed}
    results = {rid: Finished() for rid in ids}
    for step in range(max_steps):
        if step % every == 0:
            for queue in feeds.values():
                if queue:
                    loop.handle(LINK, queue.pop(0), loop.clock())
        ran = loop.step()
        for _, reply in loop.take_replies():
            r = results[reply.request_id]
            if isinstance(reply, Audio):
                assert reply.start_sample == len(r.pcm) // 2, "audio is not contiguous"
                r.pcm += reply.pcm
            elif isinstance(reply, Done):
                r.done = reply
            elif isinstance(reply, Error):
                r.error = reply
        if not ran and not any(feeds.values()) and all(r.done is not None for r in results.values()):
            break
    assert all(r.done is not None for r in results.values()), "requests did not finish"
    frames = {rid: loop.executors.codes[slot, : results[rid].done.frames].clone() for rid, slot in code_slots.items()}
    return results, frames


def _workload(model: Qwen3TTS) -> tuple[list[Submit], list[tuple[Submit, list[AppendText]]]]:
    """Seven requests of different lengths: sampled and greedy, streaming and non-streaming layouts, three
    of them with their text streamed word by word."""
    complete = [submit(model, i + 1, SENTENCES[i], seed=30 + i, sampling=GREEDY if i == 1 else Sampling(),
                       layout=Layout.NON_STREAMING if i == 2 else Layout.STREAMING)
                for i in range(4)]  # fmt: skip
    streamed = [_streamed(model, 10 + i, SENTENCES[4 + i], seed=40 + i, sampling=GREEDY if i == 2 else Sampling())
                for i in range(3)]  # fmt: skip
    return complete, streamed


def _count_plans(loop: EngineLoop) -> dict[WorkKind, list[tuple[int, int]]]:
    """Record (rows, codec frames) of every plan the loop runs."""
    plans: dict[WorkKind, list[tuple[int, int]]] = {kind: [] for kind in WorkKind}
    launch = loop.executors.launch

    def counting(plan, inputs):  # type: ignore[no-untyped-def]
        plans[plan.kind].append((len(plan.rows), plan.codec_frames))
        return launch(plan, inputs)

    loop.executors.launch = counting  # type: ignore[method-assign]
    return plans


# ------------------------------------------------------------ same output as the plain executors


@pytest.mark.parametrize(("codec_layout", "codec_kernels"),
                         [("ncl", "fused"), ("channels-last", "fused"), ("channels-last", "fused-convs")])
def test_fast_path_on_publishes_the_plain_tokens_and_pcm_for_concurrent_streamed_requests(
        tiny_model: Qwen3TTS, fast_model: Qwen3TTS, codec_layout: str, codec_kernels: str) -> None:  # fmt: skip
    complete, streamed = _workload(tiny_model)
    plain_loop = make_loop(tiny_model)
    fast_loop = make_loop(fast_model, fast=ALL_FAST, codec_layout=codec_layout, codec_kernels=codec_kernels)
    ex = fast_loop.executors
    assert isinstance(ex.talker, TalkerGraphs) and isinstance(ex.code_predictor, CodePredictorGraphs)
    assert ex.codec.graphs is not None
    assert ex.codec.graphs.decoder.channels_last == (codec_layout == "channels-last")  # --codec-layout reached it
    assert ex.codec.graphs.decoder.triton_convs == (codec_kernels == "fused-convs")  # and --codec-kernels
    assert isinstance(plain_loop.executors.talker, TalkerExecutor) and plain_loop.executors.codec.graphs is None

    plain, plain_frames = _run(plain_loop, complete, streamed)
    fast, fast_frames = _run(fast_loop, complete, streamed)

    for rid, expected in plain.items():
        got = fast[rid]
        assert expected.error is None and expected.done.reason is DoneReason.COMPLETED
        assert got.error is None and got.done == expected.done, f"request {rid}: {got.done} != {expected.done}"
        assert torch.equal(fast_frames[rid], plain_frames[rid]), f"request {rid}: tokens differ"
        assert len(got.samples) == len(expected.samples) > 0
        diff = np.abs(got.samples.astype(np.int32) - expected.samples.astype(np.int32)).max()
        assert diff <= 1, f"request {rid}: PCM differs by {diff} LSB"
    lengths = {p.done.frames for p in plain.values()}
    assert len(lengths) >= 4, f"the workload should mix lengths: {lengths}"
    # The fast objects did the work, batched (eager static steps on a CPU, never a graph replay here).
    assert fast_loop.lifetime_max_batch[WorkKind.TALKER_DECODE] > 1
    assert fast_loop.lifetime_max_batch[WorkKind.CODEC_CHUNK] > 1
    assert ex.talker.decode_steps.eager_runs > 0 and ex.talker.prefill_steps.eager_runs > 0
    assert ex.code_predictor.steps.eager_runs > 0 and ex.codec.graphs.replays > 0
    assert ex.talker.decode_steps.replays == ex.code_predictor.steps.replays == 0
    # Newcomers' first chunks replayed the generation lane's own codec runner, later chunks the main one.
    assert ex.codec.first_graphs is not None and ex.codec.first_graphs.replays > 0
    assert ex.codec.pool.free_slots == ex.codec.pool.slots == 16  # the scratch rows are no stream's


def test_cohorts_larger_than_the_largest_capture_run_as_several_captured_steps(
        tiny_model: Qwen3TTS, fast_model: Qwen3TTS) -> None:  # fmt: skip
    # The scheduler plans batches of up to 16; the fast objects hold shapes of at most 2 rows and 2 frames.
    small = CaptureShapes(batch=(1, 2), prefill_batch=(1, 2), prefill_buckets=(32, 64, 128, 256, 512),
                          codec_batch=(1, 2), codec_frames=(1, 2))  # fmt: skip
    # A fixed chunk schedule (4, then 8 frames) so chunks exceed the captured counts whatever the timing.
    loop = make_loop(fast_model, fast=ALL_FAST, shapes=small, chunk_policy="fixed", fixed_chunks=(4, 8))
    ex = loop.executors
    keys: dict[str, list] = {"decode": [], "prefill": [], "predict": []}
    for name, steps in (("decode", ex.talker.decode_steps), ("prefill", ex.talker.prefill_steps),
                        ("predict", ex.code_predictor.steps)):  # fmt: skip
        steps.step = (lambda record, step: lambda key: (record.append(key), step(key)))(keys[name], steps.step)
    plans = _count_plans(loop)
    msgs = [submit(tiny_model, i + 1, SENTENCES[i], seed=60 + i) for i in range(5)]
    results, frames = _run(loop, msgs, [])

    def pieces(rows: int) -> int:
        return math.ceil(rows / 2)

    assert max(rows for rows, _ in plans[WorkKind.TALKER_DECODE]) > 2, "no cohort exceeded the captured sizes"
    assert max(rows for rows, _ in plans[WorkKind.CODEC_CHUNK]) > 2
    assert max(n for _, n in plans[WorkKind.CODEC_CHUNK]) > 2, "no chunk exceeded the captured frame counts"
    assert len(keys["decode"]) == sum(pieces(r) for r, _ in plans[WorkKind.TALKER_DECODE])
    assert len(keys["predict"]) == sum(pieces(r) for r, _ in plans[WorkKind.CODE_PREDICT])
    assert len(keys["prefill"]) == sum(pieces(r) for r, _ in plans[WorkKind.TALKER_PREFILL])
    assert set(keys["decode"]) <= {1, 2} and set(keys["predict"]) <= {1, 2}
    assert {size for size, _ in keys["prefill"]} <= {1, 2}
    # codec: row groups of <= 2, each chunk of N frames as N // 2 two-frame and N % 2 one-frame steps
    assert ex.codec.graphs.replays == sum(pieces(r) * (n // 2 + n % 2) for r, n in plans[WorkKind.CODEC_CHUNK])
    assert sorted(ex.codec.graphs.captured) == sorted(ex.codec.graphs.shapes)  # no other shape was built
    assert ex.talker.decode_steps.eager_runs == len(keys["decode"])  # every step counted; none outside them
    for msg in msgs:  # and the split cohorts still give each request what it gets alone
        codes, pcm = reference(tiny_model, msg)
        assert torch.equal(frames[msg.request_id], codes)
        assert np.abs(results[msg.request_id].samples.astype(np.int32) - pcm).max() <= 1


# ------------------------------------------------------------ refused at Submit


def _reply(loop: EngineLoop, msg: Submit) -> list:
    loop.handle(LINK, msg, loop.clock())
    return [m for _, m in loop.take_replies()]


@pytest.mark.parametrize("field", ["top_k", "subtalker_top_k"])
def test_a_submit_with_top_k_above_the_fast_path_cap_is_refused_with_a_clear_error(
        tiny_model: Qwen3TTS, fast_model: Qwen3TTS, field: str) -> None:  # fmt: skip
    loop = make_loop(fast_model, fast=ALL_FAST, kv_slots=4, max_batch=4)
    wide = Sampling(**{field: DEFAULT_TOP_K_CAP + 1})
    replies = _reply(loop, submit(tiny_model, 1, "Hello.", sampling=wide))
    assert [type(m) for m in replies] == [Error, Done] and replies[1].reason is DoneReason.ERROR
    assert replies[0].code == "bad_request"
    assert f"sampling.{field} {DEFAULT_TOP_K_CAP + 1} is above the fast path's top-k cap of {DEFAULT_TOP_K_CAP}" in (
        replies[0].message), replies[0].message
    # At the cap, and 0 (no top-k), are served; the plain executors take any top-k.
    assert _reply(loop, submit(tiny_model, 2, "Hello.", sampling=Sampling(**{field: DEFAULT_TOP_K_CAP}))) == []
    assert _reply(loop, submit(tiny_model, 3, "Hello.", sampling=Sampling(**{field: 0}))) == []
    assert _reply(make_loop(tiny_model, kv_slots=4, max_batch=4), submit(tiny_model, 1, "Hello.", sampling=wide)) == []


def test_only_the_fast_modules_check_their_top_k(tiny_model: Qwen3TTS, fast_model: Qwen3TTS) -> None:
    loop = make_loop(fast_model, fast=FastPath(code_predictor=True, codec=True), kv_slots=4, max_batch=4)
    assert _reply(loop, submit(tiny_model, 1, "Hi.", sampling=Sampling(top_k=200))) == []  # plain talker
    replies = _reply(loop, submit(tiny_model, 2, "Hi.", sampling=Sampling(subtalker_top_k=200)))
    assert replies and "subtalker_top_k" in replies[0].message


# ------------------------------------------------------------ settings


def test_fast_path_setting_resolves_per_device() -> None:
    s = EngineSettings(model="tiny", socket="@x")
    assert s.fast_path == "auto" and s.codec_precision == "auto"
    assert s.codec_precision_for("cuda") == "bf16" and s.codec_precision_for("cpu") == "tf32"
    assert s.fast_path_for(device_kind="cpu", have_triton=True) == FastPath()  # CPU default unchanged
    assert s.fast_path_for(device_kind="cuda", have_triton=False) == FastPath()
    assert s.fast_path_for(device_kind="cuda", have_triton=True) == ALL_FAST
    assert s.costs_path(ALL_FAST).name == "h200_fast.json" and s.costs_path(FastPath()).name == "h200_plain.json"
    on = parse_args(["--model", "tiny", "--socket", "@x", "--fast-path", "on", "--codec-precision", "bf16"])
    assert on.fast_path_for(device_kind="cpu", have_triton=False) == ALL_FAST and on.codec_precision_for("cpu") == "bf16"
    off = parse_args(["--model", "tiny", "--socket", "@x", "--fast-path", "off"])
    assert off.fast_path_for(device_kind="cuda", have_triton=True) == FastPath()
    with pytest.raises(ValueError, match="fast_path must be one of auto, on, off"):
        EngineSettings(model="tiny", socket="@x", fast_path="yes")
    with pytest.raises(ValueError, match="codec_precision must be one of auto, bf16, tf32, fp32"):
        EngineSettings(model="tiny", socket="@x", codec_precision="fp16")
    # Codec graphs need a one-frame shape so any chunk splits into captured ones.
    assert EngineSettings(model="tiny", socket="@x", codec_chunk_sizes=(2, 4)).capture_shapes.codec_frames == (1, 2, 4)


def test_batches_are_captured_up_to_128_streams_but_never_past_the_kv_slots() -> None:
    default = EngineSettings(model="tiny", socket="@x")
    assert default.kv_slots == 128 and default.capture_shapes.batch == (1, 2, 4, 8, 16, 32, 64, 128)
    small = EngineSettings(model="tiny", socket="@x", kv_slots=24)
    assert small.capture_shapes.batch == (1, 2, 4, 8, 16, 24)  # a batch of 128 could never fill
    first = default.capture_shapes
    assert first.first_chunk_batch == (1, 2, 4, 8) and first.first_chunk_frames == (1, 2)
    assert EngineSettings(model="tiny", socket="@x", first_chunk_lane=False).capture_shapes.first_chunk_batch == ()


def _first_frame(executors: Executors, predictor: CodePredictorGraphs) -> torch.Tensor:
    """Two greedy rows' first frame of codes from a fixed hidden state and code 0, through `predictor`."""
    executors.generation.hidden.normal_(generator=torch.Generator().manual_seed(5))
    executors.generation.code0.fill_(3)
    for slot in range(2):
        executors.generation.start(slot, GREEDY, seed=9 + slot)
    predictor.capture()
    predictor.predict([0, 1], [0, 1], [0, 0])
    return executors.codes[:2, 0].clone()


def test_cp_pdl_reaches_the_fused_frame_and_leaves_its_results_unchanged(fast_model: Qwen3TTS) -> None:
    settings = parse_args(["--model", "tiny", "--socket", "@x", "--no-cp-pdl"])
    assert not settings.cp_pdl and EngineSettings(model="tiny", socket="@x").cp_pdl  # on unless turned off
    shapes = CaptureShapes(batch=(1, 2), prefill_batch=(1,), prefill_buckets=(16,), codec_batch=(1,),
                           codec_frames=(1,))  # fmt: skip
    frames = {}
    for pdl in (False, True):
        executors = Executors(fast_model, kv_slots=2, streams=2, max_context=64, max_frames=8, max_batch=2,
                              silence=settings.silence_config(), fast=FastPath(code_predictor=True), shapes=shapes,
                              kernels=KernelOptions(cp_pdl=pdl))  # fmt: skip
        predictor = executors.code_predictor
        assert isinstance(predictor, CodePredictorGraphs) and predictor.kernels.pdl is pdl
        frames[pdl] = _first_frame(executors, predictor)
    assert torch.equal(frames[True], frames[False])


def test_the_talker_kernel_options_reach_the_fast_talker(fast_model: Qwen3TTS) -> None:
    settings = parse_args(["--model", "tiny", "--socket", "@x", "--talker-gemv-rows", "1"])
    assert settings.talker_gemv_rows == 1 and EngineSettings(model="tiny", socket="@x").talker_gemv_rows == 2
    with pytest.raises(SystemExit):  # only the 1-2 row steps the tiles were chosen for
        parse_args(["--model", "tiny", "--socket", "@x", "--talker-gemv-rows", "8"])
    shapes = CaptureShapes(batch=(1, 2), prefill_batch=(1,), prefill_buckets=(16,), codec_batch=(1,),
                           codec_frames=(1,))  # fmt: skip
    executors = Executors(fast_model, kv_slots=2, streams=2, max_context=64, max_frames=8, max_batch=2,
                          silence=settings.silence_config(), fast=FastPath(talker=True), shapes=shapes,
                          kernels=settings.kernel_options)  # fmt: skip
    assert isinstance(executors.talker, TalkerGraphs) and executors.talker.gemv_max_rows == 1
    assert executors.talker.fused_rope and EngineSettings(model="tiny", socket="@x").talker_fused_rope
    rope = parse_args(["--model", "tiny", "--socket", "@x", "--no-talker-fused-rope", "--talker-chain", "off"])
    executors = Executors(fast_model, kv_slots=2, streams=2, max_context=64, max_frames=8, max_batch=2,
                          silence=rope.silence_config(), fast=FastPath(talker=True), shapes=shapes,
                          kernels=rope.kernel_options)  # fmt: skip
    assert isinstance(executors.talker, TalkerGraphs) and not executors.talker.fused_rope
    assert executors.talker.fused_draw and EngineSettings(model="tiny", socket="@x").talker_fused_draw
    draw = parse_args(["--model", "tiny", "--socket", "@x", "--no-talker-fused-draw"])
    executors = Executors(fast_model, kv_slots=2, streams=2, max_context=64, max_frames=8, max_batch=2,
                          silence=draw.silence_config(), fast=FastPath(talker=True), shapes=shapes,
                          kernels=draw.kernel_options)  # fmt: skip
    assert isinstance(executors.talker, TalkerGraphs) and not executors.talker.fused_draw


def test_executors_default_to_the_engines_kernel_options(fast_model: Qwen3TTS) -> None:
    """`Executors` built without kernel options runs the fast paths as the engine serves them by default (one place
    for those defaults: `KernelOptions`), so a GPU check or test measures what users get."""
    shapes = CaptureShapes(batch=(1, 2), prefill_batch=(1,), prefill_buckets=(16,), codec_batch=(1,),
                           codec_frames=(1,))  # fmt: skip
    settings = EngineSettings(model="tiny", socket="@x")
    assert settings.kernel_options == KernelOptions()
    executors = Executors(fast_model, kv_slots=2, streams=2, max_context=64, max_frames=8, max_batch=2,
                          silence=settings.silence_config(), fast=FastPath(talker=True, code_predictor=True),
                          shapes=shapes)  # fmt: skip
    talker, predictor = executors.talker, executors.code_predictor
    assert isinstance(talker, TalkerGraphs) and isinstance(predictor, CodePredictorGraphs)
    assert (talker.gemv_max_rows, talker.fused_rope, talker.chain_rows) == (settings.talker_gemv_rows, True, CHAIN_ROWS)
    assert predictor.kernels == FrameKernels.from_options(settings.kernel_options)
    assert predictor.kernels.fused and predictor.kernels.pdl


def test_the_kernel_options_reach_the_fast_paths_and_leave_their_results_unchanged(fast_model: Qwen3TTS) -> None:
    """--cp-split-k and --talker-chain reach the code predictor's `FrameKernels` (split-K on projection, o and down
    only) and the talker's chain rows; by default the code predictor's 64-program products run in 4 K slices and the
    talker's 16-64 row steps as a chain (measured on the H200); on the CPU every kernel runs its twin, so the frame's
    codes are the same whatever the options."""
    defaults = EngineSettings(model="tiny", socket="@x")
    assert (defaults.cp_split_k, defaults.talker_chain) == (4, "on")
    plain = parse_args(["--model", "tiny", "--socket", "@x", "--cp-split-k", "1", "--talker-chain", "off"])
    on = parse_args(["--model", "tiny", "--socket", "@x", "--cp-split-k", "2"])
    shapes = CaptureShapes(batch=(1, 2), prefill_batch=(1,), prefill_buckets=(16,), codec_batch=(1,),
                           codec_frames=(1,))  # fmt: skip
    frames = []
    for settings in (defaults, plain, on):
        executors = Executors(fast_model, kv_slots=2, streams=2, max_context=64, max_frames=8, max_batch=2,
                              silence=settings.silence_config(), fast=FastPath(talker=True, code_predictor=True),
                              shapes=shapes, kernels=settings.kernel_options)  # fmt: skip
        talker, predictor = executors.talker, executors.code_predictor
        assert isinstance(talker, TalkerGraphs) and isinstance(predictor, CodePredictorGraphs)
        kernels = predictor.kernels
        for tiles in kernels.dot_gemv.values():
            assert {name: tile.split_k for name, tile in tiles.items()} == {
                "proj": settings.cp_split_k, "qkv": 1, "o": settings.cp_split_k, "gate_up": 1,
                "down": settings.cp_split_k, "head": 1}  # fmt: skip
        assert talker.chain_rows == (CHAIN_ROWS if settings.talker_chain != "off" else ())
        frames.append(_first_frame(executors, predictor))
    assert all(torch.equal(frames[0], frame) for frame in frames[1:])
    for bad in ({"talker_chain": "on", "talker_fused_rope": False}, {"cp_split_k": 3}, {"talker_chain": "stream"},
                {"talker_gemv_rows": 8}, {"cp_kernels": "persistent"}):  # fmt: skip
        with pytest.raises(ValueError, match="talker_chain|split_k|talker_gemv_rows|cp_kernels"):
            EngineSettings(model="tiny", socket="@x", **bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="talker_chain|split_k|talker_gemv_rows|cp_kernels"):
            KernelOptions(**bad)  # type: ignore[arg-type]


def test_capture_logs_how_long_each_fast_path_took(fast_model: Qwen3TTS, caplog: pytest.LogCaptureFixture) -> None:
    """The engine's time to ready is nearly all capture: the log says which fast path took it."""
    shapes = CaptureShapes(batch=(1,), prefill_batch=(1,), prefill_buckets=(16,), codec_batch=(1,),
                           codec_frames=(1,))  # fmt: skip
    executors = Executors(fast_model, kv_slots=2, streams=2, max_context=64, max_frames=8, max_batch=2,
                          silence=EngineSettings(model="tiny", socket="@x").silence_config(),
                          fast=FastPath(talker=True, code_predictor=True), shapes=shapes)  # fmt: skip
    with caplog.at_level(logging.INFO, logger="engine"):
        executors.capture()
    assert re.search(r"captured talker in \d+\.\d s, code predictor in \d+\.\d s, codec in \d+\.\d s$", caplog.text.strip()), caplog.text


def test_codec_precision_must_match_the_loaded_codec(tiny_model: Qwen3TTS) -> None:
    with pytest.raises(ValueError, match="needs the codec loaded in torch.bfloat16"):
        Executors(tiny_model, kv_slots=2, streams=2, max_context=128, max_frames=16, max_batch=2,
                  silence=EngineSettings(model="tiny", socket="@x").silence_config(), codec_precision="bf16")
    with pytest.raises(ValueError, match="capture shapes"):
        Executors(tiny_model, kv_slots=2, streams=2, max_context=128, max_frames=16, max_batch=2,
                  silence=EngineSettings(model="tiny", socket="@x").silence_config(), fast=ALL_FAST)


# ------------------------------------------------------------ the real process


@pytest.fixture
def fast_engine() -> Iterator[str]:
    path = f"@vivace-fast-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    args = ("--model", "tiny", "--device", "cpu", "--fast-path", "on", "--kv-slots", "6", "--max-batch", "4",
            "--codec-max-batch", "4", "--heartbeat-s", "0.2")  # fmt: skip
    proc = spawn_engine(engine_command("engine", *args), path, env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        wait_for_socket(path, timeout_s=120, proc=proc)
        yield path
    finally:
        stop_engine(proc, timeout_s=10)


async def _collect(link: EngineLink, msg: Submit, words: list[AppendText]) -> tuple[bytes, Done | None, Error | None]:
    queue = link.subscribe(msg.request_id)
    link.send(msg)
    for word in words:
        link.send(word)
    if words:
        link.send(EndText(msg.request_id))
    pcm, error = bytearray(), None
    while True:
        reply = await queue.get()
        if isinstance(reply, Audio):
            pcm += reply.pcm
        elif isinstance(reply, Error):
            error = reply
        elif isinstance(reply, Done):
            return bytes(pcm), reply, error


async def _idle_beat(beats: list[Heartbeat], after: int, timeout_s: float = 10.0) -> Heartbeat:
    """The first heartbeat from index `after` on with no request and every slot and codec state free."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        for beat in beats[after:]:
            if beat.active_requests == 0 and all(beat.step_stats[k][0] == beat.step_stats[k][1]
                                                 for k in ("slots.kv", "slots.codec", "slots.codec_state")):
                return beat
        await asyncio.sleep(0.05)
    raise AssertionError(f"no idle heartbeat with every slot free: {beats[-1:]}")


async def test_the_engine_process_with_fast_path_on_serves_and_frees_every_slot(
        fast_engine: str, tiny_model: Qwen3TTS) -> None:  # fmt: skip
    link = await EngineLink.connect(fast_engine)
    await asyncio.wait_for(link.ready.wait(), 10)
    beats: list[Heartbeat] = []
    link.on_engine_message(lambda m: beats.append(m) if isinstance(m, Heartbeat) else None)
    complete = [submit(tiny_model, i + 1, SENTENCES[i], seed=70 + i) for i in range(5)]
    head, words = _streamed(tiny_model, 9, SENTENCES[5], seed=79)
    jobs = [_collect(link, m, []) for m in complete] + [_collect(link, head, words)]
    results = await asyncio.wait_for(asyncio.gather(*jobs), 120)
    finished_at = len(beats)
    for msg, (pcm, done, error) in zip(complete, results[:-1], strict=True):
        assert error is None and done is not None and done.reason is DoneReason.COMPLETED
        assert done.frames == length_model_frames(msg.text_chars)
        _, expected = reference(tiny_model, msg)
        got = np.frombuffer(pcm, dtype="<i2").astype(np.int32)
        assert len(got) == len(expected) and np.abs(got - expected).max() <= 1
    streamed_pcm, streamed_done, streamed_error = results[-1]
    assert streamed_error is None and streamed_done.reason is DoneReason.COMPLETED
    _, expected = reference(tiny_model, submit(tiny_model, 9, SENTENCES[5], seed=79))  # the same text, whole
    got = np.frombuffer(streamed_pcm, dtype="<i2").astype(np.int32)
    assert len(got) == len(expected) and np.abs(got - expected).max() <= 1
    beat = await _idle_beat(beats, finished_at)
    assert beat.step_stats["slots.codec_state"] == (6.0, 6.0)  # the codec graphs' scratch row is not counted
    await link.close()


def test_the_fast_paths_cost_table_follows_the_card() -> None:
    s = EngineSettings(model="tiny", socket="@x")
    assert s.costs_path(ALL_FAST, "NVIDIA H200").name == "h200_fast.json"
    assert s.costs_path(ALL_FAST, "NVIDIA GeForce RTX 4090").name == "h200_fast.json"  # no table of its own
    assert s.costs_path(FastPath(), "NVIDIA H200").name == "h200_plain.json"
    assert EngineSettings(model="tiny", socket="@x", costs="my.json").costs_path(ALL_FAST, "NVIDIA H200") == Path("my.json")
