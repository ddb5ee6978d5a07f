"""Child process for the ring tests: attaches to a segment and produces a deterministic record stream.

    python -m tests.ipc.ring_peer SEGMENT_NAME COUNT SEED MAX_BYTES DATA_FD SPACE_FD

Writes COUNT records (helpers.payload_stream) into the segment's to_gateway ring, writing DATA_FD after
each record, and sleeping on SPACE_FD (which the reader writes after draining) whenever the ring is
full. Prints "attached" once mapped and "refused N" (how many writes the full ring refused) at the end.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys

from engine.ipc.segment import Segment
from tests.ipc.helpers import payload_stream


def main() -> int:
    name, count, seed, max_bytes, data_fd, space_fd = sys.argv[1:7]
    data_fd_i, space_fd_i = int(data_fd), int(space_fd)
    segment = Segment.attach(name)
    print("attached", flush=True)
    ring = segment.to_gateway
    refused = 0
    for payload in payload_stream(int(seed), int(count), int(max_bytes)):
        while not ring.try_write(payload):
            refused += 1
            ring.set_writer_waiting(True)
            # The reader wakes us after draining; the timeout covers a wake-up lost to store->load reordering.
            select.select([space_fd_i], [], [], 0.001)
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(space_fd_i)
        ring.set_writer_waiting(False)
        os.eventfd_write(data_fd_i, 1)
    print(f"refused {refused}", flush=True)
    segment.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
