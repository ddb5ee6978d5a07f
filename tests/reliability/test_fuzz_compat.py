"""Property-based fuzzing of the compatible WebSockets: ElevenLabs stream-input and multi-stream-input, Cartesia.

For every generated sequence of valid and invalid messages (interleaved contexts, wrong types, unknown
fields, bad JSON, binary and oversized frames, limits hit), sent on a fresh socket of one long-lived
gateway (tiny model, small limits): the server stays up; every error has the vendor's error shape and a
code documented in docs/protocol.md (section 1.7 plus the protocol's own table); a close the server
chooses follows an error with that code; once the client ends its input every context ends (`isFinal`,
`done` or an error) within a bound and no context slot stays taken; and a native session streaming beside
the fuzzed socket finishes its audio. Bounded by `max_examples` and a per-test timeout.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close

from tests.gateway.helpers import REPO, GatewayProcess, expected_samples, speak, start_gateway

MAX_CONTEXTS = 3
MAX_MESSAGE_BYTES = 1024
MAX_TEXT_CHARS = 40
LIMITS = (
    f"--limit=max_contexts={MAX_CONTEXTS}",
    f"--limit=max_message_bytes={MAX_MESSAGE_BYTES}",
    f"--limit=max_text_chars={MAX_TEXT_CHARS}",
    "--limit=append_burst=10",  # long sequences hit the rate limit
    "--limit=appends_per_second=20",
)
ENDS_WITHIN_S = 30.0  # from the client's end of input to every context ended (tiny model, shared CPU)
ERROR_CLOSES = (1003, 1008, 1009)  # binary, policy (idle, slow reader), too big: docs/protocol.md 1.6
NEIGHBOUR_TEXT = "The neighbour keeps on streaming."
IDS = ("a", "b", "c", "d")
FUZZ_SETTINGS = settings(
    max_examples=8,
    deadline=None,  # each example is bounded by ENDS_WITHIN_S; the test by its timeout mark
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def documented_codes(marker: str) -> set[str]:
    """The codes of docs/protocol.md 1.7 plus those of the table that follows `marker`."""
    doc = (REPO / "docs" / "protocol.md").read_text()

    def first_column(table: str) -> set[str]:
        rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
        return set(re.findall(r"`([a-z_]+)`", "\n".join(rows)))

    native = doc[doc.index("### 1.7 Error codes") : doc.index("Close codes:")]
    own = doc[doc.index(marker) :].split("\n\n", 2)[1]  # the table right after the marker line
    return first_column(native) | first_column(own)


ELEVENLABS_CODES = documented_codes("ElevenLabs error codes")
CARTESIA_CODES = documented_codes("Cartesia error codes")

texts = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["Hi. ", "Hello there. ", " ", "<|im_end|>", "x" * (MAX_TEXT_CHARS + 10)]),
)
junk = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=6),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)  # fmt: skip
raw_frames = st.one_of(
    st.binary(max_size=16).map(lambda b: ("binary", b)),
    st.text(max_size=20).map(lambda t: ("text", t)),
    st.just(("text", json.dumps({"text": "x" * 2 * MAX_MESSAGE_BYTES}))),  # over max_message_bytes
    st.one_of(st.lists(st.integers(), max_size=2), st.integers(), st.text(max_size=4)).map(
        lambda v: ("json", v)
    ),
)

el_valid = st.one_of(
    st.fixed_dictionaries({"text": st.just(" "), "context_id": st.sampled_from(IDS)},
                          optional={"voice_settings": st.just({"stability": 0.5, "speed": 1.0}),
                                    "generation_config": st.just({"chunk_length_schedule": [50]})}),
    st.fixed_dictionaries({"text": texts, "context_id": st.sampled_from(IDS)},
                          optional={"flush": st.booleans(), "try_trigger_generation": st.booleans()}),
    st.fixed_dictionaries({"context_id": st.sampled_from(IDS), "close_context": st.just(True)}),
    st.fixed_dictionaries({"text": st.just("")}, optional={"context_id": st.sampled_from(IDS), "flush": st.booleans()}),
    st.sampled_from([{"close_socket": True}, {"text": "", "close_socket": True}]),
)  # fmt: skip
el_invalid = st.one_of(
    st.dictionaries(
        st.sampled_from(["text", "context_id", "flush", "close_context", "close_socket", "voice_settings",
                         "generation_config", "try_trigger_generation", "xi_api_key"]),
        junk, max_size=4),
    st.fixed_dictionaries({"text": st.sampled_from(["Hello. ", "<|im_end|>"])}),  # no context_id
    st.fixed_dictionaries({"text": st.just("Hi. "), "context_id": st.sampled_from(["", "x" * 200])}),
)  # fmt: skip
el_steps = st.lists(
    st.one_of(el_valid.map(lambda m: ("valid", m)), el_invalid.map(lambda m: ("json", m)), raw_frames),
    min_size=1,
    max_size=14,
)

voices = st.one_of(
    st.sampled_from(["ryan", "alloy", "nobody"]),
    st.fixed_dictionaries({"mode": st.just("id"), "id": st.sampled_from(["serena", "nobody"])}),
)
formats = st.one_of(
    st.fixed_dictionaries({"container": st.sampled_from(["raw", "wav", "mp3"]),
                           "encoding": st.sampled_from(["pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw"]),
                           "sample_rate": st.sampled_from([8000, 16000, 24000, 44100])}),
    st.dictionaries(st.sampled_from(["container", "encoding", "sample_rate", "bit_rate"]), junk, max_size=4),
    junk,
)  # fmt: skip
ca_valid = st.one_of(
    st.fixed_dictionaries(
        {"context_id": st.sampled_from(IDS), "transcript": texts, "continue": st.booleans()},
        optional={"voice": voices, "output_format": formats, "flush": st.booleans(),
                  "language": st.sampled_from(["en", "zh-CN", "English", "xx", None]),
                  "add_timestamps": st.booleans(), "model_id": st.just("sonic-3"), "seed": st.integers(0, 99)}),
    st.fixed_dictionaries({"context_id": st.sampled_from(IDS), "cancel": st.just(True)}),
)  # fmt: skip
ca_invalid = st.dictionaries(
    st.sampled_from(["context_id", "transcript", "continue", "voice", "output_format", "language",
                     "add_timestamps", "flush", "cancel", "seed"]),
    st.one_of(junk, st.sampled_from(IDS)), max_size=5,
)  # fmt: skip
ca_steps = st.lists(
    st.one_of(ca_valid.map(lambda m: ("valid", m)), ca_invalid.map(lambda m: ("json", m)), raw_frames),
    min_size=1,
    max_size=14,
)


@pytest.fixture(scope="module")
def server() -> Iterator[GatewayProcess]:
    gateway = start_gateway(*LIMITS, engine="real")
    yield gateway
    gateway.stop()


class Peer:
    """One fuzzed socket: what the client sent and every JSON reply, in order, and how it closed."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.replies: list[dict[str, Any]] = []
        self.close: Close | None = None

    async def send(self, kind: str, payload: Any) -> None:
        if kind == "binary":
            await self.ws.send(payload)
        else:
            await self.ws.send(payload if kind == "text" else json.dumps(payload))

    async def receive(self, timeout_s: float) -> dict[str, Any]:
        reply = json.loads(await asyncio.wait_for(self.ws.recv(), timeout_s))
        assert isinstance(reply, dict), reply
        self.replies.append(reply)
        return reply

    async def drain(self) -> None:
        """Read what is already there, without waiting for more."""
        while True:
            try:
                await self.receive(0.02)
            except TimeoutError:
                return

    async def until_closed(self, deadline: float, what: str) -> None:
        try:
            while True:
                await self.receive(max(0.01, deadline - time.monotonic()))
        except ConnectionClosed as exc:
            self.close = exc.rcvd
        except TimeoutError:
            raise AssertionError(f"{what} within {ENDS_WITHIN_S} s: {self.replies[-5:]}") from None

    def check_error_close(self, errors: list[dict[str, Any]], code_key: str) -> None:
        """A close the server chose on an error: a documented code, after an error naming it."""
        assert self.close is not None, "the connection dropped without a close frame"
        assert self.close.code in ERROR_CLOSES, self.close
        assert errors and errors[-1][code_key] == self.close.reason, (self.close, errors[-3:])


