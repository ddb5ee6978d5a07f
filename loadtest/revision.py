"""Which source a measurement ran, for the JSON it writes.

`$VIVACE_GIT_SHA` when set (a copy of the tree whose `.git` is not the one it came from, as on a lent GPU
machine, reports the commit the caller names), else `git rev-parse HEAD`, with "+dirty" when tracked files
differ from that commit (the numbers then belong to no commit exactly), else "unknown".
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def git_head() -> tuple[str, bool] | None:
    """(HEAD's sha, whether tracked files differ from it) of this checkout; None without git or a repository."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()  # fmt: skip
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                 capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return (head, bool(changed)) if head else None


def source_revision() -> str:
    given = os.environ.get("VIVACE_GIT_SHA", "").strip()
    if given:
        return given
    head = git_head()
    if head is None:
        return "unknown"
    sha, dirty = head
    return f"{sha}+dirty" if dirty else sha
