"""``swapgate sim``: a real HTTP server that behaves like llama-swap, Ollama or an OpenAI server."""

from __future__ import annotations

import math
import socket
from collections.abc import Sequence
from dataclasses import replace

import uvicorn

from swapgate.sim.app import create_sim_app, create_sim_fleet
from swapgate.sim.backend import SimConfig

__all__ = ["SimConfig", "create_sim_app", "create_sim_fleet", "run_sim", "run_sim_fleet"]


def run_sim(config: SimConfig) -> None:
    uvicorn.run(
        create_sim_app(config),
        host=config.host,
        port=config.port,
        log_level="warning",
        access_log=False,
        ws="none",  # it serves no WebSocket: the websockets package is never imported
        timeout_keep_alive=math.ceil(config.keep_alive),
    )


def run_sim_fleet(config: SimConfig, ports: Sequence[int]) -> None:
    """One simulator as ``config`` says on each of ``ports``, each with its own state, all in
    this process (``swapgate sim --ports``)."""
    app = create_sim_fleet([replace(config, port=port) for port in ports])
    # Its lifespan off: the simulators keep no state that starts or stops with the server.
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            ws="none",
            lifespan="off",
            timeout_keep_alive=math.ceil(config.keep_alive),
        )
    )
    server.run(sockets=[_bound(config.host, port) for port in ports])


def _bound(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock
