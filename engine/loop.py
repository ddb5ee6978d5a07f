"""The engine loop: drain the inbound rings, schedule, execute, publish. One thread, one plan at a time.

    while serving:
        1. drain    every inbound record: Submit -> admit (every slot taken: it waits for one, engine.slot_wait),
                    text/flush/cancel/deadline -> scheduler
                    (blocks in the endpoint's epoll only when nothing ran and nothing is in flight)
        2. plan     finish the plans whose device work ended (their end event fired); admit waiting Submits
                    into freed slots; scheduler.plan(now, lanes with room): one work kind, a batch of rows
        3. execute  executors.launch(plan): kernels queued between two CUDA events, nothing waited for;
                    codec audio and EOS reads come back later through pinned memory (`deferred` plans)
        4. publish  Audio, then scheduler.complete(plan, outcome); Done / Error for every request that
                    ended; a Heartbeat every `heartbeat_s`

The host waits for the device only when every lane holds `max_in_flight` plans (it then blocks on the oldest),
or when nothing can be planned before a plan in flight ends: host planning of step k+1 overlaps step k. Lanes
(`engine.executors.inflight`): generation plans and codec plans are bounded apart, and the scheduler plans only
for a lane with room, so the host keeps the generation stream fed while a long codec plan runs beside it.
The scheduler never touches tensors or the clock, the executors never decide anything, the loop never
encodes bytes (engine.ipc does). Request ids: the gateway's ids are unique per link only, so each Submit
gets an engine-wide id here and a `Route` back to (link, gateway id).

Shutdown (SIGTERM via `request_shutdown`, or a Shutdown record): new Submits are refused, running
requests get until the grace deadline to finish, the rest fail with Error("shutdown"); then `serve`
returns 0. A link that dies has its requests cancelled and their slots freed at once. A plan whose
executor raises fails its rows (Error "internal"; a codec batch first reruns each row alone, so only rows
that fail by themselves fail); `MAX_FAILED_STEPS` failures in a row mean the device is broken, and `serve`
raises so the process exits non-zero.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from torch.profiler import record_function

from engine.executors import Executors, RequestInputs, StepResult
from engine.executors.inflight import DeviceTimeline, InFlight
from engine.gc_watch import process_watch
from engine.ipc.messages import (
    AppendText,
    Audio,
    Cancel,
    Deadline,
    Done,
    DoneReason,
    EndText,
    Error,
    Flush,
    Heartbeat,
    Inbound,
    Outbound,
    Ready,
    Shutdown,
    Submit,
)
from engine.request import FinishReason, Phase, RequestState, WorkKind
from engine.scheduling import Outcome, Plan, Scheduler
from engine.slot_wait import SlotWaitQueue, Waiting
from engine.stall_watch import StallWatch

log = logging.getLogger("engine")

INTERNAL_LINK = 0  # the warm-up request's route: its replies go nowhere
MAX_FAILED_STEPS = 3
DEFAULT_MAX_IN_FLIGHT = 2  # generation plans queued on the device at once: the host plans k+1 while k runs
DEFAULT_CODEC_IN_FLIGHT = 1  # codec-lane plans queued at once (engine.executors.inflight says why one)
DEFAULT_SLOT_WAIT_MS = 200.0  # a Submit that finds every slot taken waits this long for one (engine.slot_wait)
DEFAULT_STALL_DUMP_S = 5.0  # a loop silent this long writes every thread's stack to stderr (engine.stall_watch)


class Endpoint(Protocol):
    """What the loop needs of `engine.ipc.server.EngineEndpoint` (tests substitute an in-memory one)."""

    def poll(self, timeout_s: float | None) -> list[tuple[int, Inbound]]: ...
    def send_many(self, items: list[tuple[int, Outbound]]) -> None: ...
    def new_links(self) -> list[int]: ...
    def dead_links(self) -> list[int]: ...
    def links(self) -> list[int]: ...
    def pending_bytes(self, link_id: int) -> int: ...


@dataclass(slots=True)
class Route:
    link_id: int
    request_id: int  # the gateway's id on that link
    error_code: str = "internal"  # Error code if the request fails


class StepStats:
    """Per-kind batch sizes and host launch times since the last heartbeat (Heartbeat.step_stats)."""

    def __init__(self) -> None:
        self._sums: dict[WorkKind, list[float]] = {}
        self.max_batch: dict[WorkKind, int] = {}

    def record(self, plan: Plan, ms: float) -> None:
        sums = self._sums.setdefault(plan.kind, [0, 0.0, 0.0])
        sums[0] += 1
        sums[1] += len(plan.rows)
        sums[2] += ms
        self.max_batch[plan.kind] = max(self.max_batch.get(plan.kind, 0), len(plan.rows))

    def take(self) -> dict[str, tuple[float, float]]:
        """{kind: (mean batch, mean ms)} since the last call."""
        stats = {k.label: (s[1] / s[0], s[2] / s[0]) for k, s in self._sums.items()}
        self._sums = {}
        return stats


class EngineLoop:
    def __init__(self, scheduler: Scheduler, executors: Executors, ready: Ready, *, heartbeat_s: float = 1.0,
                 shutdown_grace_ms: int = 5000, clock: Callable[[], int] = time.monotonic_ns,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, codec_in_flight: int = DEFAULT_CODEC_IN_FLIGHT,
                 split_lanes: bool = True, slot_wait_ms: float = DEFAULT_SLOT_WAIT_MS,
                 stall_dump_s: float = DEFAULT_STALL_DUMP_S,
                 on_turn: Callable[[Plan | None], None] | None = None) -> None:  # fmt: skip
        """`max_in_flight` / `codec_in_flight`: plans the generation / codec lane may have queued on the device
        (`split_lanes` False: `max_in_flight` over both, the codec plans included) before the host waits for
        the oldest; `slot_wait_ms`: how long a Submit that finds every slot taken waits for one (as many may
        wait as there are KV slots; 0: refuse at once); `stall_dump_s`: while serving, a loop that sends no
        heartbeat for this long dumps every thread's stack to stderr (0: never); `on_turn(plan)`: called after
        every turn that ran (a profiler's step hook)."""
        self.waiting = SlotWaitQueue(slot_wait_ms, scheduler.config.max_requests)
        self.timeline = DeviceTimeline(max_in_flight, codec_in_flight=codec_in_flight,
                                       split_lanes=split_lanes)  # launched plans until they end; device time
        self.scheduler = scheduler
        self.executors = executors
        self.ready = ready
        self.heartbeat_s = heartbeat_s
        self.shutdown_grace_ms = shutdown_grace_ms
        self.clock = clock
        self.endpoint: Endpoint | None = None
        self.stats = StepStats()
        self.lifetime_max_batch: dict[WorkKind, int] = {}
        self._routes: dict[int, Route] = {}
        self._inputs: dict[int, RequestInputs] = {}
        self._ids: dict[tuple[int, int], int] = {}  # (link, gateway id) -> engine id
        self._next_id = 1
        self._outbox: list[tuple[int, Outbound]] = []
        self._shutdown_at_ns: int | None = None
        self._failed_steps = 0
        self._next_heartbeat = 0.0
        self.on_turn = on_turn
        self.stall_watch = StallWatch(stall_dump_s)
        self.on_close: Callable[[], None] | None = None  # at the end of `serve` (the profiler's summary)
        self.host_plan_s = 0.0  # host time in the scheduler's plan() (cumulative)
        self.host_launch_s = 0.0  # host time queueing plans on the device and completing those not deferred
        self.turns = 0

    @property
    def max_in_flight(self) -> int:
        return self.timeline.max_in_flight

    @max_in_flight.setter
    def max_in_flight(self, value: int) -> None:
        self.timeline.max_in_flight = value

    # ------------------------------------------------------------ the loop

    def serve(self, endpoint: Endpoint) -> int:
        """Serve links until shutdown completes; returns the exit status (0)."""
        self.endpoint = endpoint
        busy = False
        while not self._shutdown_complete():
            # Idle: block in epoll (zero CPU) until input, the next heartbeat or the shutdown deadline.
            self._drain(endpoint, timeout_s=0.0 if busy else self._idle_timeout_s())  # 1. drain
            busy = self.step()  # 2. plan, 3. execute, 4. publish
            self._heartbeat_if_due(endpoint)
            self._flush(endpoint)
        self.stall_watch.disarm()
        self.drain_device()
        self._fail_all("shutdown", "the engine shut down before the request finished")
        self._flush(endpoint)
        self._wait_for_backlog(endpoint, timeout_s=1.0)
        if self.on_close is not None:
            self.on_close()
        return 0

    def step(self) -> bool:
        """Steps 2-4 once: finish what the device completed, plan, launch; publish Audio and Done/Error (into
        `take_replies`). Never waits for the device unless every lane has `max_in_flight` plans queued, or
        nothing can be planned until one of them ends. False: idle (nothing planned, nothing in flight)."""
        finished = self.timeline.poll()
        if not self.timeline.open_lanes():  # far enough ahead everywhere: let the device catch up first
            finished += self.timeline.wait_oldest()
        self._finish(finished)
        self._retire()  # slots of requests that just ended are free for those waiting for one
        self._admit_waiting(self.clock())
        started = time.perf_counter()
        plan = self.scheduler.plan(self.clock(), self.timeline.open_lanes())  # 2. plan, for lanes with room
        planned = time.perf_counter()
        self.host_plan_s += planned - started
        if plan is not None:
            self._launch(plan)  # 3. execute (queued on the device)
            self.host_launch_s += time.perf_counter() - planned
        if plan is None and len(self.timeline):
            self._finish(self.timeline.wait_oldest())  # nothing can start before something in flight ends
        self._retire()  # 4. publish Done / Error, free what the request held
        if plan is not None:
            self.turns += 1
            if self.on_turn is not None:
                self.on_turn(plan)
        return plan is not None or len(self.timeline) > 0

    def drain_device(self) -> None:
        """Finish every plan in flight (warm-up, tests, shutdown)."""
        while len(self.timeline):
            self._finish(self.timeline.wait_oldest())
        self._retire()

    def take_replies(self) -> list[tuple[int, Outbound]]:
        """(link, record) pairs produced since the last call, in order."""
        replies, self._outbox = self._outbox, []
        return replies

    def request_state(self, link_id: int, request_id: int) -> RequestState | None:
        """The live state of a gateway request (None once it ended)."""
        engine_id = self._ids.get((link_id, request_id))
        return None if engine_id is None else self._inputs[engine_id].state

    def request_shutdown(self, grace_ms: int | None = None) -> None:
        """Stop admitting; fail what has not finished `grace_ms` from now. Safe from a signal handler."""
        grace = self.shutdown_grace_ms if grace_ms is None else max(0, grace_ms)
        deadline = self.clock() + grace * 1_000_000
        self._shutdown_at_ns = deadline if self._shutdown_at_ns is None else min(self._shutdown_at_ns, deadline)

    @property
    def shutting_down(self) -> bool:
        return self._shutdown_at_ns is not None

    # ------------------------------------------------------------ 1. drain

    def _drain(self, endpoint: Endpoint, timeout_s: float | None) -> None:
        messages = endpoint.poll(timeout_s)
        for link_id in endpoint.new_links():
            self._outbox.append((link_id, self.ready))
        for link_id in endpoint.dead_links():
            self._drop_link(link_id)
        now = self.clock()
        for link_id, msg in messages:
            self.handle(link_id, msg, now)

    def handle(self, link_id: int, msg: Inbound, now_ns: int) -> None:
        """Apply one inbound record (also the warm-up's way in)."""
        if isinstance(msg, Submit):
            self._submit(link_id, msg, now_ns)
            return
        if isinstance(msg, Shutdown):
            self.request_shutdown(msg.grace_ms)
            return
        engine_id = self._ids.get((link_id, msg.request_id))
        if engine_id is None:
            waiting = self.waiting.record(link_id, msg)  # kept for its admission (a Cancel removes it)
            if waiting is not None and isinstance(msg, Cancel):
                self._send(Route(link_id, msg.request_id), Done(msg.request_id, DoneReason.CANCELLED, 0, 0))
            return  # else a late record for a request that already ended: normal, nothing to answer
        if isinstance(msg, AppendText):
            self._append(engine_id, msg)
        elif isinstance(msg, EndText):
            self.scheduler.end_text(engine_id)
            if self._inputs[engine_id].state.phase is Phase.FAILED:  # the text ended without any text
                self._routes[engine_id].error_code = "bad_request"
        elif isinstance(msg, Flush):
            self.scheduler.flush(engine_id)
        elif isinstance(msg, Cancel):
            self.scheduler.cancel(engine_id)
        elif isinstance(msg, Deadline):
            self.scheduler.set_deadline(engine_id, msg.deadline_ns, msg.samples)

    def _submit(self, link_id: int, msg: Submit, now_ns: int) -> None:
        if self.shutting_down:
            self._refuse(link_id, msg.request_id, "shutting_down", "the engine is shutting down")
            return
        if (link_id, msg.request_id) in self._ids or self.waiting.find(link_id, msg.request_id):
            self._refuse(link_id, msg.request_id, "bad_request", f"request {msg.request_id} is already running")
            return
        try:
            shape = self.executors.check_submit(msg)
        except ValueError as error:
            self._refuse(link_id, msg.request_id, "bad_request", str(error))
            return
        waiting = Waiting(link_id, msg, shape.prefill_len, shape.prompt_trailing, now_ns, "")
        if len(self.waiting):  # others wait for a slot already: no overtaking
            self._wait_or_refuse(waiting, "every slot is in use and earlier requests wait for one")
            return
        if not self._admit(waiting, now_ns, may_wait=self.waiting.accepting):
            self.waiting.add(waiting)

    def _admit(self, waiting: Waiting, now_ns: int, may_wait: bool) -> bool:
        """Admit a Submit (its arrival: when it came), or refuse it; False: every slot is taken and it may wait
        (`may_wait`) for one."""
        link_id, msg = waiting.link_id, waiting.submit
        engine_id = self._next_id
        state = RequestState.from_submit(dataclasses.replace(msg, request_id=engine_id), waiting.prefill_len,
                                         waiting.since_ns, waiting.prompt_trailing)
        admission = self.scheduler.admit(state, now_ns)
        if not admission.ok:
            if admission.slots_full and may_wait:
                waiting.reason = admission.reason
                return False
            self._refuse(link_id, msg.request_id, admission.code, admission.reason)
            return True
        self._next_id += 1
        self._routes[engine_id] = Route(link_id, msg.request_id)
        self._inputs[engine_id] = RequestInputs(msg, state)
        self._ids[(link_id, msg.request_id)] = engine_id
        self.executors.open(engine_id, msg)
        for record in waiting.records:  # what its client sent while it waited for a slot, in order
            self.handle(link_id, record, now_ns)
        return True

    def _wait_or_refuse(self, waiting: Waiting, reason: str) -> None:
        if self.waiting.accepting:
            waiting.reason = reason
            self.waiting.add(waiting)
        else:
            self._refuse(waiting.link_id, waiting.submit.request_id, "overloaded", reason)

    def _admit_waiting(self, now_ns: int) -> None:
        """Offer the oldest waiting Submits the slots that freed; refuse those whose wait is over."""
        while (head := self.waiting.head()) is not None:
            if self.shutting_down:
                self.waiting.pop_head()
                self._refuse(head.link_id, head.submit.request_id, "shutting_down", "the engine is shutting down")
            elif self._admit(head, now_ns, may_wait=True):
                self.waiting.pop_head()
            elif self.waiting.expired(head, now_ns):
                self.waiting.pop_head()
                self._refuse(head.link_id, head.submit.request_id, "overloaded",
                             f"{head.reason} (waited {self.waiting.wait_ms:.0f} ms for one)")
            else:
                return  # still no slot: the rest wait behind it

    def _append(self, engine_id: int, msg: AppendText) -> None:
        try:
            self.executors.check_text_ids(msg.text_ids)
            self.scheduler.append_text(engine_id, msg.text_ids, msg.text_chars)
        except ValueError as error:
            self._routes[engine_id].error_code = "bad_request"
            self.scheduler.fail(engine_id, str(error))

    def _drop_link(self, link_id: int) -> None:
        """The gateway worker is gone: cancel its requests (slots are freed when they retire)."""
        self.waiting.remove_link(link_id)  # nobody to answer
        for engine_id, route in self._routes.items():
            if route.link_id == link_id:
                self.scheduler.cancel(engine_id)

    # ------------------------------------------------------------ 3. execute, 4. publish

    def _launch(self, plan: Plan) -> None:
        started = time.perf_counter()
        try:
            with record_function(f"plan:{plan.kind.label}"):  # the profiler's per-kind attribution; ~free otherwise
                step = self.executors.launch(plan, self._inputs)
            self._failed_steps = 0
        except Exception as error:  # noqa: BLE001 - the rows fail with the reason; repeated failure is fatal
            self._failed_steps += 1
            log.exception("%s step of %d rows failed", plan.kind.label, len(plan.rows))
            if self._failed_steps >= MAX_FAILED_STEPS:
                raise RuntimeError(f"{self._failed_steps} steps failed in a row; the device looks broken") from error
            message = f"{plan.kind.label} step failed: {type(error).__name__}: {error}"
            self._complete(plan, self._rerun_rows_alone(plan, message))
            return
        step.startup_pending = self.scheduler.startup_waiting
        self.timeline.add(step)
        if not step.deferred:
            self._complete(plan, step.finish())  # results stay on the device: the next step can follow at once
        self.stats.record(plan, (time.perf_counter() - started) * 1000)
        self.lifetime_max_batch[plan.kind] = max(self.lifetime_max_batch.get(plan.kind, 0), len(plan.rows))

    def _finish(self, steps: list[InFlight]) -> None:
        """Plans whose device work ended: deferred ones now read their results (audio, sampled tokens)."""
        for step in steps:
            if not step.deferred:
                continue
            try:
                result = step.finish()
            except Exception as error:  # noqa: BLE001 - host post-processing of these rows failed
                log.exception("%s results of %d rows failed", step.plan.kind.label, len(step.plan.rows))
                message = f"{step.plan.kind.label} step failed: {type(error).__name__}: {error}"
                result = StepResult(Outcome(failed={row.request_id: message for row in step.plan.rows}))
            self._complete(step.plan, result)

    def _complete(self, plan: Plan, result: StepResult) -> None:
        for request_id, pcm in result.audio.items():  # before complete(): it advances samples_published
            state, route = self._inputs[request_id].state, self._routes[request_id]
            if len(pcm):
                audio = Audio(route.request_id, state.samples_published, pcm.tobytes(), state.samples_published == 0)
                self._send(route, audio)
        self.scheduler.complete(plan, result.outcome, self.clock())

    def _rerun_rows_alone(self, plan: Plan, message: str) -> StepResult:
        """A failed batch fails only the rows that fail on their own. Codec chunks only: the eager codec
        writes a stream's state after its forward pass, so a failed batch changed nothing and each row can
        run again alone. Talker and code-predictor steps move KV caches and counters mid-step: no rerun."""
        if plan.kind is not WorkKind.CODEC_CHUNK or len(plan.rows) == 1:
            return StepResult(Outcome(failed={row.request_id: message for row in plan.rows}))
        failed: dict[int, str] = {}
        samples: dict[int, int] = {}
        audio = {}
        for row in plan.rows:
            alone = dataclasses.replace(plan, rows=(row,), padded_batch=1)
            try:
                result = self.executors.run(alone, self._inputs)
            except Exception as error:  # noqa: BLE001 - this row alone fails
                log.exception("codec_chunk of request %d failed on its own", row.request_id)
                failed[row.request_id] = f"codec_chunk step failed: {type(error).__name__}: {error}"
                continue
            samples.update(result.outcome.samples)
            audio.update(result.audio)
        if len(failed) < len(plan.rows):
            self._failed_steps = 0  # the device works: the failure belongs to the rows that failed alone
        return StepResult(Outcome(samples=samples, failed=failed), audio)

    def _retire(self) -> None:
        """Answer every request that ended and free what the executors hold for it."""
        for state in self.scheduler.pop_finished():
            route = self._routes.pop(state.request_id)
            del self._inputs[state.request_id]
            del self._ids[(route.link_id, route.request_id)]
            self.executors.close(state.request_id)
            for msg in _final_messages(state, route):
                self._send(route, msg)

    def _refuse(self, link_id: int, request_id: int, code: str, reason: str) -> None:
        self._send(Route(link_id, request_id), Error(request_id, code, reason))
        self._send(Route(link_id, request_id), Done(request_id, DoneReason.ERROR, 0, 0))

    def _fail_all(self, code: str, message: str) -> None:
        for waiting in self.waiting.take_all():
            self._refuse(waiting.link_id, waiting.submit.request_id, code, message)
        for engine_id, route in list(self._routes.items()):
            route.error_code = code
            self.scheduler.fail(engine_id, message)
        self._retire()

    def _send(self, route: Route, msg: Outbound) -> None:
        if route.link_id != INTERNAL_LINK:
            self._outbox.append((route.link_id, msg))

    def _flush(self, endpoint: Endpoint) -> None:
        if self._outbox:
            endpoint.send_many(self.take_replies())

    # ------------------------------------------------------------ lifecycle

    def _heartbeat_if_due(self, endpoint: Endpoint) -> None:
        now = time.monotonic()
        if now < self._next_heartbeat:
            return
        self._next_heartbeat = now + self.heartbeat_s
        self.stall_watch.arm()  # every heartbeat: silent for `stall_dump_s` from here on, the stacks go to stderr
        beat = Heartbeat(self.clock(), self.scheduler.active_count, self.queued_count(), self.heartbeat_stats())
        self._outbox.extend((link_id, beat) for link_id in endpoint.links())

    def heartbeat_stats(self) -> dict[str, tuple[float, float]]:
        """Step figures per kind, resource accounting as (free, total) under "slots.*" keys, admission's rules as
        (now, limit) under "admission.*", and cumulative totals under "gpu.*", "host.*" and "codec.*"."""
        stats = self.stats.take()
        s = self.scheduler
        stats["slots.kv"] = (float(s.kv_slots.free_count), float(s.kv_slots.size))
        stats["slots.codec"] = (float(s.codec_slots.free_count), float(s.codec_slots.size))
        pool = self.executors.codec.pool
        stats["slots.codec_state"] = (float(pool.free_slots), float(pool.slots))
        # Admission's two measured rules as (now, limit): how near the engine is to refusing newcomers, and why.
        stats["admission.pressure"] = (s.pressure, s.config.max_pressure)
        stats["admission.utilization"] = (s.realtime_utilization(s.generating_count), s.config.max_utilization)
        t = self.timeline
        for kind, ms in t.gpu_ms.items():  # cumulative since start: (plans finished, device seconds)
            stats[f"gpu.{kind}"] = (float(t.plans[kind]), ms / 1000)
        stats["host.plan"] = (float(self.turns), self.host_plan_s)  # the scheduler choosing batches, cumulative
        stats["host.launch"] = (float(self.turns), self.host_launch_s)  # queueing them on the device, cumulative
        stats["host.wait_gpu"] = (0.0, t.wait_ms / 1000)  # blocked on device events, cumulative
        gc_watch = process_watch()
        stats["host.gc"] = (float(gc_watch.collections), gc_watch.seconds)  # paused collecting garbage, cumulative
        for lane, count in t.codec_over_budget.items():
            stats[f"codec.over_budget.{lane.value}"] = (float(count), t.startup_codec_budget_ms)
        return stats

    def queued_count(self) -> int:
        """Requests not yet prefilled: waiting for a slot, for their turn or for their first text."""
        return len(self.waiting) + sum(1 for r in self.scheduler.requests if r.phase in (Phase.PREFILL,
                                       Phase.WAITING_TEXT) and r.frames_generated == 0 and r.text_fed == 0)

    def _idle_timeout_s(self) -> float:
        """Nothing to run: sleep in epoll until input, the next heartbeat, a paced request's resume time, or
        the shutdown deadline."""
        wake = self._next_heartbeat - time.monotonic()
        now = self.clock()
        if self._shutdown_at_ns is not None:
            wake = min(wake, (self._shutdown_at_ns - now) / 1e9)
        paced = self.scheduler.next_wake_ns(now)  # a request paced by its max_lead_ms resumes then
        if paced is not None:
            wake = min(wake, (paced - now) / 1e9)
        waited = self.waiting.deadline_ns()  # the oldest Submit waiting for a slot is refused then
        if waited is not None:
            wake = min(wake, (waited - now) / 1e9)
        return max(0.0, wake)

    def _shutdown_complete(self) -> bool:
        if self._shutdown_at_ns is None:
            return False
        return (not self._routes and not len(self.waiting)) or self.clock() >= self._shutdown_at_ns

    def _wait_for_backlog(self, endpoint: Endpoint, timeout_s: float) -> None:
        """Give gateway workers a moment to read the last replies before the links close."""
        deadline = time.monotonic() + timeout_s
        while any(endpoint.pending_bytes(link) for link in endpoint.links()) and time.monotonic() < deadline:
            endpoint.poll(0.01)

    def warm_up(self, submit: Submit, max_steps: int = 100_000) -> dict[WorkKind, int]:
        """Run one request through every work kind before serving; -> steps per kind. Raises on failure."""
        self.handle(INTERNAL_LINK, submit, self.clock())
        engine_id = self._ids.get((INTERNAL_LINK, submit.request_id))
        if engine_id is None:
            raise RuntimeError("the warm-up request was refused")
        state = self._inputs[engine_id].state
        steps: dict[WorkKind, int] = {}
        waits = 0
        while engine_id in self._routes and sum(steps.values()) < max_steps and waits < max_steps:
            now = self.clock()
            plan = self.scheduler.plan(now)
            if plan is None:
                wake = self.scheduler.next_wake_ns(now)  # e.g. codec rows gathering for a moment
                if wake is None:
                    break
                time.sleep(max(0, wake - now) / 1e9)
                waits += 1
                continue
            self._launch(plan)
            self.drain_device()
            steps[plan.kind] = steps.get(plan.kind, 0) + 1
        self.take_replies()
        if engine_id in self._routes or state.phase is not Phase.DONE or len(steps) < len(WorkKind):
            raise RuntimeError(f"warm-up ended in {state.phase.name} ({state.error}) after steps {steps}")
        self.stats.take()
        self.timeline = DeviceTimeline()
        self.host_plan_s = self.host_launch_s = 0.0
        self.turns = 0
        self.lifetime_max_batch.clear()
        self.scheduler.reset_history()  # cold first steps ran late: they must not count as load at admission
        return steps


def _final_messages(state: RequestState, route: Route) -> list[Outbound]:
    rid = route.request_id
    if state.phase is Phase.CANCELLED:
        return [Done(rid, DoneReason.CANCELLED, state.samples_published, state.frames_generated)]
    if state.phase is Phase.FAILED:
        return [Error(rid, route.error_code, state.error or "failed"),
                Done(rid, DoneReason.ERROR, state.samples_published, state.frames_generated)]
    if state.finish_reason is FinishReason.RUNAWAY:
        message = f"no end of speech after {state.frames_generated} frames; the runaway guard stopped it"
        return [Error(rid, "runaway", message),
                Done(rid, DoneReason.ERROR, state.samples_published, state.frames_generated)]
    return [Done(rid, DoneReason.COMPLETED, state.samples_published, state.frames_generated)]
