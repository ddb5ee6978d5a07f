"""Fixtures for gateway tests: real `python -m gateway` processes with the fake or the real engine."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.gateway.helpers import GatewayProcess, start_gateway

# The engine behind the gateway in end-to-end tests. "fake" is engine.ipc.fake_engine; "real" is
# `python -m engine --model tiny --device cpu`, the default (the issue asks for the real engine);
# VIVACE_TEST_ENGINES=fake (or fake,real) switches.
ENGINE_KINDS = os.environ.get("VIVACE_TEST_ENGINES", "real").split(",")


@pytest.fixture(scope="module", params=ENGINE_KINDS)
def engine_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def gateway(engine_kind: str) -> Iterator[GatewayProcess]:
    """A gateway with default limits, shared by a module's tests."""
    server = start_gateway(engine=engine_kind, ms_per_frame=2.0)
    yield server
    server.stop()
