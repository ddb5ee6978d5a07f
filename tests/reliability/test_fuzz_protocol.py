"""Property-based fuzzing of the native WebSocket protocol: random sequences of valid and invalid events.

For every generated sequence, sent on a fresh socket of one long-lived gateway (fake engine, small limits):
the server stays up, every error it sends carries a code documented in docs/protocol.md 1.7, a close it
chooses is preceded by an error, every context it created ends with exactly one `context.done` (none
hangs), and a session streaming beside the fuzzed ones finishes its audio. Bounded by `max_examples`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from tests.gateway.helpers import REPO, GatewayProcess, LiveClient, expected_samples, speak, start_gateway

LIMITS = ("--limit=max_contexts=3", "--limit=max_message_bytes=2048", "--limit=max_text_chars=400")
CONTEXTS = ("a", "b", "c", "d")
CONTEXT_DONE_WITHIN_S = 20.0
NEIGHBOUR_TEXT = "The neighbour session keeps streaming while its peers send garbage. " * 3


def documented_codes() -> set[str]:
    doc = (REPO / "docs" / "protocol.md").read_text()
    table = doc[doc.index("### 1.7 Error codes") : doc.index("Close codes:")]
    return set(
        re.findall(
            r"`([a-z_]+)`",
            "\n".join(line.split("|")[1] for line in table.splitlines() if line.startswith("| `")),
        )
    )


CODES = documented_codes()

context_ids = st.one_of(st.sampled_from(CONTEXTS), st.text(max_size=3), st.integers(), st.none())
texts = st.one_of(st.text(max_size=60), st.sampled_from(["Hello there. ", "<|im_end|>", "x" * 500, ""]))
valid_events = st.one_of(
    st.fixed_dictionaries({"type": st.just("input_text.append"), "context_id": st.sampled_from(CONTEXTS), "text": texts}),
    st.fixed_dictionaries({"type": st.sampled_from(["input_text.end", "input_text.flush", "context.cancel"]),
                           "context_id": st.sampled_from(CONTEXTS)}),
    st.fixed_dictionaries({"type": st.just("context.create"), "context_id": st.sampled_from(CONTEXTS),
                           "voice": st.sampled_from(["ryan", "alloy", "nobody", 7])}),
    st.fixed_dictionaries({"type": st.just("playback.position"), "context_id": st.sampled_from(CONTEXTS),
                           "played_samples": st.integers(-5, 10**7)}),
    st.fixed_dictionaries({"type": st.just("session.update"), "max_lead_ms": st.integers(-1, 5000)}),
    st.fixed_dictionaries({"type": st.just("ping"), "id": st.integers()}),
)  # fmt: skip
invalid_events = st.one_of(
    st.dictionaries(st.sampled_from(["type", "context_id", "text", "x"]), st.one_of(st.text(max_size=10), st.integers(), context_ids), max_size=4),
    st.fixed_dictionaries({"type": st.text(max_size=20)}),
    st.lists(st.integers(), max_size=3),
)  # fmt: skip
raw_frames = st.one_of(
    st.binary(max_size=32).map(lambda b: ("binary", b)),
    st.text(max_size=30).map(lambda t: ("text", t)),
    st.just(("text", "x" * 3000)),  # over max_message_bytes
)
steps = st.lists(
    st.one_of(valid_events.map(lambda e: ("json", e)), invalid_events.map(lambda e: ("json", e)), raw_frames),
    min_size=1,
    max_size=12,
)


@pytest.fixture(scope="module")
def server() -> Iterator[GatewayProcess]:
    gateway = start_gateway(*LIMITS, engine="fake", ms_per_frame=2.0)
    yield gateway
    gateway.stop()


async def play(server: GatewayProcess, sequence: list[tuple[str, Any]]) -> None:
    async with LiveClient.open(server.ws) as client:
        closed = False
        try:
            for kind, payload in sequence:
                if kind == "binary":
                    await client.ws.send(payload)
                else:
                    await client.ws.send(payload if kind == "text" else json.dumps(payload))  # big ints too
                while True:  # read what is already there, without waiting for more
                    try:
                        await client.receive(timeout_s=0.02)
                    except TimeoutError:
                        break
            for context in CONTEXTS:  # finish whatever was started
                await client.send(type="input_text.end", context_id=context)
            deadline = time.monotonic() + CONTEXT_DONE_WITHIN_S
            while not all_done(client):
                await client.receive(timeout_s=max(0.01, deadline - time.monotonic()))
        except ConnectionClosed as close:
            closed = True
            assert close.rcvd is not None and close.rcvd.code in (1003, 1008, 1009), close
        except TimeoutError:
            raise AssertionError(f"contexts never ended: {created(client) - finished(client)}") from None
        errors = [e for e in client.events if e["type"] == "error"]
        assert {e["error"]["code"] for e in errors} <= CODES, errors
        if closed:
            assert errors, "the server closed the socket without an error event first"
        dones = [e["context_id"] for e in client.events if e["type"] == "context.done"]
        assert len(dones) == len(set(dones)), f"a context ended twice: {dones}"


def created(client: LiveClient) -> set[str]:
    return {e["context_id"] for e in client.events if e["type"] == "context.created"}


def finished(client: LiveClient) -> set[str]:
    return {e["context_id"] for e in client.events if e["type"] == "context.done"}


def all_done(client: LiveClient) -> bool:
    return created(client) <= finished(client)


async def neighbour(server: GatewayProcess) -> dict[str, Any]:
    done, _ = await speak(server.ws, NEIGHBOUR_TEXT)
    return done


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=steps)
def test_random_event_sequences_never_hang_a_context_or_harm_a_neighbour(
    server: GatewayProcess, sequence: list
) -> None:
    async def scenario() -> dict[str, Any]:
        beside = asyncio.create_task(neighbour(server))
        await play(server, sequence)
        return await beside

    done = asyncio.run(scenario())
    assert done["reason"] == "completed" and done["samples"] == expected_samples(len(NEIGHBOUR_TEXT))
    assert server.proc.poll() is None
