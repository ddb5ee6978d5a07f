"""A measurement's JSON names the source it ran: the commit the caller gives, else git's HEAD, marked dirty
when tracked files differ from it."""

from __future__ import annotations

import subprocess

import pytest

from loadtest.revision import REPO, source_revision


def test_a_given_commit_wins_over_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIVACE_GIT_SHA", "0123abc")
    assert source_revision() == "0123abc"


def test_without_one_the_checkout_head_is_reported_and_marked_when_dirty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VIVACE_GIT_SHA", raising=False)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    if not head:
        pytest.skip("not a git checkout")
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    assert source_revision() == (f"{head}+dirty" if dirty else head)
