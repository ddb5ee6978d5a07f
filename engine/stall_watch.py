"""If the engine loop stops turning, every thread's Python stack goes to stderr: where it is stuck, on record.

The gateway notices a silent engine only after its heartbeat timeout (10 s by default) and then kills it, so
whatever held the loop (a wait on a CUDA event whose kernels never end, a lock, a slow host call) would die
unexplained. `StallWatch.arm()` is called at every heartbeat; if the next call does not come within
`seconds`, Python's `faulthandler` (a C-level watchdog thread, so it fires even while the loop's thread is
blocked inside a native call) writes "Timeout (h:mm:ss)!" and the stack of every thread to `file`, once per
stall. The engine's stderr passes through the gateway's (gateway/engine_stderr.py), so the dump lands in the
server's log next to the gateway's own report of the silence.
"""

from __future__ import annotations

import faulthandler
import sys
from typing import TextIO


class StallWatch:
    def __init__(self, seconds: float, file: TextIO | None = None) -> None:
        """`seconds` <= 0: never dump."""
        self.seconds = seconds
        self.file = file or sys.stderr

    def arm(self) -> None:
        """Dump the stacks unless `arm` or `disarm` is called again within `seconds` (re-arming cancels)."""
        if self.seconds > 0:
            faulthandler.dump_traceback_later(self.seconds, repeat=False, file=self.file, exit=False)

    def disarm(self) -> None:
        if self.seconds > 0:
            faulthandler.cancel_dump_traceback_later()
