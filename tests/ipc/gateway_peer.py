"""Child process for the crash tests: a gateway worker that streams from an engine until killed.

    python -m tests.ipc.gateway_peer SOCKET_PATH REQUESTS

Connects an EngineLink, submits REQUESTS requests, prints "streaming" once every request has received
audio, then keeps consuming forever (the test kills it with SIGKILL).
"""

from __future__ import annotations

import asyncio
import sys

from engine.ipc.client import EngineLink
from engine.ipc.messages import Audio, Submit


async def main(socket_path: str, requests: int) -> None:
    link = await EngineLink.connect(socket_path)
    queues = [link.subscribe(i) for i in range(1, requests + 1)]
    for i in range(1, requests + 1):
        link.send(Submit(i, "ryan", "english", (1, 2, 3), 500, True))

    async def consume(queue: asyncio.Queue) -> None:
        first = await queue.get()
        assert isinstance(first, Audio), first
        started.append(1)
        if len(started) == requests:
            print("streaming", flush=True)
        while True:
            await queue.get()

    started: list[int] = []
    await asyncio.gather(*(consume(q) for q in queues))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
