"""Observations of real processes for the IPC tests: /dev/shm entries, mappings, CPU time."""

from __future__ import annotations

import os
import random

SHM_DIR = "/dev/shm"
SEGMENT_MARK = "vivace-ipc-"


def shm_entries() -> set[str]:
    return set(os.listdir(SHM_DIR))


def mapped_segments(pid: int | str = "self") -> list[str]:
    """Lines of /proc/PID/maps that map a link segment (they read '... /dev/shm/vivace-ipc-... (deleted)')."""
    with open(f"/proc/{pid}/maps") as maps:
        return [line.strip() for line in maps if SEGMENT_MARK in line]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time consumed so far by process `pid`."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    return ticks / os.sysconf("SC_CLK_TCK")


def payload_stream(seed: int, count: int, max_bytes: int):
    """Deterministic (size, payload) pairs: sizes log-uniform in [1, max_bytes], random contents."""
    rng = random.Random(seed)
    for _ in range(count):
        size = min(max_bytes, max(1, int(max_bytes ** rng.random())))
        yield rng.randbytes(size)
