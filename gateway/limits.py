"""Explicit per-session limits and the token bucket that enforces the append rate.

Every limit here is documented in docs/protocol.md, announced in `session.created.limits`, and
has its own error code (see `gateway/protocol.py`). Defaults follow ecosystem.md section 6.1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True, slots=True)
class Limits:
    max_message_bytes: int = 64 * 1024  # one client text frame (UTF-8 bytes); bigger: close 1009
    max_text_chars: int = 64 * 1024  # characters of text per context (and per HTTP request)
    max_contexts: int = 8  # live contexts per socket
    appends_per_second: float = 400.0  # sustained input_text.append rate per socket
    append_burst: int = 800  # appends allowed at once before the rate applies
    idle_timeout_s: float = 60.0  # no client event while no context is producing audio: close 1008
    max_outbound_bytes: int = 4 * 1024 * 1024  # audio+events queued for a socket that is not read
    slow_reader_grace_s: float = 2.0  # after a slow_reader error, how long the close may take

    def public(self) -> dict[str, float | int]:
        """The shape sent to clients in `session.created.limits`."""
        return asdict(self)

    @classmethod
    def parse_overrides(cls, items: list[str]) -> Limits:
        """Build from `name=value` strings (CLI `--limit`, env `VIVACE_LIMIT`, comma separated)."""
        known = {f.name: f for f in fields(cls)}
        values: dict[str, float | int] = {}
        for item in items:
            name, sep, raw = item.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in known:
                raise ValueError(f"unknown limit {item!r}; known limits: {', '.join(known)}")
            kind = int if known[name].type in ("int", int) else float
            try:
                number = kind(raw.strip())
            except ValueError:
                raise ValueError(f"limit {name} needs a {kind.__name__}, got {raw!r}") from None
            if number <= 0:
                raise ValueError(f"limit {name} must be positive, got {raw!r}")
            values[name] = number
        return cls(**values)  # type: ignore[arg-type]


class TokenBucket:
    """Classic token bucket; `now` is passed in (seconds) so tests drive time explicitly."""

    def __init__(self, rate_per_s: float, burst: int, now: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = float(burst)
        self._tokens = float(burst)
        self._updated = now

    def take(self, now: float) -> bool:
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate_per_s)
        self._updated = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