def opens(message: dict[str, Any]) -> bool:
    """Whether this (valid) multi-stream-input message opens or names a live context."""
    if "context_id" not in message or message.get("close_context") or message.get("close_socket"):
        return False
    return bool(message.get("text")) or bool(message.get("flush"))


async def play_elevenlabs(server: GatewayProcess, path: str, sequence: list[tuple[str, Any]]) -> Peer:
    multi = path == "multi-stream-input"
    url = f"ws://127.0.0.1:{server.port}/v1/text-to-speech/ryan/{path}?output_format=pcm_16000&model_id=m"
    opened: set[str] = set()  # contexts a valid message opened before the client asked to close
    asked_close = False
    async with connect(url, max_size=None) as ws:
        peer = Peer(ws)
        try:
            for kind, payload in sequence:
                await peer.send(kind, payload)
                if kind == "valid":
                    if multi and not asked_close and opens(payload):
                        opened.add(payload["context_id"])
                    asked_close |= bool(payload.get("close_socket")) or (
                        not multi and payload.get("text") == ""
                    )
                elif kind == "json" and isinstance(payload, dict):  # the 'invalid' maker can draw a valid end
                    asked_close |= payload.get("close_socket") is True or (
                        not multi and payload.get("text") == "" and set(payload) <= {"text", "flush"}
                    )
                await peer.drain()
            await peer.send("json", {"close_socket": True})  # every context finishes, then close 1000
            asked_close = True
        except ConnectionClosed:
            pass  # the server closed first; what it sent before is still to be read
        await peer.until_closed(time.monotonic() + ENDS_WITHIN_S, "the socket did not close")

    errors = [r for r in peer.replies if "error" in r]
    for error in errors:
        assert error["error"] in ELEVENLABS_CODES, error
        assert isinstance(error["message"], str) and error["message"], error
        assert set(error) <= ({"error", "message", "contextId"} if multi else {"error", "message"}), error
    for reply in peer.replies:
        assert "error" in reply or "isFinal" in reply, reply
        if not multi:
            assert "contextId" not in reply, reply
        elif "error" not in reply:
            assert "contextId" in reply, reply
    if peer.close is not None and peer.close.code == 1000:
        assert asked_close, "closed 1000 though the client never ended the stream"
        if multi:  # every context it opened ended, with isFinal or an error last
            for context_id in opened:
                last = [r for r in peer.replies if r.get("contextId") == context_id][-1:]
                assert last and (last[0].get("isFinal") or "error" in last[0]), (
                    context_id,
                    peer.replies[-6:],
                )
            spoke = {r["contextId"] for r in peer.replies if r.get("audio") or r.get("alignment")}
            for context_id in spoke:
                last = [r for r in peer.replies if r.get("contextId") == context_id][-1]
                assert last.get("isFinal") or "error" in last, (context_id, last)
        else:
            assert peer.replies and (peer.replies[-1].get("isFinal") or "error" in peer.replies[-1]), (
                peer.replies
            )
            assert sum(1 for r in peer.replies if r.get("isFinal")) <= 1
    else:
        peer.check_error_close(errors, "error")
    return peer


