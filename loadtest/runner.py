"""The open-loop driver: dispatch every scheduled arrival on time, whatever is still in flight.

Arrivals never wait for completions: each one starts its own task at its scheduled moment. When
`max_concurrency` requests are already in flight, the arrival is recorded as a `max_concurrency`
error instead of being delayed (delaying it would turn the test into a closed loop). The driver
also watches itself: event-loop lag (how late a 5 ms timer fires) and CPU use, so every summary
shows whether the generator kept up.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Protocol

from loadtest.metrics import RequestRecord, fill_record
from loadtest.schedule import Arrival
from loadtest.trace import RequestFailed, StreamTrace

_START_LEAD_S = 0.05  # schedule time zero slightly ahead so the first arrival is not already late
_MONITOR_PERIOD_S = 0.005


class SpeechTransport(Protocol):
    async def synthesize(self, text: str, trace: StreamTrace) -> None: ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class ClientStats:
    """How the generator itself behaved during the run."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    loop_lag_ms: list[float] = field(default_factory=list)
    peak_in_flight: int = 0

    @property
    def cpu_utilization(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


async def run_schedule(
    schedule: list[Arrival],
    transport: SpeechTransport,
    *,
    sample_rate: int,
    timeout_s: float,
    max_concurrency: int,
) -> tuple[list[RequestRecord], ClientStats]:
    """Send every arrival of `schedule`; return one record per arrival (in schedule order) and stats."""
    loop = asyncio.get_running_loop()
    stats = ClientStats()
    records = [
        RequestRecord(a.index, a.phase, a.prompt.id, len(a.prompt.text), round(a.at_s, 6)) for a in schedule
    ]
    in_flight: set[asyncio.Task[None]] = set()
    monitor_stop = asyncio.Event()
    cpu_start, wall_start = time.process_time(), time.monotonic()
    monitor = asyncio.create_task(_watch_loop(stats.loop_lag_ms, monitor_stop))
    run_start = loop.time() + _START_LEAD_S

    async def one(arrival: Arrival, record: RequestRecord) -> None:
        trace = StreamTrace(sample_rate)
        error: RequestFailed | None = None
        try:
            async with asyncio.timeout(timeout_s):
                await transport.synthesize(arrival.prompt.text, trace)
        except RequestFailed as exc:
            error = exc
        except TimeoutError:
            error = RequestFailed("timeout", f"no complete response within {timeout_s:g} s")
        except Exception as exc:  # a transport bug must not take the whole run down; it is reported
            error = RequestFailed("client_bug", f"{type(exc).__name__}: {exc}")
        fill_record(record, trace, run_start, error)

    try:
        for arrival, record in zip(schedule, records, strict=True):
            delay = run_start + arrival.at_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(in_flight) >= max_concurrency:
                record.error_kind = "max_concurrency"
                record.error_message = f"{max_concurrency} requests already in flight; arrival dropped"
                continue
            task = asyncio.create_task(one(arrival, record))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            stats.peak_in_flight = max(stats.peak_in_flight, len(in_flight))
        if in_flight:
            await asyncio.gather(*in_flight)
    finally:
        for task in in_flight:
            task.cancel()
        monitor_stop.set()
        await monitor
        stats.cpu_s = time.process_time() - cpu_start
        stats.wall_s = time.monotonic() - wall_start
    return records, stats


async def _watch_loop(lags_ms: list[float], stop: asyncio.Event) -> None:
    """Record how late a short timer fires: the event loop's responsiveness, in ms."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + _MONITOR_PERIOD_S
        await asyncio.sleep(_MONITOR_PERIOD_S)
        lags_ms.append(max(0.0, (loop.time() - due) * 1000.0))
