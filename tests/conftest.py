"""Suite-wide order: the files that take longest start first.

``make test`` runs files in parallel (``pytest -n 3 --dist loadfile``), handed out in collection
order: the slowest, started last, would be the whole run's tail.
"""

from __future__ import annotations

import pytest

# The slowest files (seconds on 2 cores, measured with --durations), longest first.
SLOWEST = (
    "tests/engine/test_vllm.py",  # ~110: three real vLLM starts of ~30 s
    "tests/engine/test_clis.py",  # ~90: four coding-client sessions
    "tests/e2e/test_cluster.py",
    "tests/engine/test_llama_server.py",
    "tests/e2e/test_endpoints.py",
    "tests/e2e/test_dashboard.py",  # ~35: a real Chromium, six sessions
    "tests/e2e/test_keys.py",  # ~45: two contention runs of 25 requests
    "tests/engine/test_decay_soak.py",  # ~27: a real engine under a flat load
    "tests/engine/test_process_engine.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return SLOWEST.index(path) if path in SLOWEST else len(SLOWEST)

    items.sort(key=rank)  # stable: each file keeps its own order
