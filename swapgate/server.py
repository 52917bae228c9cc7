"""Running the gateway under uvicorn (uvloop + httptools where installed)."""

from __future__ import annotations

import logging
import math

import uvicorn

from swapgate.app import create_app
from swapgate.config import Settings


def serve(
    settings: Settings,
    *,
    config_path: str | None = None,
    host: str | None = None,
    port: int | None = None,
) -> None:
    configure_logging(settings.server.log_level)
    config = uvicorn.Config(
        create_app(settings, config_path),
        host=host or settings.server.host,
        port=port if port is not None else settings.server.port,
        log_level=settings.server.log_level,
        access_log=False,  # swapgate writes its own access line, with model and route
        server_header=False,
        # A float, not int(): uvicorn annotates int but waits with asyncio.timeout, which takes
        # any number; int() turned 0.5 s into 0, and "or None" turned 0 into no limit at all.
        timeout_graceful_shutdown=settings.server.shutdown_grace,  # type: ignore[arg-type]
        timeout_keep_alive=math.ceil(settings.server.idle_timeout),
        log_config=None,
    )
    uvicorn.Server(config).run()


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # One line per control-plane poll would drown the access log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
