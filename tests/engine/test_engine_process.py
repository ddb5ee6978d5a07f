"""The real engine process (`python -m engine --model tiny --device cpu`) driven through the shared-memory
link, as a gateway worker drives it: concurrency, input streaming, cancellation, resource accounting,
a dead link, SIGTERM draining, and a crash seen from the client side."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from engine.ipc.client import EngineLink
from engine.ipc.messages import (
    AppendText,
    Audio,
    Cancel,
    Done,
    DoneReason,
    EndText,
    Error,
    Heartbeat,
    Outbound,
    Submit,
)
from engine.ipc.process import engine_command, spawn_engine, stop_engine, wait_for_socket
from engine.model.qwen3_tts import Qwen3TTS
from engine.request import SAMPLES_PER_FRAME, length_model_frames
from engine.scheduling import SchedulerConfig
from tests.engine.helpers import SENTENCES, reference, submit

REPO = Path(__file__).resolve().parents[2]
ENGINE_ARGS = ("--model", "tiny", "--device", "cpu", "--kv-slots", "24", "--max-batch", "32",
               "--heartbeat-s", "0.2", "--shutdown-grace-ms", "3000")
LONG_TEXT = "This sentence is long enough that it is still being spoken when the cancel arrives."


def _start_engine() -> tuple[subprocess.Popen, str]:
    path = f"@vivace-engine-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    proc = spawn_engine(engine_command("engine", *ENGINE_ARGS), path, env=dict(os.environ, PYTHONPATH=str(REPO)))
    wait_for_socket(path, timeout_s=120, proc=proc)
    return proc, path


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[subprocess.Popen, str]]:
    """One engine process shared by the module; its last test shuts it down with SIGTERM."""
    proc, path = _start_engine()
    yield proc, path
    stop_engine(proc, timeout_s=10)


@dataclass
class Received:
    audio: list[Audio] = field(default_factory=list)
    done: Done | None = None
    error: Error | None = None

    @property
    def pcm(self) -> np.ndarray:
        return np.frombuffer(b"".join(a.pcm for a in self.audio), dtype="<i2")

    def check_contiguous(self) -> None:
        start = 0
        for i, audio in enumerate(self.audio):
            assert audio.start_sample == start and audio.first == (i == 0)
            start += len(audio.pcm) // 2


class Client:
    """One gateway worker's link plus every Heartbeat it saw."""

    def __init__(self, link: EngineLink) -> None:
        self.link = link
        self.beats: list[Heartbeat] = []
        link.on_engine_message(lambda msg: self.beats.append(msg) if isinstance(msg, Heartbeat) else None)

    @classmethod
    async def connect(cls, path: str) -> Client:
        client = cls(await EngineLink.connect(path))
        await asyncio.wait_for(client.link.ready.wait(), 10)
        return client

    async def run(self, msg: Submit, *, words: list[tuple[tuple[int, ...], int]] = (), cancel_after_audio: bool = False,
                  on_first_audio: asyncio.Event | None = None) -> Received:
        """Send `msg` (then `words` one by one, then EndText) and collect its replies until Done or Error."""
        queue = self.link.subscribe(msg.request_id)
        self.link.send(msg)
        streamer = asyncio.create_task(self._stream(msg.request_id, words)) if words else None
        received = Received()
        while True:
            reply: Outbound = await queue.get()
            if isinstance(reply, Audio):
                received.audio.append(reply)
                if on_first_audio is not None:
                    on_first_audio.set()
                if cancel_after_audio and len(received.audio) == 1:
                    self.link.send(Cancel(msg.request_id))
            elif isinstance(reply, Error):
                received.error = reply
                if reply.code in ("engine_died", "engine_shutdown", "link_closed"):
                    break  # the link itself failed the request: no Done follows
            elif isinstance(reply, Done):
                received.done = reply
                break
        if streamer is not None:
            streamer.cancel()
        return received

    async def _stream(self, request_id: int, words: list[tuple[tuple[int, ...], int]]) -> None:
        for ids, chars in words:
            await asyncio.sleep(0.03)  # an LLM emitting a word every 30 ms
            self.link.send(AppendText(request_id, ids, chars))
        self.link.send(EndText(request_id))

    async def wait_until_idle(self, timeout_s: float = 10.0) -> Heartbeat:
        """The first heartbeat (after now) reporting no request and every slot and codec state free."""
        seen = len(self.beats)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for beat in self.beats[seen:]:
                stats = beat.step_stats
                if beat.active_requests == 0 and all(stats[k][0] == stats[k][1] for k in
                                                     ("slots.kv", "slots.codec", "slots.codec_state")):
                    return beat
            seen = len(self.beats)
            await asyncio.sleep(0.05)
        raise AssertionError(f"the engine did not become idle with every slot free: {self.beats[-1:]}")