async def free_slots(peer: Peer, deadline: float) -> None:
    """Every context slot comes free: `MAX_CONTEXTS` new contexts open (none refused) and end with `done`."""
    attempt = 0
    while True:
        ids = [f"free-{attempt}-{i}" for i in range(MAX_CONTEXTS)]
        for context_id in ids:
            await peer.send("json", {"context_id": context_id, "transcript": "", "continue": True})
        for context_id in ids:
            await peer.send("json", {"context_id": context_id, "transcript": "", "continue": False})
        outcome: dict[str, dict[str, Any]] = {}
        while len(outcome) < len(ids):
            try:
                reply = await peer.receive(max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                raise AssertionError(f"fresh contexts never ended: {peer.replies[-5:]}") from None
            if reply.get("context_id") in ids and reply["type"] in ("done", "error"):
                outcome.setdefault(reply["context_id"], reply)
        refused = [r for r in outcome.values() if r["type"] == "error"]
        if not refused:
            return
        assert {r["error_code"] for r in refused} == {"too_many_contexts"}, refused
        assert time.monotonic() < deadline, f"context slots still taken after {ENDS_WITHIN_S} s"
        await asyncio.sleep(0.2)
        attempt += 1


async def play_cartesia(server: GatewayProcess, sequence: list[tuple[str, Any]]) -> Peer:
    url = f"ws://127.0.0.1:{server.port}/tts/websocket?cartesia_version=2025-04-16"
    cancelled: set[str] = set()
    async with connect(url, max_size=None) as ws:
        peer = Peer(ws)
        try:
            for kind, payload in sequence:
                await peer.send(kind, payload)
                if kind == "valid" and payload.get("cancel"):
                    cancelled.add(payload["context_id"])
                await peer.drain()
            ended_at = len(peer.replies)
            for context_id in IDS:  # end every context's input (opens and ends those that are not live)
                await peer.send("json", {"context_id": context_id, "transcript": "", "continue": False})
            deadline = time.monotonic() + ENDS_WITHIN_S
            waiting = set(IDS) - cancelled  # a cancelled context may end silently
            while waiting:
                try:
                    reply = await peer.receive(max(0.01, deadline - time.monotonic()))
                except TimeoutError:
                    raise AssertionError(f"contexts {waiting} never ended: {peer.replies[-5:]}") from None
                if len(peer.replies) > ended_at and reply["type"] in ("done", "error"):
                    waiting.discard(reply["context_id"])
            await free_slots(peer, deadline)
        except ConnectionClosed:
            await peer.until_closed(time.monotonic() + ENDS_WITHIN_S, "the socket did not close")

    errors = [r for r in peer.replies if r["type"] == "error"]
    for error in errors:
        assert set(error) == {"type", "context_id", "status_code", "title", "error_code", "message"}, error
        assert error["error_code"] in CARTESIA_CODES and error["title"] == error["error_code"], error
        assert (
            isinstance(error["status_code"], int) and isinstance(error["message"], str) and error["message"]
        )
    for reply in peer.replies:
        assert reply["type"] in ("chunk", "timestamps", "done", "error") and "context_id" in reply, reply
        assert reply.get("done", False) is (reply["type"] == "done"), reply
    for context_id in {r["context_id"] for r in peer.replies if r["type"] in ("chunk", "timestamps")}:
        last = [r for r in peer.replies if r["context_id"] == context_id][-1]
        assert last["type"] in ("done", "error") or context_id in cancelled, (context_id, last)
    if peer.close is not None:
        peer.check_error_close(errors, "error_code")
    return peer


def run_beside_neighbour(server: GatewayProcess, fuzzed: Any) -> None:
    """Run one fuzzed socket while a native session streams; the neighbour must finish its audio."""

    async def scenario() -> dict[str, Any]:
        beside = asyncio.create_task(speak(server.ws, NEIGHBOUR_TEXT))
        await fuzzed
        done, _ = await beside
        return done

    done = asyncio.run(scenario())
    assert done["reason"] == "completed" and done["samples"] == expected_samples(len(NEIGHBOUR_TEXT))
    assert server.proc.poll() is None, server.log()[-3000:]


@pytest.mark.timeout(300)
@FUZZ_SETTINGS
@given(sequence=el_steps)
def test_elevenlabs_stream_input_survives_any_message_sequence_and_ends_its_stream(
    server: GatewayProcess, sequence: list[tuple[str, Any]]
) -> None:
    run_beside_neighbour(server, play_elevenlabs(server, "stream-input", sequence))


@pytest.mark.timeout(300)
@FUZZ_SETTINGS
@given(sequence=el_steps)
def test_elevenlabs_multi_stream_input_ends_every_context_it_opened_whatever_came_between(
    server: GatewayProcess, sequence: list[tuple[str, Any]]
) -> None:
    run_beside_neighbour(server, play_elevenlabs(server, "multi-stream-input", sequence))


@pytest.mark.timeout(300)
@FUZZ_SETTINGS
@given(sequence=ca_steps)
def test_cartesia_websocket_ends_every_context_and_frees_its_slots_whatever_came_between(
    server: GatewayProcess, sequence: list[tuple[str, Any]]
) -> None:
    run_beside_neighbour(server, play_cartesia(server, sequence))


@pytest.mark.parametrize("encoding", [[], {"a": 1}])
def test_a_cartesia_encoding_that_is_not_a_string_is_refused_not_a_server_failure(
    server: GatewayProcess, encoding: Any
) -> None:
    """Found by fuzzing: an unhashable `encoding` made the format lookup raise (WebSocket 1011, HTTP 500)."""
    output_format = {"container": "raw", "encoding": encoding, "sample_rate": 24000}

    async def over_the_socket() -> dict[str, Any]:
        async with connect(f"ws://127.0.0.1:{server.port}/tts/websocket", max_size=None) as ws:
            message = {
                "context_id": "c",
                "transcript": "Hi.",
                "continue": False,
                "output_format": output_format,
            }
            await ws.send(json.dumps(message))
            return dict(json.loads(await asyncio.wait_for(ws.recv(), 10)))

    error = asyncio.run(over_the_socket())
    assert (error["type"], error["context_id"], error["error_code"]) == (
        "error",
        "c",
        "unsupported_output_format",
    )
    response = httpx.post(
        server.http + "/tts/bytes", json={"transcript": "Hi.", "output_format": output_format}, timeout=30
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "unsupported_output_format"
