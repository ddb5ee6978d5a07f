"""The oracle venv sees the packages of whichever interpreter builds it, a newcomer's venv included.

A newcomer runs `python3 -m venv venv; . venv/bin/activate; pip install -e .; bash scripts/test.sh`. Their
torch lives in `venv`, not in the base interpreter, and the oracle venv must use it instead of installing a
second torch. These tests build a stand-in for that venv (without pip, so nothing is downloaded), put
probe packages in it, and check what a venv made by `tools/oracle/shared_venv.py` from it can import.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.gateway.helpers import REPO

SHARED_VENV = REPO / "tools" / "oracle" / "shared_venv.py"
VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"


def site_packages(venv: Path) -> Path:
    return venv / "lib" / VERSION / "site-packages"


def make_venv(path: Path, *args: str, python: str = sys.executable) -> None:
    subprocess.run([python, "-m", "venv", "--without-pip", *args, str(path)], check=True, timeout=120)


def add_distribution(site: Path, name: str, module_text: str) -> None:
    """A minimal installed distribution: a module plus the dist-info pip and importlib.metadata read."""
    module = name.replace("-", "_")
    (site / f"{module}.py").write_text(module_text)
    info = site / f"{module}-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")


def shared_venv(parent: Path, target: Path) -> None:
    """Run tools/oracle/shared_venv.py with the interpreter of the venv `parent`."""
    command = [str(parent / "bin" / "python"), str(SHARED_VENV), "--without-pip", str(target)]
    subprocess.run(command, check=True, timeout=120)


def run_in(venv: Path, code: str) -> str:
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=120, cwd=venv.parent,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_a_venv_made_from_a_newcomers_venv_sees_that_venvs_packages_and_the_base_ones(tmp_path: Path) -> None:
    newcomer = tmp_path / "venv"
    make_venv(newcomer)
    add_distribution(site_packages(newcomer), "vivace-probe", "WHERE = 'newcomer venv'\n")
    oracle = tmp_path / "oracle"
    shared_venv(newcomer, oracle)
    seen = run_in(
        oracle,
        """
        import sys, importlib.metadata, vivace_probe, pytest
        print(sys.prefix)
        print(vivace_probe.WHERE)
        print(importlib.metadata.version("vivace-probe"))  # what pip sees: it will not reinstall it
        print(pytest.__file__)  # a package of the base interpreter stays visible
        """,
    ).splitlines()
    assert seen[0] == str(oracle)
    assert seen[1] == "newcomer venv"
    assert seen[2] == "1.2.3"
    assert not seen[3].startswith((str(oracle), str(newcomer)))


def test_the_oracle_venvs_own_installs_come_first_then_the_newcomers_then_the_base(tmp_path: Path) -> None:
    newcomer = tmp_path / "venv"
    make_venv(newcomer)
    add_distribution(site_packages(newcomer), "pytest", "WHERE = 'newcomer venv'\n")  # shadows the base
    add_distribution(site_packages(newcomer), "vivace-probe", "WHERE = 'newcomer venv'\n")
    oracle = tmp_path / "oracle"
    shared_venv(newcomer, oracle)
    add_distribution(site_packages(oracle), "vivace-probe", "WHERE = 'oracle venv'\n")
    seen = run_in(oracle, "import pytest, vivace_probe; print(pytest.WHERE, '|', vivace_probe.WHERE)")
    assert seen == "newcomer venv | oracle venv"


def test_plain_system_site_packages_would_hide_the_newcomers_packages(tmp_path: Path) -> None:
    """The control: why shared_venv.py exists (if this ever fails, the workaround can go)."""
    newcomer = tmp_path / "venv"
    make_venv(newcomer)
    add_distribution(site_packages(newcomer), "vivace-probe", "WHERE = 'newcomer venv'\n")
    plain = tmp_path / "plain"
    make_venv(plain, "--system-site-packages", python=str(newcomer / "bin" / "python"))
    assert run_in(plain, "import importlib.util; print(importlib.util.find_spec('vivace_probe'))") == "None"


def test_rerunning_keeps_the_venv_and_relinks_the_current_interpreter(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    make_venv(first)
    make_venv(second)
    add_distribution(site_packages(second), "vivace-probe", "WHERE = 'second'\n")
    oracle = tmp_path / "oracle"
    for parent in (first, second):
        shared_venv(parent, oracle)
        if parent is first:  # installed between the two runs: the second run must not wipe it
            add_distribution(site_packages(oracle), "kept", "WHERE = 'kept'\n")
    assert run_in(oracle, "import kept, vivace_probe; print(vivace_probe.WHERE)") == "second"
