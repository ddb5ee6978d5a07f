"""Chunk sizing as the scheduler runs it: the slack policy's shortcuts give the plain rule's answers, and the
scheduler's own (inlined) reading of a request gives the chunks `request_chunk_frames` gives."""

from __future__ import annotations

from collections import Counter

from engine.request import Phase, RequestState, WorkKind
from engine.scheduling import CostModel, Plan, Scheduler, SchedulerConfig, SlackChunkPolicy
from engine.scheduling import simulate as simulate_module
from engine.scheduling.chunk_sizing import request_chunk_frames
from engine.scheduling.costmodel import COSTS_DIR
from engine.scheduling.pacing import Pace, pace_of
from engine.scheduling.plan import ALL_LANES, Lane
from engine.scheduling.simulate import Workload, load_prompts, simulate

from .helpers import COSTS

# Batch-1 codec costs that fall as frames grow (2 frames cost more than 4): the policy's one-wait shortcut
# does not hold for such a table, so every larger size must be weighed.
NON_MONOTONE = CostModel({
    "talker_decode": {"batch": [1], "ms": [1.0]}, "code_predict": {"batch": [1], "ms": [1.0]},
    "talker_prefill": {"tokens": [16], "ms": [1.0]},
    "codec_chunk": {"batch": [1], "frames": [1, 4, 8, 25], "ms": [[3.0, 1.0, 2.5, 0.5]]},
})  # fmt: skip


def _plain_rule(policy: SlackChunkPolicy, costs: CostModel, frames_decoded: int, frames_available: int,
                buffered_ms: float, frame_interval_ms: float) -> int:
    """The policy's rule as its docstring says it: the largest size whose wait for missing frames and decode end
    `margin_ms` before the buffer runs dry (0: wait for its frames), else what exists in an allowed size."""
    pending = frames_available - frames_decoded
    if pending <= 0:
        return 0
    for n in sorted(policy.sizes, reverse=True):
        decode_ms = costs.ms(WorkKind.CODEC_CHUNK, 1, n)
        if max(0, n - pending) * frame_interval_ms + decode_ms <= buffered_ms - policy.margin_ms:
            return n if pending >= n else 0
    return max((n for n in policy.sizes if n <= pending), default=pending)


def test_the_slack_policy_gives_the_plain_rules_chunk_whether_or_not_longer_chunks_cost_more():
    for costs in (COSTS, CostModel.load(COSTS_DIR / "h200_fast.json"), NON_MONOTONE):
        policy = SlackChunkPolicy(costs)
        differ = []
        for pending in range(1, 32):
            for interval in (0.0, 0.05, 0.4, 3.0, 12.0, 80.0, 250.0):
                for buffered in [b / 4 for b in range(0, 12_000, 13)]:
                    got = policy.next_chunk_frames(5, 5 + pending, buffered, False, interval)
                    if got != _plain_rule(policy, costs, 5, 5 + pending, buffered, interval):
                        differ.append((pending, interval, buffered, got))
        assert not differ, (costs.name, differ[:5])


def _paced(scheduler: Scheduler, r: RequestState, now_ns: int) -> bool:
    """Whether pacing holds `r`'s generation back now (its pending frames then drain)."""
    generating = r.phase in (Phase.PREFILL, Phase.CODE_PREDICT, Phase.TALKER_DECODE)
    return scheduler.pacing_allowed and generating and pace_of(r, now_ns)[0] is not Pace.FREE


class _CheckedScheduler(Scheduler):
    """The scheduler, checked before every plan: the codec chunk it offers each request (its work items on both
    lanes) is the one `request_chunk_frames` gives, and it offers one to every request given one. Some streams
    flush now and then, so every reason to drain comes up."""

    offers_seen: Counter[str] = Counter()

    def plan(self, now_ns: int, lanes: frozenset[Lane] = ALL_LANES) -> Plan | None:
        for r in self.requests:
            if r.request_id % 5 == 0 and r.frames_generated > r.frames_decoded + 2 and not r.is_ended:
                self.flush(r.request_id)
        expected = {r.request_id: request_chunk_frames(r, now_ns, self.slack_chunks, None, _paced(self, r, now_ns))
                    for r in self.requests if not r.codec_busy}
        offered = {i.request.request_id: i.shape for i in self._ready_items(now_ns)
                   if i.kind is WorkKind.CODEC_CHUNK and not i.early}
        assert offered == {rid: chunk for rid, chunk in expected.items() if chunk}, now_ns
        for r in self.requests:
            if r.request_id in offered:
                self.offers_seen["flush" if r.flush_pending else "waiting_text" if r.phase is Phase.WAITING_TEXT
                               else "finishing" if r.phase is Phase.FINISHING else "paced" if _paced(self, r, now_ns)
                               else "playing" if r.first_audio_ns else "new"] += 1  # fmt: skip
        return super().plan(now_ns, lanes)


def test_the_scheduler_offers_every_request_the_codec_chunk_request_chunk_frames_gives(monkeypatch):
    monkeypatch.setattr(simulate_module, "Scheduler", _CheckedScheduler)
    _CheckedScheduler.offers_seen = Counter()
    config = SchedulerConfig()
    load = Workload(30.0, duration_s=3.0, seed=4, text_mode="words", words_per_s=6.0, max_lead_ms=1000)
    result = simulate(load, config, COSTS, load_prompts())
    assert result.completed == result.offered - result.refused > 30
    seen = _CheckedScheduler.offers_seen
    assert all(seen[state] for state in ("flush", "waiting_text", "finishing", "paced", "playing", "new")), seen
