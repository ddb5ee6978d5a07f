"""The engine side of a session's contexts: text and deadlines go to the engine, its replies become frames.

A context's engine request is submitted with its first piece of text; later text, flushes, the end
and playback deadlines are sent on it. One pump task per context reads the request's replies
(Audio/Done/Error) and queues audio frames and the closing `context.done` on the session's outbox.
An engine failure ends only its context: an `error` event, then `context.done` with reason "error";
a context the client already cancelled ends "cancelled" even if its engine fails before confirming.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from engine.ipc.messages import AppendText as EngineAppendText
from engine.ipc.messages import Audio, Deadline, Done, DoneReason, EndText, Error, Flush
from gateway import protocol as p
from gateway.audio import OPUS_PACKET_SAMPLES
from gateway.context import Context, ContextTable
from gateway.engines import EngineRequest, EngineUnavailable
from gateway.outbox import AudioOut, ContextText, LazyText, Outbox
from gateway.state import GatewayState
from gateway.textstream import Piece


class Synthesis:
    """Drives the engine requests of one session's contexts; `on_overflow` runs when audio does not fit."""

    def __init__(
        self, state: GatewayState, outbox: Outbox, contexts: ContextTable, on_overflow: Callable[[], None]
    ) -> None:
        self.state = state
        self.metrics = state.metrics
        self.outbox = outbox
        self.contexts = contexts
        self._on_overflow = on_overflow

    # ------------------------------------------------------------ to the engine

    def send_text(self, ctx: Context, piece: Piece, *, ended: bool) -> None:
        if ctx.request is not None:
            self.send(ctx, EngineAppendText(ctx.request.request_id, piece.ids, piece.chars))
            return
        submit = ctx.submit(piece, ended=ended)
        try:
            ctx.request = self.state.pool.submit(submit)
        except EngineUnavailable as exc:
            self.fail(ctx, exc.code, str(exc), "server_error")
            return
        ctx.pump = asyncio.create_task(self._pump(ctx, ctx.request))

    def send(self, ctx: Context, msg: EngineAppendText | Flush | EndText | Deadline) -> None:
        assert ctx.request is not None
        try:
            ctx.request.send(msg)
        except EngineUnavailable as exc:
            ctx.request.cancel()
            self.fail(ctx, exc.code, str(exc), "server_error")

    def flush(self, ctx: Context) -> None:
        """Send the text held back so far and ask the engine to speak everything received, now."""
        piece = ctx.text.flush()
        if piece is not None:
            self.send_text(ctx, piece, ended=False)
        if ctx.request is not None and not ctx.finished:
            self.send(ctx, Flush(ctx.request.request_id))

    def end(self, ctx: Context) -> bool:
        """The context takes no more text: send the rest and end its input. False when nothing was ever
        said (no engine request exists nor will): the session finishes that context itself."""
        ctx.ended = True
        piece = ctx.text.flush()
        if ctx.request is None:
            if piece is None:
                return False
            self.send_text(ctx, piece, ended=True)
            return True
        if piece is not None:
            self.send_text(ctx, piece, ended=False)
        if not ctx.finished:
            self.send(ctx, EndText(ctx.request.request_id))
        return True

    def update_deadline(self, ctx: Context, now_ns: int, source: str) -> None:
        if ctx.request is None or ctx.finished or ctx.cancelled:
            return
        due = ctx.deadline_due(now_ns)
        if due is None:
            return
        deadline, samples = due
        self.metrics.deadlines_total.inc(source)
        self.metrics.deadline_lead_seconds.observe((deadline - now_ns) / 1e9, source)
        self.send(ctx, Deadline(ctx.request.request_id, deadline, samples))

    def fail(self, ctx: Context, code: str, message: str, error_type: str) -> None:
        if ctx.finished:
            return
        if ctx.request is not None:
            ctx.request.cancel()
        self._send_error(p.ProtocolError(code, message, error_type=error_type, context_id=ctx.context_id))
        self._queue_lazy(lambda: p.dumps(p.context_done(ctx.context_id, "error", ctx.samples_sent)))
        self.metrics.requests_total.inc("ws", "error")
        self.contexts.finish(ctx, "error")

    # ------------------------------------------------------------ from the engine

    async def _pump(self, ctx: Context, request: EngineRequest) -> None:
        try:
            while True:
                msg = await request.events.get()
                if isinstance(msg, Audio):
                    self._on_audio(ctx, msg.pcm)
                elif isinstance(msg, Done):
                    self._on_done(ctx, msg)
                    return
                elif isinstance(msg, Error):
                    if ctx.cancelled:  # the client asked to stop and was told so: its context ends cancelled
                        self._finish_cancelled(ctx)
                    else:
                        self.fail(ctx, msg.code, msg.message, "server_error")
                    return
        finally:
            request.release()

    def _on_audio(self, ctx: Context, pcm: bytes) -> None:
        if ctx.cancelled or ctx.finished:
            return
        if ctx.opus is None:
            if ctx.resampler is not None:
                pcm = ctx.resampler.process(pcm).tobytes()
            if pcm:
                self._queue_frame(ctx, pcm, len(pcm) // 2, last=False)
        else:
            for packet in ctx.opus.encode(pcm):
                self._queue_frame(ctx, packet, OPUS_PACKET_SAMPLES, last=False, advance=OPUS_PACKET_SAMPLES)
        self._time_words(ctx, len(pcm) // 2, last=False)

    def _time_words(self, ctx: Context, samples: int, *, last: bool) -> None:
        """word.timing for the words this much more audio completed (or all of them, at the end)."""
        if ctx.char_times is None or ctx.words is None:
            return
        chars = ctx.char_times.audio(samples / ctx.sample_rate)
        if last:
            chars += ctx.char_times.finish()
        words = ctx.words.add(chars) + (ctx.words.finish() if last else [])
        if words:
            rate = ctx.sample_rate
            timed = [(w.word, round(w.start_s * rate), round(w.end_s * rate)) for w in words]
            self.outbox.put_control(ContextText(ctx, p.dumps(p.word_timing(ctx.context_id, timed))))

    def _on_done(self, ctx: Context, done: Done) -> None:
        """The engine's Done ends the context: cancelled, failed, or complete (`_complete`)."""
        if ctx.finished:
            return
        if ctx.cancelled or done.reason == DoneReason.CANCELLED:
            self._finish_cancelled(ctx)
            return
        if done.reason == DoneReason.ERROR:
            self.fail(ctx, "engine_error", "the engine could not finish this context", "server_error")
            return
        self._complete(ctx)

    def _complete(self, ctx: Context) -> None:
        """The engine finished the context: the last audio, word timings and `context.done` "completed".
        Compatible sockets override it with their own ending."""
        if ctx.opus is None:
            tail = ctx.resampler.process(b"", last=True).tobytes() if ctx.resampler is not None else b""
            self._time_words(ctx, len(tail) // 2, last=True)
            self._queue_frame(ctx, tail, len(tail) // 2, last=True)
        else:
            self._time_words(ctx, 0, last=True)
            packets = ctx.opus.finish()
            real_left = ctx.opus.samples_in - ctx.samples_queued
            for i, packet in enumerate(packets):
                real = max(0, min(OPUS_PACKET_SAMPLES, real_left))
                real_left -= real
                self._queue_frame(ctx, packet, real, last=i == len(packets) - 1, advance=OPUS_PACKET_SAMPLES)
        self._queue_lazy(lambda: p.dumps(p.context_done(ctx.context_id, "completed", ctx.samples_sent)))
        self.metrics.requests_total.inc("ws", "completed")
        self.contexts.finish(ctx, "completed")

    def _finish_cancelled(self, ctx: Context) -> None:
        """End a context its client cancelled (and was told so): `context.done` "cancelled". Compatible
        sockets override it with their own ending."""
        if ctx.finished:
            return
        self._queue_lazy(lambda: p.dumps(p.context_done(ctx.context_id, "cancelled", ctx.samples_sent)))
        self.contexts.finish(ctx, "cancelled")

    # ------------------------------------------------------------ to the outbox

    def _queue_frame(
        self, ctx: Context, payload: bytes, samples: int, *, last: bool, advance: int | None = None
    ) -> None:
        frame = ctx.frame(payload, samples, last=last, advance=advance)
        if not self.outbox.put(AudioOut(ctx, frame, samples), len(frame)):
            self._on_overflow()

    def _queue_lazy(self, render: Callable[[], str]) -> None:
        self.outbox.put_control(LazyText(render))

    def _send_error(self, error: p.ProtocolError) -> None:
        self.metrics.errors_total.inc(error.code)
        self.outbox.put_control(p.dumps(p.error_event(error)))
