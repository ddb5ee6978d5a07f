"""EngineLink against the fake engine process: the protocol a gateway sees, end to end, including the
engine dying mid-stream and an idle link costing no CPU."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest

from engine.ipc.client import EngineLink
from engine.ipc.fake_engine import SAMPLES_PER_FRAME, frames_for, tone_pcm
from engine.ipc.messages import (
    AppendText,
    Audio,
    Cancel,
    Done,
    DoneReason,
    EndText,
    Error,
    Flush,
    Heartbeat,
    Outbound,
    Shutdown,
    Submit,
)
from engine.ipc.process import spawn_engine, wait_for_socket, wait_for_socket_async
from tests.ipc.conftest import FakeEngineProcess
from tests.ipc.helpers import cpu_seconds, mapped_segments

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "while",
    "seven",
    "tired",
    "zebras",
    "quietly",
    "watch",
]


async def _connect(engine: FakeEngineProcess, *args: str) -> EngineLink:
    await engine.start(*args)
    link = await EngineLink.connect(engine.socket_path)
    await asyncio.wait_for(link.ready.wait(), 5)
    return link


async def _collect(queue: asyncio.Queue[Outbound], timeout_s: float = 20) -> list[Outbound]:
    """Every event of one request up to and including its terminal Done (or a link-made Error)."""
    events: list[Outbound] = []
    while True:
        msg = await asyncio.wait_for(queue.get(), timeout_s)
        events.append(msg)
        if isinstance(msg, Done) or (isinstance(msg, Error) and msg.code == "engine_died"):
            return events


def _audio_of(events: list[Outbound]) -> bytes:
    chunks = [e for e in events if isinstance(e, Audio)]
    assert [c.first for c in chunks] == [True] + [False] * (len(chunks) - 1)
    position = 0
    for chunk in chunks:  # contiguous on the request's timeline
        assert chunk.start_sample == position
        position += len(chunk.pcm) // 2
    return b"".join(c.pcm for c in chunks)


async def test_twenty_concurrent_requests_some_streamed_some_cancelled_all_end_properly(
    fake_engine: FakeEngineProcess, no_shm_leftovers: None
) -> None:
    link = await _connect(fake_engine, "--delay-ms", "5", "--ms-per-frame", "1")
    first_audio_at: dict[int, float] = {}
    end_sent_at: dict[int, float] = {}

    async def whole_text(rid: int) -> list[Outbound]:
        text = " ".join(WORDS[: 3 + rid % 10])
        queue = link.subscribe(rid)
        link.send(Submit(rid, "ryan", "english", tuple(range(len(text))), len(text), True))
        return await _collect(queue)

    async def streamed(rid: int) -> list[Outbound]:
        queue = link.subscribe(rid)
        words = WORDS[: 6 + rid % 6]

        async def collect() -> list[Outbound]:
            events: list[Outbound] = []
            while not events or not isinstance(events[-1], Done):
                events.append(await asyncio.wait_for(queue.get(), 20))
                if isinstance(events[-1], Audio) and events[-1].first:
                    first_audio_at[rid] = time.monotonic()
            return events

        collector = asyncio.create_task(collect())
        link.send(Submit(rid, "ryan", "english", (1,), len(words[0]), False))
        for word in words[1:]:
            await asyncio.sleep(0.03)  # an LLM producing words
            link.send(AppendText(rid, (2,), len(word) + 1))
        end_sent_at[rid] = time.monotonic()
        link.send(EndText(rid))
        return await collector

    async def cancelled(rid: int) -> list[Outbound]:
        queue = link.subscribe(rid)
        link.send(Submit(rid, "ryan", "english", (1,), 2000, True))  # ~2.2 s of frames at 1 ms each
        events = [await asyncio.wait_for(queue.get(), 5)]
        link.send(Cancel(rid))
        return events + await _collect(queue)

    kinds = {rid: (whole_text, streamed, cancelled, whole_text)[rid % 4] for rid in range(1, 21)}
    results = await asyncio.gather(*(kinds[rid](rid) for rid in kinds))

    for rid, events in zip(kinds, results, strict=True):
        done = events[-1]
        assert isinstance(done, Done), (rid, done)
        pcm = _audio_of(events)
        if kinds[rid] is cancelled:
            assert done.reason == DoneReason.CANCELLED
            assert 0 < len(pcm) // 2 < frames_for(2000, text_ended=True) * SAMPLES_PER_FRAME
        else:
            assert done.reason == DoneReason.COMPLETED
            assert done.samples == done.frames * SAMPLES_PER_FRAME == len(pcm) // 2
            assert pcm == tone_pcm(0, done.samples)  # byte-exact through both rings
    for rid in end_sent_at:
        assert rid in first_audio_at and first_audio_at[rid] < end_sent_at[rid], (
            "audio must start before text ends"
        )
    for rid in end_sent_at:  # the streamed text's length decides the audio length
        text = " ".join(WORDS[: 6 + rid % 6])
        assert results[rid - 1][-1].frames == frames_for(len(text), text_ended=True)
    assert link.subscriptions == 0
    await link.close()


async def test_engine_killed_mid_stream_fails_every_request_with_engine_died_within_1s(
    fake_engine: FakeEngineProcess, no_shm_leftovers: None
) -> None:
    link = await _connect(fake_engine, "--ms-per-frame", "20")
    queues = {rid: link.subscribe(rid) for rid in range(1, 21)}
    for rid in queues:
        link.send(Submit(rid, "ryan", "english", (1,), 500, True))
    for queue in queues.values():
        assert isinstance(await asyncio.wait_for(queue.get(), 5), Audio)  # every request is mid-stream
    assert fake_engine.proc is not None
    assert len(mapped_segments(fake_engine.proc.pid)) == 1

    fake_engine.proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    endings = await asyncio.gather(*(_collect(q, timeout_s=1.0) for q in queues.values()))
    elapsed = time.monotonic() - killed
    assert elapsed < 1.0
    assert all(isinstance(e[-1], Error) and e[-1].code == "engine_died" for e in endings)
    assert link.closed.result() == "engine_died" and not link.ready.is_set()
    fake_engine.proc.wait(5)
    assert mapped_segments() == []


async def test_idle_gateway_and_idle_engine_do_not_spin(fake_engine: FakeEngineProcess) -> None:
    link = await _connect(fake_engine)
    beats: list[Outbound] = []
    link.on_engine_message(beats.append)
    assert fake_engine.proc is not None
    engine_before, gateway_before = cpu_seconds(fake_engine.proc.pid), time.process_time()
    await asyncio.sleep(1.2)
    gateway_cpu = time.process_time() - gateway_before
    engine_cpu = cpu_seconds(fake_engine.proc.pid) - engine_before
    assert any(isinstance(b, Heartbeat) for b in beats)  # the link was alive and delivering meanwhile
    assert gateway_cpu < 0.03, f"idle gateway used {gateway_cpu:.3f} s of CPU in 1.2 s"
    assert engine_cpu < 0.05, f"idle engine used {engine_cpu:.3f} s of CPU in 1.2 s"
    await link.close()


async def test_heartbeats_report_the_frame_time_of_the_requests_generating_and_nothing_when_idle(
    fake_engine: FakeEngineProcess,
) -> None:
    link = await _connect(fake_engine, "--ms-per-frame=10", "--heartbeat-s=0.05")
    beats: list[Heartbeat] = []
    link.on_engine_message(lambda msg: beats.append(msg) if isinstance(msg, Heartbeat) else None)
    queues = [link.subscribe(rid) for rid in (1, 2)]
    for rid in (1, 2):  # 56 chars: 50 frames, 0.5 s at 10 ms per frame
        link.send(Submit(rid, "ryan", "english", (1,), 56, True))
    await asyncio.gather(*(_collect(q) for q in queues))
    busy = [b.step_stats["talker_decode"] for b in beats if b.step_stats]
    assert busy and max(busy) == (2.0, 10.0) and all(ms == 10.0 for _, ms in busy)
    count = len(beats)
    while len(beats) < count + 2:
        await asyncio.sleep(0.05)
    assert beats[-1].step_stats == {} and beats[-1].active_requests == 0
    await link.close()


async def test_text_not_yet_sent_is_waited_for_and_flush_publishes_a_partial_chunk(
    fake_engine: FakeEngineProcess,
) -> None:
    link = await _connect(fake_engine)
    queue = link.subscribe(1)
    link.send(Submit(1, "ryan", "english", (1,), 4, False))  # 4 chars pay for floor(3.57) = 3 frames
    first = await asyncio.wait_for(queue.get(), 5)
    assert isinstance(first, Audio) and len(first.pcm) == 2 * 2 * SAMPLES_PER_FRAME  # first chunk: 2 frames
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(queue.get(), 0.2)  # 1 frame pending < 4-frame chunk, and no more text
    link.send(Flush(1))
    flushed = await asyncio.wait_for(queue.get(), 5)
    assert isinstance(flushed, Audio) and flushed.start_sample == 2 * SAMPLES_PER_FRAME
    assert len(flushed.pcm) == 2 * SAMPLES_PER_FRAME
    link.send(EndText(1))
    events = await _collect(queue)
    assert events[-1] == Done(1, DoneReason.COMPLETED, 4 * SAMPLES_PER_FRAME, 4)  # ceil(3.57) = 4 frames
    await link.close()


async def test_bad_requests_get_an_error_and_a_done(fake_engine: FakeEngineProcess) -> None:
    link = await _connect(fake_engine)
    queue = link.subscribe(7)
    link.send(AppendText(7, (1,), 3))
    error, done = await asyncio.wait_for(queue.get(), 5), await asyncio.wait_for(queue.get(), 5)
    assert isinstance(error, Error) and error.code == "bad_request" and "unknown request" in error.message
    assert done == Done(7, DoneReason.ERROR, 0, 0)
    await link.close()


async def test_shutdown_finishes_running_work_refuses_new_work_and_exits_cleanly(
    fake_engine: FakeEngineProcess, no_shm_leftovers: None
) -> None:
    link = await _connect(fake_engine, "--ms-per-frame", "2")
    running, late = link.subscribe(1), link.subscribe(2)
    link.send(Submit(1, "ryan", "english", (1,), 56, True))  # 50 frames, ~0.1 s
    link.send(Shutdown(grace_ms=3000))
    link.send(Submit(2, "ryan", "english", (1,), 10, True))
    assert (await _collect(running))[-1].reason == DoneReason.COMPLETED
    late_events = await _collect(late)
    assert late_events[0].code == "shutting_down" and late_events[-1].reason == DoneReason.ERROR
    assert await asyncio.wait_for(link.closed, 5) == "engine_shutdown"
    assert fake_engine.proc is not None and fake_engine.proc.wait(5) == 0


async def test_shutdown_fails_requests_that_outlive_the_grace_period(fake_engine: FakeEngineProcess) -> None:
    link = await _connect(fake_engine, "--ms-per-frame", "50")
    queue = link.subscribe(1)
    link.send(Submit(1, "ryan", "english", (1,), 5000, True))  # minutes of frames
    assert isinstance(await asyncio.wait_for(queue.get(), 5), Audio)
    assert fake_engine.proc is not None
    start = time.monotonic()
    link.send(Shutdown(grace_ms=200))
    events = await _collect(queue, timeout_s=5)
    assert [type(e) for e in events[-2:]] == [Error, Done] and events[-2].code == "shutdown"
    assert time.monotonic() - start < 2.0
    assert fake_engine.proc.wait(5) == 0


def test_wait_for_socket_reports_an_engine_that_exits_early(socket_path: str) -> None:
    proc = spawn_engine([sys.executable, "-c", "import sys; sys.exit(3)"], socket_path)
    with pytest.raises(RuntimeError, match="status 3"):
        wait_for_socket(socket_path, timeout_s=10, proc=proc)
    with pytest.raises(TimeoutError):
        wait_for_socket(socket_path, timeout_s=0.1)


async def test_sigterm_stops_an_idle_fake_engine_promptly(fake_engine: FakeEngineProcess) -> None:
    proc = await fake_engine.start()
    await wait_for_socket_async(fake_engine.socket_path, 5, proc)
    start = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(5) == 0
    assert time.monotonic() - start < 1.0  # the handler wakes the blocked poll; no 1 s heartbeat wait