def _word_pieces(msg: Submit, text: str) -> tuple[Submit, list[tuple[tuple[int, ...], int]]]:
    """Split a complete Submit into its first word plus one AppendText per following word (byte ids)."""
    words = text.split(" ")
    pieces, index = [], 0
    for i, word in enumerate(words):
        chunk = word if i == 0 else " " + word
        n = len(chunk.encode())  # the tiny model's fallback tokenizer: one id per byte
        pieces.append((msg.text_ids[index:index + n], len(chunk)))
        index += n
    assert index == len(msg.text_ids)
    first_ids, first_chars = pieces[0]
    head = Submit(msg.request_id, msg.speaker, msg.language, first_ids, first_chars, False, seed=msg.seed)
    return head, pieces[1:]


async def test_twenty_concurrent_requests_stream_and_cancel_then_every_slot_is_free(engine, tiny_model: Qwen3TTS) -> None:
    _, path = engine
    client = await Client.connect(path)
    jobs, plans = [], {}
    for i in range(20):
        rid = i + 1
        if i % 3 == 0:  # cancelled after its first audio
            plans[rid] = "cancel"
            jobs.append(client.run(submit(tiny_model, rid, LONG_TEXT, seed=rid), cancel_after_audio=True))
        elif i % 3 == 1:  # text streamed word by word
            plans[rid] = "stream"
            text = SENTENCES[i % len(SENTENCES)]
            head, words = _word_pieces(submit(tiny_model, rid, text, seed=rid), text)
            jobs.append(client.run(head, words=words))
        else:
            plans[rid] = "complete"
            jobs.append(client.run(submit(tiny_model, rid, SENTENCES[i % len(SENTENCES)], seed=rid)))
    results = dict(zip(plans, await asyncio.wait_for(asyncio.gather(*jobs), 150), strict=True))

    for rid, received in results.items():
        assert received.done is not None, f"request {rid} ({plans[rid]}) got no Done: {received.error}"
        received.check_contiguous()
        assert received.done.samples == len(received.pcm)
        if plans[rid] == "cancel":
            assert received.done.reason is DoneReason.CANCELLED and received.error is None
            assert received.done.frames < length_model_frames(len(LONG_TEXT))
            continue
        chars = len(SENTENCES[(rid - 1) % len(SENTENCES)])
        assert received.error is None and received.done.reason is DoneReason.COMPLETED
        assert received.done.frames == length_model_frames(chars)
        # Random audio has no leading silence to trim: every generated frame is published.
        assert received.done.samples == received.done.frames * SAMPLES_PER_FRAME

    # Batched equals alone: a few requests (streamed and complete) against the reference loop run alone.
    for rid in (2, 3, 5, 6):
        msg = submit(tiny_model, rid, SENTENCES[(rid - 1) % len(SENTENCES)], seed=rid)
        _, pcm = reference(tiny_model, msg)
        assert np.abs(results[rid].pcm.astype(np.int32) - pcm).max() <= 1, f"request {rid} differs from alone"

    beat = await client.wait_until_idle()
    assert beat.queued_requests == 0
    assert any(b.step_stats.get("talker_decode", (0, 0))[0] > 1 for b in client.beats), "no batch > 1 ran"
    # Admission's measures, each beside its limit: nothing generates once idle; under load it saw the streams.
    limits = SchedulerConfig()
    assert beat.step_stats["admission.utilization"] == (0.0, limits.max_utilization)
    pressure, limit = beat.step_stats["admission.pressure"]
    assert 0.0 <= pressure <= 1.0 and limit == limits.max_pressure
    assert max(b.step_stats["admission.utilization"][0] for b in client.beats) > 0.0
    await client.link.close()


