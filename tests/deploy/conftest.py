"""Shared helpers for the deployment tests: the repository's deploy files, parsed."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = Path(__file__).resolve().parent / "schemas"
K8S_DIR = REPO_ROOT / "deploy" / "k8s"
MIB = 1 << 20

_INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::?-(?P<default>[^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's `${VAR}` / `${VAR:-default}` substitution over a parsed document ($$ is not used here)."""
    if isinstance(value, str):
        return _INTERPOLATION.sub(lambda m: env.get(m["name"]) or (m["default"] or ""), value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def size_bytes(text: str | int) -> int:
    """Compose byte values: 256m, 1g, 128mb, 64k, or a plain number of bytes."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"(\d+)\s*([kmg]?)b?", str(text).strip().lower())
    assert match, f"not a byte value: {text!r}"
    return int(match[1]) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[match[2]]


def quantity_bytes(text: str) -> int:
    """Kubernetes binary quantities: 128Mi, 1Gi, 512Ki."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", text)
    assert match, f"not a binary quantity: {text!r}"
    return int(match[1]) * {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}[match[2]]


def load_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    return yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())


@pytest.fixture(scope="session")
def compose_interpolated(compose: dict[str, Any]) -> dict[str, Any]:
    """compose.yaml as `docker compose` sees it with none of its ${...} variables set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIVACE_", "HF_"))}
    return interpolate(compose, env)


@pytest.fixture(scope="session")
def k8s_documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs
