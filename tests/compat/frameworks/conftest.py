"""Framework checks run inside the frameworks venv against a gateway started by the outer test.

`VIVACE_URL` is that gateway's base URL (http://127.0.0.1:port); tests/compat/test_frameworks.py
starts the gateway with the tiny model and runs these files with the venv's pytest.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def base_url() -> str:
    url = os.environ.get("VIVACE_URL")
    if not url:
        pytest.fail("VIVACE_URL is not set: run these through tests/compat/test_frameworks.py")
    return url.rstrip("/")


@pytest.fixture(scope="session")
def ws_base_url(base_url: str) -> str:
    return base_url.replace("http://", "ws://", 1)