async def test_a_dead_link_cancels_its_requests_and_frees_their_slots(engine, tiny_model: Qwen3TTS) -> None:
    _, path = engine
    observer, doomed = await Client.connect(path), await Client.connect(path)
    started = [asyncio.Event() for _ in range(4)]
    tasks = [asyncio.create_task(doomed.run(submit(tiny_model, i + 1, LONG_TEXT, seed=i), on_first_audio=started[i]))
             for i in range(4)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
    await doomed.link.close()  # the gateway worker goes away mid-stream
    for task in tasks:
        received = await asyncio.wait_for(task, 5)
        assert received.error is not None and received.error.code == "link_closed"
    await observer.wait_until_idle()
    # The engine still serves: a new request on the surviving link completes.
    received = await observer.run(submit(tiny_model, 9, "Still here.", seed=9))
    assert received.done is not None and received.done.reason is DoneReason.COMPLETED
    await observer.link.close()


async def test_sigterm_finishes_running_requests_then_exits_zero(engine, tiny_model: Qwen3TTS) -> None:
    proc, path = engine
    client = await Client.connect(path)
    started = asyncio.Event()
    complete = [asyncio.create_task(client.run(submit(tiny_model, i + 1, SENTENCES[i], seed=i), on_first_audio=started))
                for i in range(3)]
    never_ends = submit(tiny_model, 10, "An open", seed=10)
    open_task = asyncio.create_task(client.run(Submit(10, "ryan", "english", never_ends.text_ids, 7, False)))
    await asyncio.wait_for(started.wait(), 60)
    sent_at = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.2)
    refused = await client.run(submit(tiny_model, 20, "Too late.", seed=20))
    assert refused.error is not None and refused.error.code == "shutting_down"

    for i, task in enumerate(complete):
        received = await asyncio.wait_for(task, 10)
        assert received.done is not None and received.done.reason is DoneReason.COMPLETED
        assert received.done.frames == length_model_frames(len(SENTENCES[i]))
    open_received = await asyncio.wait_for(open_task, 10)
    assert open_received.error is not None and open_received.error.code == "shutdown"
    assert open_received.done is not None and open_received.done.reason is DoneReason.ERROR
    assert await asyncio.wait_for(client.link.closed, 5) == "engine_shutdown"
    assert await asyncio.to_thread(proc.wait, 10) == 0
    assert time.monotonic() - sent_at < 3.0 + 3.0  # the grace, plus the last step and the goodbye


async def test_killing_the_engine_fails_every_in_flight_request_within_a_second(tiny_model: Qwen3TTS) -> None:
    proc, path = await asyncio.to_thread(_start_engine)
    try:
        client = await Client.connect(path)
        started = [asyncio.Event() for _ in range(5)]
        tasks = [asyncio.create_task(client.run(submit(tiny_model, i + 1, LONG_TEXT, seed=i), on_first_audio=started[i]))
                 for i in range(5)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        results = await asyncio.wait_for(asyncio.gather(*tasks), 1.0)
        assert time.monotonic() - killed_at < 1.0
        for received in results:
            assert received.done is None and received.error is not None and received.error.code == "engine_died"
    finally:
        stop_engine(proc, timeout_s=5)
