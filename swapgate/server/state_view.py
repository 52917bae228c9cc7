"""The gateway's state as operators read it: ``GET /admin/state``, the dashboard's first view
and its event stream's base, and ``swapgate status`` (docs/operations.md). Wall-clock times,
each instance and model as placement sees them, with their swaps, backoffs and keys."""

from __future__ import annotations

import time
from typing import Any

from swapgate.control.state.slots import NO_COUNT_LIMIT
from swapgate.control.swaps.coordinator import SwapCoordinator
from swapgate.data.snapshot import InstanceView, ModelView, Snapshot
from swapgate.data.warm import WarmState
from swapgate.server.runtime import Runtime


def describe_state(runtime: Runtime) -> dict[str, Any]:
    snap = runtime.registry.snapshot()
    wall = _WallClock(snap.now)
    queues = runtime.registry.queues.depths()
    models = sorted(runtime.registry.known_models())
    return {
        "instances": [_describe_instance(inst, runtime, wall) for inst in snap.instances],
        "models": {
            model: {
                "queue": queues.get(model, 0),
                "warm_on": _where(snap, model, WarmState.WARM),
                "loading_on": _where(snap, model, WarmState.LOADING),
                # the time to bring it up from the tier it is in: a wake if asleep, else a load
                "eta_seconds": {
                    i.name: round(_eta(runtime.coordinator, i, model), 3)
                    for i in snap.instances
                    if model in i.serves
                },
                # its weight files, and how much the page cache holds (control/memory/host_cache.py)
                "weights": runtime.host_cache.describe(model),
                "weights_tier": runtime.host_cache.tier(model),
                # its loads fail fleet-wide: answered at once until its next probe
                "failing": runtime.registry.failing.describe(model),
            }
            for model in models
        },
        "failing": {
            model: runtime.registry.failing.describe(model)
            for model in sorted(runtime.registry.failing.all())
        },
        "host_cache": {
            "budget": runtime.configured.settings.host_cache.budget,
            "held_bytes": runtime.host_cache.held,
            "kept": list(runtime.host_cache.kept),
        },
        "keys": _describe_keys(runtime),
    }


def _describe_keys(runtime: Runtime) -> dict[str, dict[str, Any]]:
    """Each configured key's limits and use on this replica (never the key or its hash)."""
    use = runtime.limits.describe()
    return {
        key.name: {
            "priority": key.priority,
            "models": key.models,
            "rpm": key.rpm,
            "tpm": key.tpm,
            "concurrency": key.concurrency,
            "expires": key.expires.isoformat() if key.expires else None,
            **use.get(key.name, {"in_flight": 0, "last_minute": 0, "tokens_last_minute": 0}),
        }
        for key in runtime.configured.settings.auth.keys
    }


def _eta(swaps: SwapCoordinator, instance: InstanceView, model: str) -> float:
    if instance.state_of(model) is WarmState.ASLEEP:
        return swaps.times.wake_eta(instance.name, model)
    return swaps.times.eta(instance.name, model)


def _describe_instance(inst: InstanceView, runtime: Runtime, wall: _WallClock) -> dict[str, Any]:
    conf = next(i for i in runtime.configured.settings.instances if i.name == inst.name)
    processes = runtime.processes(inst.name)
    return {
        **({"processes": processes} if processes is not None else {}),
        "name": inst.name,
        "kind": conf.kind,
        "url": conf.url,
        "up": inst.up,
        "drained": inst.drained,
        "capacity": inst.capacity if inst.capacity < NO_COUNT_LIMIT else None,  # null: memory
        "memory": inst.memory,  # bytes its models may take at once; null: no limit
        "memory_used": inst.used if inst.memory is not None else None,
        # bytes: estimate (declared or computed), learned, measured (+ measured_by) and
        # placed_by, the larger that placement counts (docs/memory.md, "Measured memory")
        "model_sizes": runtime.registry.sizes(inst.name),
        "inflight": inst.inflight,
        "serves": sorted(inst.serves),
        "swapping": inst.swapping,
        "backoff_until": wall.iso(inst.backoff_until) if inst.backoff_until > wall.now else None,
        # kv_keep: the conversations saved for it, {count, bytes} (control/memory/kv/keeper.py)
        "kv_saved": runtime.kv.describe(inst.name),
        "models": {
            name: _describe_model(view, wall, runtime, inst.name, name)
            for name, view in sorted(inst.models.items())
            if view.state is not WarmState.COLD
            or view.inflight
            or view.pinned_until > wall.now
            or view.backoff_until > wall.now
            or view.down
        },
    }


def _describe_model(
    view: ModelView, wall: _WallClock, runtime: Runtime, instance: str, model: str
) -> dict[str, Any]:
    described: dict[str, Any] = {
        "state": view.state.value,
        "since": wall.iso(view.since),
        "inflight": view.inflight,
        "last_used": wall.iso(view.last_used) if view.last_used else None,
        "pinned_until": wall.iso(view.pinned_until) if view.pinned_until > wall.now else None,
        # a failed load of it here: no load of it here until then (docs/operations.md)
        "backoff_until": wall.iso(view.backoff_until) if view.backoff_until > wall.now else None,
        "failure": view.failure or None if view.backoff_until > wall.now else None,
        "unreachable": view.down or None,  # its own server does not answer (vllm-sleep)
    }
    idle_at = runtime.idle.deadline(instance, model)  # ttl or keep_alive (docs/configuration.md)
    described["idle_unload_at"] = wall.iso(idle_at) if idle_at is not None else None
    if view.state is WarmState.WARM:  # is its engine decaying, and why (docs/operations.md)
        relay = runtime.configured.settings.model_settings(model).relay
        described["diagnosis"] = runtime.decay.describe(instance, model, relay)
    return described


class _WallClock:
    """Turns the registry's monotonic times into ISO wall-clock times."""

    def __init__(self, now: float) -> None:
        self.now = now
        self._offset = time.time() - now

    def iso(self, monotonic: float) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(monotonic + self._offset))
        return stamp + "Z"


def _where(snap: Snapshot, model: str, state: WarmState) -> list[str]:
    return [i.name for i in snap.instances if i.state_of(model) is state]
