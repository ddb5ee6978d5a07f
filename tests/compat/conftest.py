"""Fixtures for the compatible protocols: the gateway tests' real `python -m gateway` processes."""

from __future__ import annotations

from tests.gateway.conftest import engine_kind, gateway  # noqa: F401  (shared fixtures)
