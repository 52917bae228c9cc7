"""``swapgate sim``: a real HTTP server that behaves like llama-swap, Ollama or an OpenAI server."""

from __future__ import annotations

import uvicorn

from swapgate.sim.app import create_sim_app
from swapgate.sim.backend import SimConfig

__all__ = ["SimConfig", "create_sim_app", "run_sim"]


def run_sim(config: SimConfig) -> None:
    uvicorn.run(
        create_sim_app(config),
        host=config.host,
        port=config.port,
        log_level="warning",
        access_log=False,
    )
