"""Latency and throughput of the gateway <-> engine link (engine/ipc), measured between two processes.

    python tools/bench_ipc.py                 # default suite, about 10 s
    python tools/bench_ipc.py --quick         # a smaller suite, about 3 s

It starts itself a second time as a minimal engine (EngineEndpoint, no model), connects an EngineLink,
and for each case asks that engine to publish COUNT Audio records of SIZE bytes, one every INTERVAL
(0: as fast as the link allows, backpressure included). One-way latency = the moment the gateway
coroutine that awaits the request's queue resumes, minus the time.monotonic_ns() the engine stamped
into the record just before `send` (same host clock). Prints the configuration and raw numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.ipc.client import EngineLink  # noqa: E402
from engine.ipc.messages import Audio, Done, DoneReason, Submit  # noqa: E402
from engine.ipc.process import spawn_engine, stop_engine, wait_for_socket_async  # noqa: E402
from engine.ipc.server import EngineEndpoint  # noqa: E402

# A bench request is a Submit whose fields carry the case: text_chars = count, seed = payload bytes,
# deadline_ns = interval between records in ns.


def run_engine(socket_path: str) -> int:
    endpoint = EngineEndpoint(socket_path)
    jobs: list[list[int]] = []  # [link_id, request_id, remaining, size, interval_ns, next_ns, sent]
    try:
        while True:
            now = time.monotonic_ns()
            due = [j[5] for j in jobs]
            timeout = None if not jobs else max(0.0, (min(due) - now) / 1e9)
            for link_id, msg in endpoint.poll(timeout):
                if isinstance(msg, Submit):
                    jobs.append([link_id, msg.request_id, msg.text_chars, msg.seed, msg.deadline_ns, now, 0])
                else:
                    return 0  # Shutdown
            for job in list(jobs):
                link_id, rid, remaining, size, interval, next_ns, sent = job
                pcm = b"\0" * size
                batch = []
                # Like an engine step: publish every due record (at most 64) with one wake-up.
                while remaining and time.monotonic_ns() >= next_ns and len(batch) < 64:
                    if endpoint.pending_bytes(link_id) > 4 << 20:
                        break  # let the gateway catch up (the real engine paces by deadlines)
                    batch.append((link_id, Audio(rid, time.monotonic_ns(), pcm)))
                    remaining, sent = remaining - 1, sent + 1
                    next_ns = next_ns + interval if interval else next_ns
                endpoint.send_many(batch)
                job[2], job[5], job[6] = remaining, next_ns, sent
                if not remaining:
                    endpoint.send(link_id, Done(rid, DoneReason.COMPLETED, sent, 0))
                    jobs.remove(job)
            if endpoint.dead_links():
                return 0
    finally:
        endpoint.close()


async def run_case(link: EngineLink, rid: int, count: int, size: int, interval_ms: float) -> dict[str, float]:
    queue = link.subscribe(rid)
    latencies: list[int] = []
    start = time.perf_counter()
    link.send(Submit(rid, "bench", "auto", (), count, True, seed=size, deadline_ns=int(interval_ms * 1e6)))
    received = 0
    while True:
        msg = await queue.get()
        if isinstance(msg, Done):
            break
        latencies.append(time.monotonic_ns() - msg.start_sample)
        received += 1
    elapsed = time.perf_counter() - start
    assert received == count, (received, count)
    lat_us = sorted(x / 1000 for x in latencies)
    return {
        "p50_us": statistics.median(lat_us),
        "p99_us": lat_us[min(len(lat_us) - 1, int(0.99 * len(lat_us)))],
        "max_us": lat_us[-1],
        "msgs_per_s": count / elapsed,
        "mb_per_s": count * size / elapsed / 1e6,
    }


async def run_suite(quick: bool) -> None:
    socket_path = f"@vivace-bench-{os.getpid()}"
    proc = spawn_engine([sys.executable, __file__, "--role", "engine"], socket_path)
    try:
        await wait_for_socket_async(socket_path, 20, proc)
        link = await EngineLink.connect(socket_path)
        scale = 0.2 if quick else 1.0
        cases = [  # (label, count, bytes, interval ms)
            ("latency 100 B every 2 ms", int(1000 * scale), 100, 2.0),
            ("latency 7680 B every 2 ms", int(1000 * scale), 7680, 2.0),
            ("latency 7680 B every 20 ms", int(150 * scale), 7680, 20.0),
            ("throughput 100 B", int(200_000 * scale), 100, 0.0),
            ("throughput 7680 B", int(100_000 * scale), 7680, 0.0),
            ("throughput 46080 B", int(20_000 * scale), 46080, 0.0),
        ]
        print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; "
              f"loop {type(asyncio.get_running_loop()).__name__}; rings 1 MiB requests / 8 MiB replies")  # fmt: skip
        print(f"{'case':30} {'count':>7} {'p50 us':>8} {'p99 us':>8} {'max us':>8} {'msgs/s':>9} {'MB/s':>8}")
        await run_case(link, 1000, 2000, 7680, 0.0)  # warm-up, not reported
        for rid, (label, count, size, interval) in enumerate(cases, start=1):
            r = await run_case(link, rid, count, size, interval)
            print(f"{label:30} {count:>7} {r['p50_us']:>8.0f} {r['p99_us']:>8.0f} {r['max_us']:>8.0f} "
                  f"{r['msgs_per_s']:>9.0f} {r['mb_per_s']:>8.1f}")  # fmt: skip
        print("(throughput rows: latency includes queueing behind earlier records)")
        await link.close()
    finally:
        stop_engine(proc, timeout_s=3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller suite")
    parser.add_argument("--role", choices=["gateway", "engine"], default="gateway", help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "engine":
        return run_engine(args.socket)
    asyncio.run(run_suite(args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
