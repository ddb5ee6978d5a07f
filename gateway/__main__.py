"""`python -m gateway`: parse settings, check the model is there, serve until SIGTERM drains us.

Exit status: 0 after SIGTERM/SIGINT, 2 when the model's files are missing, the model is a kind the engine
does not serve (gateway.model_source) or --engines asks for more GPUs than the server was
given (gateway.gpus), 1 when an engine cannot start (it exited before Ready
`gateway.engines.START_ATTEMPTS` times in a row; its last stderr lines are repeated on ours).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from types import FrameType

import uvicorn
from starlette.applications import Starlette

from gateway.app import create_app, drain
from gateway.engines import EngineStartFailure
from gateway.gpus import NotEnoughGpus
from gateway.model_source import ModelMissing, ModelUnsupported
from gateway.settings import Settings, parse_settings

log = logging.getLogger("vivace")


class DrainingServer(uvicorn.Server):
    """uvicorn's server, but the first SIGTERM/SIGINT drains live work before uvicorn shuts down.

    uvicorn alone would fail open WebSockets with 1012 at once; we first let contexts finish
    (bounded by --drain-timeout), close them with 1001, then hand over to uvicorn's shutdown.
    A second signal skips the drain.
    """

    def __init__(self, config: uvicorn.Config, app: Starlette) -> None:
        super().__init__(config)
        self._app = app
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self._loop is None:
            super().handle_exit(sig, frame)
            return
        self._draining = True
        log.info("signal %d: draining (new sessions refused, live contexts finish)", sig)
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._drain_then_exit(sig, frame)))  # type: ignore[union-attr]

    async def _drain_then_exit(self, sig: int, frame: FrameType | None) -> None:
        state = getattr(self._app.state, "gateway", None)  # absent until the lifespan started
        if state is not None:
            await drain(state)
        # Not super().handle_exit(): uvicorn would re-raise the signal after shutting down, and a
        # completed drain is a normal exit (status 0).
        self.should_exit = True


def run(settings: Settings) -> int:
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    failures: list[EngineStartFailure] = []
    server: DrainingServer | None = None

    def engine_failed(failure: EngineStartFailure) -> None:
        failures.append(failure)
        if server is not None:
            server.should_exit = True  # uvicorn's main loop notices within 0.1 s and shuts down

    try:
        app = create_app(settings, on_engine_failure=engine_failed)
    except (ModelMissing, ModelUnsupported, NotEnoughGpus) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        ws="websockets-sansio",
        ws_max_size=settings.limits.max_message_bytes * 4,  # bigger: uvicorn closes 1009; smaller: we do
        ws_per_message_deflate=False,  # PCM and Opus do not compress
        timeout_graceful_shutdown=5,
        timeout_keep_alive=settings.keep_alive_s,
        lifespan="on",
    )
    server = DrainingServer(config, app)
    server.run()
    if failures:
        print(f"error: {failures[0].describe()}", file=sys.stderr)
        return 1
    return 0


def main() -> None:
    settings = parse_settings(sys.argv[1:], os.environ)
    sys.exit(run(settings))


if __name__ == "__main__":
    main()
