"""What a process holds right now, read from Linux's /proc: memory, descriptors, threads, shared memory.

One promise: `sample(pid)` returns the process's resident memory, open file descriptors, threads and the
`/dev/shm` files it has mapped (with their sizes), or None once the process is gone. Resident memory is
split: `private_bytes` (anonymous and file-backed pages) is what a leak grows; `rss_shmem_bytes` is the
shared memory touched so far, which grows until each ring has wrapped once and is bounded by the rings. No dependencies;
Linux only (the server it watches is Linux-only too).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

SHM_DIR = "/dev/shm"


@dataclass(frozen=True, slots=True)
class ProcSample:
    pid: int
    rss_bytes: int  # VmRSS: everything resident
    private_bytes: int  # VmRSS less RssShmem
    rss_shmem_bytes: int
    fds: int
    threads: int
    shm_bytes: int  # total size of the distinct /dev/shm files mapped
    shm_files: int


def _status_fields(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _shm_mappings(pid: int) -> dict[str, int]:
    """Distinct /dev/shm files in the process's address space -> their size on disk."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith(SHM_DIR + "/"):
            path = parts[5].removesuffix(" (deleted)")
            if path not in found:
                try:
                    found[path] = os.stat(path).st_size
                except OSError:  # unlinked but still mapped: count the mapped range
                    start, end = (int(x, 16) for x in parts[0].split("-"))
                    found[path] = end - start
    return found


def sample(pid: int) -> ProcSample | None:
    """One reading of `pid`, or None if it has exited (or is a zombie)."""
    try:
        status = _status_fields(pid)
        if status.get("State", "").startswith("Z"):
            return None
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        shm = _shm_mappings(pid)
    except (FileNotFoundError, ProcessLookupError):
        return None
    rss = int(status.get("VmRSS", "0 kB").split()[0]) * 1024
    rss_shmem = int(status.get("RssShmem", "0 kB").split()[0]) * 1024
    return ProcSample(
        pid, rss, rss - rss_shmem, rss_shmem, fds, int(status["Threads"]), sum(shm.values()), len(shm)
    )


def children_with_arg(parent: int, arg: bytes) -> list[int]:
    """Live child processes of `parent` whose command line contains the argument `arg`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent and arg in (
                entry / "cmdline"
            ).read_bytes().split(b"\0"):
                pids.append(int(entry.name))
    return sorted(pids)


def shm_used_bytes() -> int:
    """Bytes in use on the /dev/shm file system (every process's, not only ours)."""
    stats = os.statvfs(SHM_DIR)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize
