"""Engine processes: spawn, connect, supervise, restart, and route requests to them.

One `EngineSlot` per engine process (one per GPU). Its supervisor task runs the whole life cycle
in a loop: spawn the process -> connect an `EngineLink` over its Unix socket -> wait for `Ready`
-> serve until the link closes (the process died or hung) -> fail its in-flight requests (the link
pushes `Error(engine_died)` into every subscribed queue) -> kill what is left -> restart after a
back-off. Requests go to the ready engine where they are predicted to wait least (gateway/routing.py),
so with several engines a dead one fails only its own requests while the others keep serving. The pool
is ready once every engine has been ready, and from then on while at least one is.

Failing fast: an engine process that exits (or times out) before it says Ready is a failed start.
`START_ATTEMPTS` consecutive failed starts of one engine make the pool give up: it calls `on_failure`
with the engine's last stderr lines (the engine's stderr passes through `StderrTail` to ours), and the
server stops with a non-zero status (gateway/__main__.py) instead of restarting forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Sequence

from engine.ipc.client import ENGINE_DIED, LINK_CLOSED, EngineLink, LinkClosed, LinkFull
from engine.ipc.messages import Cancel, Error, Heartbeat, Inbound, Outbound, Ready, Shutdown, Submit
from engine.ipc.process import spawn_engine
from engine.ipc.segment import SharedMemoryFull
from gateway.engine_stderr import StderrTail
from gateway.gpus import engine_gpus
from gateway.metrics import GatewayMetrics
from gateway.routing import EngineLoad, choose, smoothed_frame_ms
from gateway.settings import Settings

log = logging.getLogger("vivace.engines")

RESTART_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # successive failures wait longer, capped at the last value
CONNECT_RETRY_S = 0.02
SHUTDOWN_GRACE_MS = 2000
START_ATTEMPTS = 3  # consecutive starts of one engine that end before Ready: the server gives up


@dataclasses.dataclass(frozen=True, slots=True)
class EngineStartFailure:
    """Why the pool gave up on an engine: it never became ready in `attempts` consecutive starts."""

    engine: int
    attempts: int
    reason: str  # of the last attempt
    stderr_tail: str  # the last lines the engine wrote to stderr

    def describe(self) -> str:
        text = f"engine {self.engine} failed to start {self.attempts} times in a row (last: {self.reason})"
        if self.stderr_tail:
            text += "; its last output:\n" + "\n".join(
                "  | " + line for line in self.stderr_tail.splitlines()
            )
        return text


class EngineUnavailable(RuntimeError):
    """No engine can take a request now (none ready, or the chosen one is gone or full)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class EngineRequest:
    """The gateway's handle on one engine request: send follow-up messages, read its replies."""

    def __init__(self, slot: EngineSlot, link: EngineLink, request_id: int) -> None:
        self.slot = slot
        self.generation = slot.generation  # a restart starts a new generation; its count starts at 0
        self.request_id = request_id
        self._link = link
        self.events: asyncio.Queue[Outbound] = link.subscribe(request_id)
        self.finished = False

    def send(self, msg: Inbound) -> None:
        """Forward AppendText/Flush/EndText/Deadline/Cancel; raises EngineUnavailable if it cannot."""
        if self.finished:
            return
        try:
            self._link.send(msg)
        except LinkClosed:
            raise EngineUnavailable("engine_died", "the engine serving this request stopped") from None
        except LinkFull:
            raise EngineUnavailable("engine_busy", "the engine's request queue is full; try again") from None

    def cancel(self) -> None:
        """Best effort: a dead engine has nothing left to cancel."""
        with contextlib.suppress(EngineUnavailable):
            self.send(Cancel(self.request_id))

    def release(self) -> None:
        """Called once the request ended (Done/Error seen) or was abandoned: stop routing to it."""
        if not self.finished:
            self.finished = True
            self._link.unsubscribe(self.request_id)
            if self.generation == self.slot.generation:
                self.slot.in_flight -= 1
                self.slot.metrics.engine_in_flight.set(self.slot.in_flight, self.slot.label)


class EngineSlot:
    """One engine process and its link, restarted by `supervise()` whenever it dies."""

    def __init__(
        self,
        index: int,
        settings: Settings,
        metrics: GatewayMetrics,
        socket_prefix: str,
        gpu: str | None = None,
        on_failure: Callable[[EngineStartFailure], None] | None = None,
    ) -> None:
        self.index = index
        self.label = str(index)
        self.settings = settings
        self.gpu = gpu  # this engine's CUDA_VISIBLE_DEVICES (gateway/gpus.py); None: the server's own
        self.metrics = metrics
        # Abstract namespace ("@"): no file to leak, gone with the listener.
        self.socket_path = f"{socket_prefix}-{index}"
        self.process: subprocess.Popen[bytes] | None = None
        self.link: EngineLink | None = None
        self.info: Ready | None = None
        self.in_flight = 0
        self.generation = 0
        self.restarts = 0
        self.ever_ready = False  # this engine said Ready at least once
        self.start_failures = 0  # consecutive starts that ended before Ready
        self.failure: EngineStartFailure | None = None
        self.stderr: StderrTail | None = None  # the running engine's stderr
        self.last_stderr = ""  # the tail of the last engine process's stderr
        self._on_failure = on_failure
        self.last_heartbeat: Heartbeat | None = None
        self.frame_ms: float | None = None  # smoothed frame time from heartbeats (gateway/routing.py)
        self._cumulative: dict[str, tuple[float, float]] = {}  # last engine totals per heartbeat key
        self._last_heartbeat_at = 0.0
        self._next_request_id = 1
        self._connect_error: str | None = None  # why the last link could not be made, if not "not listening"
        self._stopping = False
        self.ready_changed = asyncio.Event()

    @property
    def ready(self) -> bool:
        return self.link is not None and self.info is not None and not self.link.closed.done()

    @property
    def load(self) -> EngineLoad:
        queued = self.last_heartbeat.queued_requests if self.last_heartbeat is not None else 0
        return EngineLoad(self.in_flight, queued, self.frame_ms)

    def submit(self, submit: Submit) -> EngineRequest:
        link = self.link
        if link is None or not self.ready:
            raise EngineUnavailable("engine_unavailable", f"engine {self.index} is not ready")
        request_id = self._next_request_id
        self._next_request_id += 1
        request = EngineRequest(self, link, request_id)
        self.in_flight += 1
        self.metrics.engine_in_flight.set(self.in_flight, self.label)
        try:
            request.send(dataclasses.replace(submit, request_id=request_id))
        except EngineUnavailable:
            request.release()
            raise
        return request

    # ------------------------------------------------------------ life cycle

    async def supervise(self) -> None:
        failures = 0
        while not self._stopping:
            started = time.monotonic()
            reason, served = await self._run_once()
            if self._stopping:
                break
            if self.process is not None and self.process.returncode is not None:
                reason += f" (exit status {self.process.returncode})"
            self.start_failures = 0 if served else self.start_failures + 1
            if self.start_failures >= START_ATTEMPTS:
                self.failure = EngineStartFailure(self.index, self.start_failures, reason, self.last_stderr)
                log.error("giving up: %s", self.failure.describe())
                if self._on_failure is not None:
                    self._on_failure(self.failure)
                return
            self.restarts += 1
            self.metrics.engine_restarts_total.inc(self.label)
            failures = 0 if time.monotonic() - started > 30 else failures + 1
            backoff = RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)]
            log.warning("engine %d stopped (%s); restarting in %.1f s", self.index, reason, backoff)
            await asyncio.sleep(backoff)

    async def _run_once(self) -> tuple[str, bool]:
        """Spawn, connect, serve until the engine goes away; returns why, and whether it became ready."""
        env = dict(os.environ)
        env["VIVACE_ENGINE_INDEX"] = str(self.index)
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
        argv = self.settings.engine_command()
        on_gpu = "" if self.gpu is None else f"CUDA_VISIBLE_DEVICES={self.gpu} "
        log.info("starting engine %d: %s%s --socket %s", self.index, on_gpu, " ".join(argv), self.socket_path)
        self.stderr, write_fd = StderrTail.pipe()
        try:
            self.process = spawn_engine(argv, self.socket_path, env, stderr=write_fd)
        except OSError as error:
            self.process = None
            await self._dispose()
            return f"could not be started: {error}", False
        finally:
            os.close(write_fd)
        served = False
        try:
            link = await self._connect()
            if link is None:
                return self._connect_error or "exited before accepting a link", served
            self.link = link
            link.on_engine_message(self._on_engine_message)
            if not await self._await_ready(link):
                return (
                    "did not become ready in time" if not link.closed.done() else "closed before ready"
                ), served
            self._set_ready(True)
            log.info("engine %d ready on %s%s", self.index, self.info.device,
                     f" ({self.info.gpu_uuid})" if self.info.gpu_uuid else "")  # fmt: skip
            served = self.ever_ready = True
            return await self._serve(link), served
        finally:
            self._set_ready(False)
            await self._dispose()

    async def _connect(self) -> EngineLink | None:
        deadline = time.monotonic() + self.settings.engine_start_timeout_s
        assert self.process is not None
        self._connect_error = None
        while time.monotonic() < deadline and not self._stopping:
            if self.process.poll() is not None:
                return None
            try:
                return await EngineLink.connect(self.socket_path)
            except SharedMemoryFull as error:  # retrying will not help; a failed start
                self._connect_error = f"could not link to it: {error.strerror}"
                return None
            except OSError:  # not listening yet (or a handshake cut short by a dying engine)
                await asyncio.sleep(CONNECT_RETRY_S)
        return None

    async def _await_ready(self, link: EngineLink) -> bool:
        ready = asyncio.ensure_future(link.ready.wait())
        try:
            done, _ = await asyncio.wait(
                {ready, link.closed},
                timeout=self.settings.engine_start_timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ready.cancel()
        return ready in done and self.info is not None and not link.closed.done()

    async def _serve(self, link: EngineLink) -> str:
        """Wait for the link to close, or for the heartbeat to stop (a hung engine)."""
        self._last_heartbeat_at = time.monotonic()
        timeout = self.settings.engine_heartbeat_timeout_s
        while True:
            remaining = self._last_heartbeat_at + timeout - time.monotonic()
            if remaining <= 0:
                return f"no heartbeat for {timeout:.0f} s"
            with contextlib.suppress(asyncio.TimeoutError):
                return await asyncio.wait_for(asyncio.shield(link.closed), remaining)

    def _on_engine_message(self, msg: Outbound) -> None:
        if isinstance(msg, Ready):
            self.info = msg
        elif isinstance(msg, Heartbeat):
            before = self.last_heartbeat.step_stats if self.last_heartbeat is not None else None
            self.frame_ms = smoothed_frame_ms(self.frame_ms, msg.step_stats, before)
            self.last_heartbeat = msg
            self._last_heartbeat_at = time.monotonic()
            self.metrics.engine_active.set(msg.active_requests, self.label)
            self.metrics.engine_queued.set(msg.queued_requests, self.label)
            for kind, (first, second) in msg.step_stats.items():
                if kind.startswith("slots."):  # resource pools report (free, total), not (batch, ms)
                    pool = kind.removeprefix("slots.")
                    self.metrics.engine_slots_free.set(first, self.label, pool)
                    self.metrics.engine_slots_total.set(second, self.label, pool)
                elif kind.startswith("admission."):  # (now, limit)
                    measure = kind.removeprefix("admission.")
                    self.metrics.engine_admission.set(first, self.label, measure)
                    self.metrics.engine_admission_limit.set(second, self.label, measure)
                elif kind.startswith(("gpu.", "host.", "codec.")):  # cumulative since the engine started
                    self._count_cumulative(kind, first, second)
                else:
                    self.metrics.engine_batch_size.set(first, self.label, kind)
                    self.metrics.engine_step_seconds.set(second / 1000.0, self.label, kind)
        elif isinstance(msg, Error):
            log.error("engine %d reported %s: %s", self.index, msg.code, msg.message)

    def _count_cumulative(self, key: str, count: float, seconds: float) -> None:
        """Engine totals since its start -> gateway counters (a restarted engine starts again from zero)."""
        previous = self._cumulative.get(key, (0.0, 0.0))
        if count < previous[0] or seconds < previous[1]:
            previous = (0.0, 0.0)
        self._cumulative[key] = (count, seconds)
        delta_count, delta_seconds = count - previous[0], seconds - previous[1]
        group, name = key.split(".", 1)
        m = self.metrics
        if group == "gpu":
            m.engine_gpu_seconds_total.inc(self.label, name, amount=delta_seconds)
            m.engine_plans_total.inc(self.label, name, amount=delta_count)
        elif group == "host":
            m.engine_host_seconds_total.inc(self.label, name, amount=delta_seconds)
        elif name.startswith("over_budget."):  # codec.over_budget.<lane>
            m.engine_codec_over_budget_total.inc(self.label, name.split(".", 1)[1], amount=delta_count)

    def _set_ready(self, ready: bool) -> None:
        self.metrics.engine_ready.set(1.0 if ready else 0.0, self.label)
        if not ready:
            self.info = None
            self.in_flight = 0
            self.generation += 1
            self.metrics.engine_in_flight.set(0, self.label)
        self.ready_changed.set()

    async def _dispose(self) -> None:
        link, process = self.link, self.process
        self.link = None
        if link is not None:
            if not link.closed.done() and self._stopping:
                with contextlib.suppress(LinkClosed, LinkFull):
                    link.send(Shutdown(grace_ms=SHUTDOWN_GRACE_MS))
            if process is not None and self._stopping:
                await _wait_exit(process, SHUTDOWN_GRACE_MS / 1000 + 1.0)
            # Not stopping: the engine died or hung; its open requests learn that the engine died.
            await link.close(LINK_CLOSED if self._stopping else ENGINE_DIED)
        if process is not None and process.poll() is None:
            process.kill()
        if process is not None:
            await _wait_exit(process, 5.0)
        if self.stderr is not None:
            await self.stderr.close()
            self.last_stderr = self.stderr.tail()
            self.stderr = None

    async def stop(self) -> None:
        self._stopping = True


async def _wait_exit(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while process.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


class EnginePool:
    """All engine slots; the gateway's one entry point to the engines.

    `gpus`: each engine's CUDA_VISIBLE_DEVICES (default `engine_gpus(settings)`, which may raise).
    `on_failure` is called once, when the first engine fails to start `START_ATTEMPTS` times in a row.
    """

    def __init__(
        self,
        settings: Settings,
        metrics: GatewayMetrics,
        gpus: Sequence[str | None] | None = None,
        on_failure: Callable[[EngineStartFailure], None] | None = None,
    ) -> None:
        self.settings = settings
        self.failure: EngineStartFailure | None = None
        self._on_failure = on_failure
        prefix = f"@vivace-{os.getpid()}-{secrets.token_hex(4)}"
        gpus = engine_gpus(settings) if gpus is None else gpus
        self.slots = [
            EngineSlot(i, settings, metrics, prefix, gpus[i], self._failed) for i in range(settings.engines)
        ]
        self._tasks: list[asyncio.Task[None]] = []

    def _failed(self, failure: EngineStartFailure) -> None:
        if self.failure is None:
            self.failure = failure
            if self._on_failure is not None:
                self._on_failure(failure)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(slot.supervise(), name=f"engine-{slot.index}") for slot in self.slots
        ]

    @property
    def ready(self) -> bool:
        """Every engine has been ready (warm) at least once, and one of them is ready now."""
        if self.failure is not None:
            return False
        return all(slot.ever_ready for slot in self.slots) and any(slot.ready for slot in self.slots)

    @property
    def info(self) -> Ready | None:
        """What the engines serve (model id, speakers, languages), from any engine that said Ready."""
        return next((slot.info for slot in self.slots if slot.info is not None), None)

    async def wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.ready:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            waits = [asyncio.ensure_future(slot.ready_changed.wait()) for slot in self.slots]
            for slot in self.slots:
                slot.ready_changed.clear()
            await asyncio.wait(waits, timeout=min(remaining, 0.5), return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
        return True

    def submit(self, submit: Submit) -> EngineRequest:
        """Route a new request to the ready engine of least predicted wait (gateway/routing.py); the
        request_id is assigned there."""
        candidates = [slot for slot in self.slots if slot.ready]
        if not candidates:
            raise EngineUnavailable("engine_unavailable", "no engine is ready; try again shortly")
        return candidates[choose([slot.load for slot in candidates])].submit(submit)

    async def close(self) -> None:
        for slot in self.slots:
            await slot.stop()
            if slot.link is not None and not slot.link.closed.done():
                # Wake the supervisor: it is waiting on the link; shutting the engine down closes it.
                with contextlib.suppress(LinkClosed, LinkFull):
                    slot.link.send(Shutdown(grace_ms=SHUTDOWN_GRACE_MS))
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=SHUTDOWN_GRACE_MS / 1000 + 3.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for slot in self.slots:  # anything a cancelled supervisor left behind
            if slot.process is not None and slot.process.poll() is None:
                slot.process.kill()
                slot.process.wait()
            if slot.stderr is not None:
                await slot.stderr.close(wait_s=0.1)
                slot.stderr = None
