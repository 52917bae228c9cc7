"""Suite-wide order: the longest files start first, and those that keep a core busy are spread
over the run rather than started together.

``make test`` runs files in parallel (``pytest -n 5 --dist loadfile --no-loadscope-reorder``),
handed out in collection order: the slowest, started last, would be the whole run's tail. Five
workers share two cores, and most e2e files wait on timers and real processes while the
real-engine files compute: five of those at once slow each other, five waiting leave the cores
idle. So the files are in two lanes, busy and waiting, each longest first, and merged by how far
into its lane's total each file starts.
(Without ``--no-loadscope-reorder`` xdist hands out the files with the most tests first, and
the real-engine files, a few long tests each, came last.)
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Iterator

import httpx
import hypothesis
import hypothesis.strategies
import pytest
from httpx._transports import default as httpx_transports

# Seconds of wall clock and of CPU (the test process and what it started) per file, measured in
# one ``make test`` run on 2 cores (wall: its tests' setup, call and teardown in
# ``--durations=0``; CPU of a file new since the last full measure: estimated from its kind);
# files not named here take under 10 s.
MEASURED = {
    "tests/engine/test_vllm.py": (195, 52),
    "tests/e2e/test_dashboard.py": (89, 19),
    "tests/engine/test_traces.py": (76, 46),
    "tests/engine/test_llama_server.py": (55, 24),
    "tests/e2e/test_cluster.py": (55, 11),
    "tests/e2e/test_keys.py": (53, 6),
    "tests/engine/test_kv_agents.py": (52, 25),
    "tests/e2e/test_sdk_failures.py": (48, 8),
    "tests/unit/control/test_fleet_states.py": (42, 42),
    "tests/engine/test_clis.py": (39, 19),
    "tests/e2e/test_keepalive.py": (39, 7),
    "tests/e2e/test_endpoints.py": (37, 3),
    "tests/engine/test_idle_unload.py": (36, 16),
    "tests/engine/test_process_engine.py": (32, 14),
    "tests/e2e/test_swap_economics.py": (30, 5),
    "tests/engine/test_agents.py": (29, 11),
    "tests/e2e/test_relay.py": (29, 6),
    "tests/e2e/test_replay.py": (29, 5),
    "tests/engine/test_kv_keep.py": (28, 12),
    "tests/engine/test_decay_soak.py": (27, 12),
    "tests/e2e/test_decay.py": (27, 8),
    "tests/e2e/test_admin.py": (27, 7),
    "tests/unit/config/test_loading_properties.py": (26, 26),
    "tests/engine/test_progress.py": (26, 11),
    "tests/engine/test_kv_clis.py": (24, 18),
    "tests/e2e/test_model_fallbacks.py": (24, 6),
    "tests/e2e/test_vllm_sleep.py": (24, 5),
    "tests/e2e/test_streaming.py": (24, 5),
    "tests/engine/test_affinity.py": (23, 19),
    "tests/engine/test_llama_swap.py": (23, 8),
    "tests/e2e/test_fleets.py": (22, 10),
    "tests/e2e/test_activity.py": (22, 5),
    "tests/e2e/test_contract.py": (21, 15),
    "tests/engine/test_gpu_bench.py": (21, 9),
    "tests/e2e/test_process.py": (21, 6),
    "tests/engine/test_llama_cpp_nginx.py": (20, 10),
    "tests/engine/test_llama_cpp.py": (19, 11),
    "tests/engine/test_portable.py": (18, 9),
    "tests/e2e/test_prometheus.py": (18, 5),
    "tests/e2e/test_nginx.py": (17, 2),
    "tests/e2e/test_faults.py": (16, 6),
    "tests/e2e/test_pools.py": (16, 4),
    "tests/e2e/test_connections.py": (15, 4),
    "tests/engine/test_demo.py": (14, 6),
    "tests/e2e/test_routing.py": (12, 3),
    "tests/unit/proxy/test_request_properties.py": (11, 11),
    "tests/engine/test_max_concurrency.py": (11, 5),
    "tests/engine/test_host_cache.py": (11, 5),
    "tests/e2e/test_storms.py": (11, 4),
    "tests/e2e/test_tracing.py": (11, 3),
    "tests/engine/test_busy_engine.py": (10, 7),
}
BUSY = 0.4  # CPU seconds per second of wall clock from which a file keeps a core busy


def order(measured: dict[str, tuple[int, int]]) -> list[str]:
    """The files, longest first within each lane, the lanes merged by where each file starts."""
    lanes = (
        [p for p, (w, c) in measured.items() if c >= BUSY * w],
        [p for p, (w, c) in measured.items() if c < BUSY * w],
    )
    starts: dict[str, float] = {}
    for lane in lanes:
        lane.sort(key=lambda path: -measured[path][0])
        total, before = sum(measured[path][0] for path in lane), 0
        for path in lane:
            starts[path] = before / total
            before += measured[path][0]
    return sorted(measured, key=lambda path: (starts[path], -measured[path][0]))


ORDER = order(MEASURED)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return ORDER.index(path) if path in ORDER else len(ORDER)

    items.sort(key=rank)  # stable: each file keeps its own order


# Coverage counts the lines the tests' own processes run (the Makefile's figure), and its tracer
# is called on every Python function call there, swapgate's or not. Two kinds of test run
# untraced, from their setup to their teardown:
# - the property tests (hypothesis: ``@given``, the fleet's state machine) run the same code
#   over hundreds of inputs, and coverage counts a line once: traced, they took more than twice
#   the CPU (the fleet's states and the config properties, alone: 38.8 s, 16.4 s untraced);
# - the e2e and engine tests drive gateways that run in processes of their own, never traced:
#   in the test process the tracer saw the clients (httpx, the SDKs, the polling) and cost a
#   quarter of its CPU (three e2e files: 21.7 s against 15.8 s).
UNTRACED_FOLDERS = ("tests/e2e/", "tests/engine/")


def _untraced(item: pytest.Item) -> bool:
    hypothesis_test = getattr(getattr(item, "obj", None), "is_hypothesis_test", False)
    return bool(hypothesis_test) or item.nodeid.startswith(UNTRACED_FOLDERS)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    controller = getattr(item.config.pluginmanager.get_plugin("_cov"), "cov_controller", None)
    if controller is None or not controller.started or not _untraced(item):
        return (yield)
    controller.pause()
    try:
        return (yield)
    finally:
        controller.resume()


def pytest_collection_finish(session: pytest.Session) -> None:
    """``make pytest`` collects once before the workers start (Makefile); with
    SWAPGATE_WARM_HYPOTHESIS set, that collection also draws one example, so that hypothesis
    writes its caches (.hypothesis/: the Unicode table and the constants it reads from every
    module imported) for the workers to read. A fresh clone's five workers each built them
    again: 2.1-2.5 s of CPU apiece."""
    if os.environ.get("SWAPGATE_WARM_HYPOTHESIS"):

        @hypothesis.given(hypothesis.strategies.text())
        @hypothesis.settings(max_examples=1, database=None)
        def draw(text: str) -> None:
            del text

        draw()


# Every httpx client the tests make (each ``httpx.get``, each SDK client) used to build its own
# TLS context, and loading the CA bundle into it costs ~22 ms of CPU: a quarter to a half of the
# test processes' own CPU, for clients that speak plain HTTP to 127.0.0.1. One context, made once
# and shared (an SSLContext may be), serves every default client of the run.
@functools.cache
def _shared_tls(trust_env: bool) -> ssl.SSLContext:
    return httpx.create_ssl_context(trust_env=trust_env)


def _tls_context(
    verify: ssl.SSLContext | str | bool = True, cert: object = None, trust_env: bool = True
) -> ssl.SSLContext:
    if verify is True and cert is None:
        return _shared_tls(trust_env)
    return httpx.create_ssl_context(verify, cert, trust_env)  # type: ignore[arg-type]


def pytest_configure(config: pytest.Config) -> None:
    assert hasattr(httpx_transports, "create_ssl_context"), (
        "httpx no longer builds its transports' TLS context here: update tests/conftest.py"
    )
    httpx_transports.create_ssl_context = _tls_context


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask, which the gateways and engines a test starts inherit: files kept
    private must be so whatever it is."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)
