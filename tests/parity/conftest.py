"""Parity fixtures: reference data computed by the official `qwen-tts` package in its own venv.

The oracle venv (`.oracle-venv/`, made by `tools/oracle/setup.sh`, idempotent) runs
`tools/oracle/make_reference.py`, which builds tiny official checkpoints and dumps what the official code
computes from them. Its output is cached under `.cache/oracle/<hash of the oracle scripts + venv stamp>/`,
so a rerun costs nothing. Nothing here skips: a missing venv or a failing oracle fails the session.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
ORACLE = ROOT / "tools" / "oracle"
VENV_PYTHON = ROOT / ".oracle-venv" / "bin" / "python"
STAMP = ROOT / ".oracle-venv" / ".vivace-oracle-stamp"
CACHE = ROOT / ".cache" / "oracle"
ORACLE_TIMEOUT_S = 1800


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.parity)


def _oracle_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in ORACLE.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(ORACLE)).encode())
        digest.update(path.read_bytes())
    digest.update(STAMP.read_bytes() if STAMP.is_file() else b"no-stamp")
    return digest.hexdigest()[:16]


def _fail(what: str, proc: subprocess.CompletedProcess[str]) -> None:
    tail = (proc.stdout[-3000:] + "\n" + proc.stderr[-6000:]).strip()
    pytest.fail(f"{what} failed (exit {proc.returncode}):\n{tail}", pytrace=False)


@pytest.fixture(scope="session")
def oracle_dir() -> Path:
    """Directory with the official reference data (built on first use, then cached)."""
    setup = subprocess.run(
        ["bash", str(ORACLE / "setup.sh")], cwd=ROOT, capture_output=True, text=True, timeout=ORACLE_TIMEOUT_S
    )
    if setup.returncode != 0 or not VENV_PYTHON.is_file():
        _fail("tools/oracle/setup.sh (oracle venv with the official qwen-tts)", setup)
    out = CACHE / _oracle_hash()
    if not (out / "manifest.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        proc = subprocess.run(
            [str(VENV_PYTHON), str(ORACLE / "make_reference.py"), "--out", str(out)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=ORACLE_TIMEOUT_S,
        )  # fmt: skip
        if proc.returncode != 0 or not (out / "manifest.json").is_file():
            _fail("tools/oracle/make_reference.py (official reference data)", proc)
    return out


class Reference:
    """Typed access to one oracle output directory; models loaded by our loader are cached per dtype."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._models: dict[tuple[str, torch.dtype], Any] = {}

    def model(self, checkpoint: str, dtype: torch.dtype = torch.float32) -> Any:
        """`load_model(<checkpoint dir>, dtype=dtype)`, loaded once per session (tests must not mutate it)."""
        from engine.model.weights import load_model

        key = (checkpoint, dtype)
        if key not in self._models:
            self._models[key] = load_model(self.root / checkpoint, dtype=dtype)
        return self._models[key]

    def voice_model(self, checkpoint: str, dtype: torch.dtype = torch.float32) -> Any:
        """`load_model(<dir>, dtype=dtype, voice_models=True)` for the Base / VoiceDesign checkpoints, cached."""
        from engine.model.weights import load_model

        key = ("voice:" + checkpoint, dtype)
        if key not in self._models:
            self._models[key] = load_model(self.root / checkpoint, dtype=dtype, voice_models=True)
        return self._models[key]

    def checkpoint(self, size: str) -> Path:
        return self.root / f"ckpt-{size}"

    def json(self, name: str) -> Any:
        return json.loads((self.root / name).read_text(encoding="utf-8"))

    def tensors(self, name: str) -> dict[str, torch.Tensor]:
        return load_file(str(self.root / name))


@pytest.fixture(scope="session")
def reference(oracle_dir: Path) -> Reference:
    return Reference(oracle_dir)


@pytest.fixture(scope="session")
def voices(reference: Reference) -> tuple[dict, dict[str, torch.Tensor]]:
    """The voice oracle's output (tools/oracle/voices.py): its JSON summary and its tensors."""
    return reference.json("voices.json"), reference.tensors("voices.safetensors")


@pytest.fixture(scope="session", autouse=True)
def _few_threads() -> None:
    torch.set_num_threads(min(2, os.cpu_count() or 1))


def relative_l2(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    ours, theirs = ours.double().reshape(-1), theirs.double().reshape(-1)
    return float((ours - theirs).norm() / theirs.norm().clamp_min(1e-30))
