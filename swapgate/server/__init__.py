"""The gateway as a server: the ASGI app, its routes, uvicorn glue, connection limits and the
runtime that wires config, state, drivers and loops together."""
