"""Running the gateway under uvicorn (uvloop + httptools where installed)."""

from __future__ import annotations

import gc
import logging
import math
import resource

import uvicorn

from swapgate.config.settings import ServerConfig, Settings
from swapgate.errors import SwapgateError
from swapgate.metrics import UNKNOWN
from swapgate.server.app import SwapgateApp, create_app
from swapgate.server.connections import ConnectionLimits, guarded_protocol

log = logging.getLogger("swapgate.server")
# Net allocations between two collections of the youngest generation (Python's default: 700).
YOUNG_ALLOCATIONS = 10_000


def serve(
    settings: Settings,
    *,
    config_path: str | None = None,
    host: str | None = None,
    port: int | None = None,
) -> None:
    configure_logging(settings.server.log_level)
    app = create_app(settings, config_path)
    config = server_config(settings, app, host, port)
    raise_fd_limit(settings.server.max_connections)
    tune_collector()
    uvicorn.Server(config).run()


def server_config(
    settings: Settings, app: SwapgateApp, host: str | None = None, port: int | None = None
) -> uvicorn.Config:
    """How uvicorn serves ``app``: swapgate's own connection bounds, no access log of its own."""
    return uvicorn.Config(
        app,
        http=guarded_protocol(connection_limits(settings.server, app)),
        ws="none",  # no WebSocket endpoints: an upgrade request is served as plain HTTP
        host=host or settings.server.host,
        port=port if port is not None else settings.server.port,
        log_level=settings.server.log_level,
        access_log=False,  # swapgate writes its own access line, with model and route
        server_header=False,
        # swapgate reads no client address: uvicorn's X-Forwarded-For middleware would cost
        # the warm path about 1% for nothing
        proxy_headers=False,
        # A float, not int(): uvicorn annotates int but waits with asyncio.timeout, which takes
        # any number; int() turned 0.5 s into 0, and "or None" turned 0 into no limit at all.
        timeout_graceful_shutdown=settings.server.shutdown_grace,  # type: ignore[arg-type]
        timeout_keep_alive=math.ceil(settings.server.idle_timeout),
        log_config=None,
    )


def tune_collector() -> None:
    """The youngest generation is collected after ``YOUNG_ALLOCATIONS`` net allocations, not
    Python's 700: the objects of the requests in flight (about 45 each) crossed 700 at 16
    clients, so a collection ran every ~17 requests and found nothing to free, 7.6 µs of each
    request's CPU. Garbage in cycles is still collected, a little later. The process's own
    setting: only ``serve()`` changes it, not whoever builds the app."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_ALLOCATIONS, middle, old)


def connection_limits(server: ServerConfig, app: SwapgateApp) -> ConnectionLimits:
    metrics = app.runtime.metrics

    def refused(error: SwapgateError) -> None:
        metrics.request_done(UNKNOWN, "none", error.status, 0.0, 0.0)

    return ConnectionLimits(
        max_header_bytes=server.max_header_bytes,
        request_read_timeout=server.request_read_timeout,
        max_connections=server.max_connections,
        refused=refused,
    )


def raise_fd_limit(max_connections: int) -> None:
    """Each proxied request holds two descriptors (client and upstream): raise the soft limit
    towards the hard one so ``max_connections`` can be reached, as nginx's
    ``worker_rlimit_nofile`` does, and say so when it cannot."""
    wanted = 2 * max_connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return
    ceiling = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if ceiling > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
    if ceiling < wanted:
        log.warning(
            "open-file limit %d is below the %d that server.max_connections=%d needs; raise "
            "it (ulimit -n, LimitNOFILE=) or lower max_connections",
            ceiling,
            wanted,
            max_connections,
        )


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # One line per control-plane poll would drown the access log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("uvicorn.error").addFilter(_cut_on_purpose)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


def _cut_on_purpose(record: logging.LogRecord) -> bool:
    """uvicorn's error for an answer left unended is swapgate's own doing (a failure after
    the status went out, swapgate/proxy/writer.py), already logged with its cause."""
    return record.msg != "ASGI callable returned without completing response."
