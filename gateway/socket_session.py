"""The life cycle every gateway WebSocket session shares: nothing of a session outlives its socket.

Whatever ends a session (the client leaving, a close, a failure), its tasks end with it and every
engine request it still holds is cancelled and released. Around that, the rest both kinds of session
share: the per-session budgets (contexts, outbound bytes, appends), the send loop that drains the
`Outbox` in order, and drain (SIGTERM: no new contexts, live ones may finish until a deadline). What a
protocol says (its events, its errors, how it closes) is the subclass's: gateway/session.py for
`vivace.speech.v1`, gateway/compat/socket.py for the ElevenLabs and Cartesia sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.context import ContextTable
from gateway.limits import TokenBucket
from gateway.outbox import AudioOut, ContextText, LazyText, Outbox
from gateway.state import GatewayState


class SocketSession:
    """One accepted WebSocket: subclasses supply the receive loop, how audio is sent and the drain close."""

    subprotocol: str | None = None  # the WebSocket subprotocol `run` accepts the socket with

    def __init__(self, websocket: WebSocket, state: GatewayState) -> None:
        self.ws = websocket
        self.state = state
        self.limits = state.settings.limits
        self.metrics = state.metrics
        self.contexts = ContextTable(self.limits.max_contexts, state.metrics.contexts_active)
        self.outbox = Outbox(self.limits.max_outbound_bytes, state.metrics.outbound_bytes)
        self.appends = TokenBucket(self.limits.appends_per_second, self.limits.append_burst, time.monotonic())
        self.closing = asyncio.Event()
        self.draining = False

    # ------------------------------------------------------------ what a protocol supplies

    def _greet(self) -> None:
        """Queue what the session says first, once accepted (nothing unless the protocol says something)."""

    async def _receive_loop(self) -> None:
        """Read and apply the client's messages until it leaves or the session closes."""
        raise NotImplementedError

    async def _send_audio(self, item: AudioOut) -> None:
        """Write one queued audio item of a context that is not cancelled, and account for it."""
        raise NotImplementedError

    def _close_drained(self) -> None:
        """Drain's deadline has come (or no context is left): end what is live and close 1001."""
        raise NotImplementedError

    # ------------------------------------------------------------ life cycle

    async def run(self) -> None:
        await self.ws.accept(subprotocol=self.subprotocol)
        # state.sessions is typed with the native Session; every socket session is drained alike.
        self.state.sessions.add(self)  # type: ignore[arg-type]
        self.metrics.sessions_active.inc()
        self._greet()
        sender = asyncio.create_task(self._send_loop())
        receiver = asyncio.create_task(self._receive_loop())
        closing = asyncio.create_task(self.closing.wait())
        try:
            await asyncio.wait({sender, receiver, closing}, return_when=asyncio.FIRST_COMPLETED)
            if self.closing.is_set() and not sender.done():
                await asyncio.wait({sender}, timeout=self.limits.slow_reader_grace_s)
        finally:
            for task in (sender, receiver, closing):
                task.cancel()
            self._abandon_contexts()
            await asyncio.gather(sender, receiver, closing, return_exceptions=True)
            self.state.sessions.discard(self)  # type: ignore[arg-type]
            self.metrics.sessions_active.dec()

    def _abandon_contexts(self) -> None:
        """Disconnect or close: cancel every engine request at once and free everything."""
        for ctx in list(self.contexts.live.values()):
            if ctx.request is not None:
                ctx.request.cancel()
                ctx.request.release()
            if ctx.pump is not None:
                ctx.pump.cancel()
            self.contexts.finish(ctx, "abandoned")
        self.outbox.drop_audio()

    async def drain(self, deadline: float) -> None:
        """SIGTERM: no new contexts; live ones may finish until `deadline` (monotonic s); then close 1001."""
        self.draining = True
        while self.contexts.live and time.monotonic() < deadline and not self.closing.is_set():
            self.contexts.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.contexts.changed.wait(), deadline - time.monotonic())
        self._close_drained()

    def _producing(self) -> bool:
        """Whether some context is still producing or sending audio (then the session is not idle)."""
        return (
            any(ctx.ended and not ctx.finished for ctx in self.contexts.live.values())
            or self.outbox.bytes > 0
        )

    # ------------------------------------------------------------ sending

    async def _send_loop(self) -> None:
        try:
            while True:
                item = await self.outbox.get()
                if isinstance(item, AudioOut):
                    if item.context.cancelled:
                        continue  # barge-in: queued audio of a cancelled context is dropped
                    await self._send_audio(item)
                elif isinstance(item, str):
                    await self.ws.send_text(item)
                elif isinstance(item, LazyText):
                    await self.ws.send_text(item.render())
                elif isinstance(item, ContextText):
                    if not item.context.cancelled:
                        await self.ws.send_text(item.text)
                else:
                    await self.ws.close(item.code, item.reason)
                    return
        except (WebSocketDisconnect, RuntimeError, OSError):
            return  # the client went away; run() cleans up
