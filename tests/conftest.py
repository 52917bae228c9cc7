"""Suite-wide order: the files that take longest start first.

``make test`` runs files in parallel (``pytest -n 4 --dist loadfile --no-loadscope-reorder``),
handed out in collection order: the slowest, started last, would be the whole run's tail.
(Without ``--no-loadscope-reorder`` xdist hands out the files with the most tests first, and
the real-engine files, a few long tests each, came last.)
"""

from __future__ import annotations

import pytest

# The slowest files (seconds on 2 cores, measured with --durations), longest first.
SLOWEST = (
    "tests/engine/test_vllm.py",  # 140
    "tests/engine/test_clis.py",  # 135
    "tests/e2e/test_dashboard.py",  # 62
    "tests/e2e/test_endpoints.py",  # 61
    "tests/engine/test_llama_server.py",  # 57
    "tests/e2e/test_cluster.py",  # 51
    "tests/e2e/test_sdk_failures.py",  # 48
    "tests/e2e/test_keys.py",  # 46
    "tests/engine/test_process_engine.py",  # 41
    "tests/engine/test_llama_swap.py",  # 40
    "tests/engine/test_kv_keep.py",  # 43
    "tests/engine/test_affinity.py",  # 24
    "tests/engine/test_decay_soak.py",  # 39
    "tests/e2e/test_vllm_sleep.py",  # 38
    "tests/e2e/test_keepalive.py",  # 37
    "tests/e2e/test_admin.py",  # 36
    "tests/e2e/test_process.py",  # 36
    "tests/e2e/test_relay.py",  # 33
    "tests/e2e/test_replay.py",  # 32
    "tests/e2e/test_swap_economics.py",  # 31
    "tests/e2e/test_streaming.py",  # 29
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return SLOWEST.index(path) if path in SLOWEST else len(SLOWEST)

    items.sort(key=rank)  # stable: each file keeps its own order
