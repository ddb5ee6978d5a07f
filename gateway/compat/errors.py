"""The one error a compatible protocol's message parser raises: a vendor error code, a message, the context."""

from __future__ import annotations


class WireError(ValueError):
    def __init__(self, code: str, message: str, context_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.context_id = context_id
