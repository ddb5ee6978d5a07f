"""Profile the engine loop for a bounded number of steps under live load; keep only summary tables.

The engine loop owns one `StepProfiler` (when profiling is asked for) and calls `turn()` once at the
END of every loop turn, with the work kind that turn executed (None for an idle turn):

    profiler = StepProfiler(out_dir, start_after_s=30.0, steps=300)   # engine start-up, off the hot path
    while serving:
        ...drain, plan, execute, publish...
        profiler.turn(time.monotonic(), plan.kind.label if plan else None)
    profiler.close()                                                  # on shutdown: stop, summarise

and wraps each plan execution in `torch.profiler.record_function(f"plan:{kind}")` so the summary can
attribute GPU time to work kinds (a record_function outside a profile costs next to nothing).

Life cycle, all driven by `turn()`:
  waiting    the clock starts at the first turn that did work (`from_first_work=True`, default: the
             first real request, so model load, graph capture and warm-up never count) or at the
             first turn of any kind (`from_first_work=False`: engine start); `start_after_s` later
             the torch profiler starts (CPU activity always, CUDA where `torch.cuda.is_available()`);
  recording  for `steps` turns that did work (idle turns pass uncounted), or `max_record_s`,
             whichever comes first;
  done       the profiler stops (one device sync), the Chrome trace goes to a hidden file in
             `out_dir`, and `engine.profile_summary` turns it into `profile_summary.txt` and
             `profile_summary.json` (written last: its presence means complete), then deletes the
             trace unless `keep_trace` (device files come back capped at 16 MiB; summaries are KBs).
             With `summarize="subprocess"` (default) that reduction runs in a child process, so the
             loop resumes right after the trace is saved; `"inline"` does it in the calling thread.

Cost: nothing while waiting or done (two comparisons per turn); while recording, the profiler's own
overhead. Stopping and saving the trace stalls the loop once (typically well under a second for a
few hundred steps; longer with thousands of kernels per step): a run that profiles should raise the
gateway's engine heartbeat timeout. torch is imported only when recording starts, so importing this
module costs nothing and works on any machine.

Suggested engine flags (the loop's owner adds them): `--profile-dir DIR`, `--profile-after-s 30`,
`--profile-steps 300`.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent


class StepProfiler:
    """See the module docstring. `state` is "waiting", "recording" or "done"."""

    def __init__(
        self,
        out_dir: str | Path,
        start_after_s: float = 30.0,
        steps: int = 300,
        *,
        from_first_work: bool = True,
        max_record_s: float = 60.0,
        summarize: str = "subprocess",
        keep_trace: bool = False,
        top: int = 30,
    ) -> None:
        if steps < 1 or start_after_s < 0 or max_record_s <= 0:
            raise ValueError("steps must be >= 1, start_after_s >= 0 and max_record_s > 0")
        if summarize not in ("subprocess", "inline"):
            raise ValueError(f"summarize must be 'subprocess' or 'inline', got {summarize!r}")
        self.out_dir = Path(out_dir)
        self.start_after_s, self.steps, self.max_record_s = start_after_s, steps, max_record_s
        self.from_first_work, self.summarize, self.keep_trace, self.top = (
            from_first_work, summarize, keep_trace, top,
        )  # fmt: skip
        self.state = "waiting"
        self.summarizer: subprocess.Popen[bytes] | None = None
        self._origin: float | None = None
        self._started_at = 0.0
        self._turns = 0
        self._kinds: Counter[str] = Counter()
        self._profile: Any = None
        self._start_cost_s = 0.0
        self._device: str | None = None

    def turn(self, now_s: float, kind: str | None) -> None:
        """Once per loop turn, at its end: `now_s` from time.monotonic(), `kind` the work done (None: idle)."""
        if self.state == "done":
            return
        if self.state == "waiting":
            if self._origin is None:
                if kind is None and self.from_first_work:
                    return
                self._origin = now_s
            if now_s - self._origin >= self.start_after_s:
                self._start(now_s)
            return
        self._turns += 1
        if kind is not None:
            self._kinds[kind] += 1
        if sum(self._kinds.values()) >= self.steps or now_s - self._started_at >= self.max_record_s:
            self._finish(now_s, "steps" if sum(self._kinds.values()) >= self.steps else "max_record_s")

    def close(self) -> None:
        """Stop a recording in progress and summarise what it has (call on shutdown); else nothing."""
        if self.state == "recording":
            self._finish(time.monotonic(), "closed")
        self.state = "done"

    # ------------------------------------------------------------------------------------------

    def _start(self, now_s: float) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
            self._device = torch.cuda.get_device_name()
        options: dict[str, Any] = {"activities": activities, "record_shapes": False, "with_stack": False}
        try:  # host-side sync waits as their own events, where this torch has the option
            options["experimental_config"] = torch._C._profiler._ExperimentalConfig(
                enable_cuda_sync_events=True
            )
            self._profile = profile(**options)
        except (AttributeError, TypeError):
            options.pop("experimental_config", None)
            self._profile = profile(**options)
        began = time.monotonic()
        self._profile.start()
        self._start_cost_s = time.monotonic() - began
        self._started_at = now_s + self._start_cost_s  # `now_s` is on the monotonic clock
        self.state = "recording"
        log.info(
            "profiling the next %d work steps (at most %.0f s) into %s",
            self.steps,
            self.max_record_s,
            self.out_dir,
        )

    def _meta(self, now_s: float, reason: str, stop_started: float) -> dict[str, Any]:
        return {
            "reason": reason,
            "work_steps": sum(self._kinds.values()),
            "turns": self._turns,
            "steps_by_kind": dict(sorted(self._kinds.items())),
            "recorded_s": round(now_s - self._started_at, 3),
            "started_after_s": self.start_after_s,
            "clock_from": "first work" if self.from_first_work else "first turn",
            "device": self._device or "cpu",
            "profiler_start_s": round(self._start_cost_s, 3),
            "stop_and_save_s": round(time.monotonic() - stop_started, 3),
            "pid": os.getpid(),
        }

    def _finish(self, now_s: float, reason: str) -> None:
        stop_started = time.monotonic()
        self._profile.stop()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        trace = self.out_dir / f".trace-{os.getpid()}.json"
        self._profile.export_chrome_trace(str(trace))
        self._profile = None
        self.state = "done"
        meta = self._meta(now_s, reason, stop_started)
        log.info("profile stopped (%s) after %d work steps in %.1f s; summarising into %s",
                 reason, meta["work_steps"], meta["recorded_s"], self.out_dir)  # fmt: skip
        command = [sys.executable, "-m", "engine.profile_summary", str(trace), "--out", str(self.out_dir),
                   "--meta", json.dumps(meta), "--top", str(self.top)]  # fmt: skip
        if not self.keep_trace:
            command.append("--delete-trace")
        if self.summarize == "inline":
            from engine.profile_summary import main

            main(command[3:])
            return
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        )
        with (self.out_dir / "profile_summary.log").open("wb") as output:
            # Its own session: stopping the server's process group must not cut a summary in half.
            self.summarizer = subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT,
                                               start_new_session=True)  # fmt: skip


class HostProfiler(StepProfiler):
    """The same window over the loop's turns, recorded by Python's `cProfile` instead of the torch profiler:
    where the host's time goes function by function (the scheduler's planning, the executors' launches, the
    publishing), which the torch profiler shows only as gaps between torch ops. Writes `host_profile.txt`
    (the top functions by self time and by cumulative time) and `host_profile.json` (the same rows, written
    last: its presence means complete). cProfile slows every Python call while it records, so its absolute
    times are inflated; the shares are what it is for. Constructor as `StepProfiler` (`summarize`
    and `keep_trace` do not apply: the tables are written at once, in the loop's thread)."""

    def _start(self, now_s: float) -> None:
        import cProfile

        began = time.monotonic()
        self._profile = cProfile.Profile()
        self._profile.enable()
        self._start_cost_s = time.monotonic() - began
        self._started_at = now_s + self._start_cost_s
        self.state = "recording"
        log.info("host-profiling the next %d work steps (at most %.0f s) into %s",
                 self.steps, self.max_record_s, self.out_dir)  # fmt: skip

    def _finish(self, now_s: float, reason: str) -> None:
        import pstats

        stop_started = time.monotonic()
        self._profile.disable()
        stats = pstats.Stats(self._profile)
        self._profile = None
        self.state = "done"
        rows = host_rows(stats)
        meta = self._meta(now_s, reason, stop_started)
        recorded_ms = max(meta["recorded_s"] * 1000, 1e-9)
        by_self = sorted(rows, key=lambda row: -row["self_ms"])[: self.top]
        by_cumulative = sorted(rows, key=lambda row: -row["cumulative_ms"])[: self.top]
        lines = [f"host profile: {meta['work_steps']} work steps in {meta['recorded_s']:.1f} s ({reason}); "
                 f"times inflated by cProfile, shares of the {recorded_ms:.0f} ms recorded", ""]  # fmt: skip
        for title, table in (("top functions by self time", by_self), ("top functions by cumulative time", by_cumulative)):
            lines += [title, f"{'calls':>9} {'self ms':>9} {'cum ms':>9} {'cum %':>6}  function"]
            lines += [f"{row['calls']:>9} {row['self_ms']:>9.1f} {row['cumulative_ms']:>9.1f} "
                      f"{100 * row['cumulative_ms'] / recorded_ms:>6.1f}  {row['function']}" for row in table]  # fmt: skip
            lines.append("")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "host_profile.txt").write_text("\n".join(lines), encoding="utf-8")
        partial = self.out_dir / ".host_profile.json"
        partial.write_text(json.dumps({"meta": meta, "by_self": by_self, "by_cumulative": by_cumulative}, indent=1),
                           encoding="utf-8")  # fmt: skip
        partial.replace(self.out_dir / "host_profile.json")
        log.info("host profile stopped (%s) after %d work steps in %.1f s; tables in %s",
                 reason, meta["work_steps"], meta["recorded_s"], self.out_dir)  # fmt: skip


def host_rows(stats: Any) -> list[dict[str, Any]]:
    """pstats entries -> rows {function: "path:line(name)" (paths inside the repository relative to it),
    calls, self_ms, cumulative_ms}."""
    rows = []
    for (path, line, name), (_, calls, self_s, cumulative_s, _) in stats.stats.items():
        where = path
        if path.startswith(str(REPO) + os.sep):
            where = os.path.relpath(path, REPO)
        function = f"{where}:{line}({name})" if line else f"{where}({name})" if where != "~" else name
        rows.append({"function": function, "calls": calls, "self_ms": round(self_s * 1000, 3),
                     "cumulative_ms": round(cumulative_s * 1000, 3)})  # fmt: skip
    return rows
