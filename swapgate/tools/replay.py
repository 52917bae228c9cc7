"""``swapgate replay LOG --config FILE``: what your own traffic would have done under a config.

The log is swapgate's own (its access lines and its ``swap done`` lines, as ``swapgate serve``
writes them). Each answered request is sent again at its time (open loop, ``speedup`` times
faster) to a gateway run from the config, in front of one simulator per instance that loads
each model in its swap time measured on that instance (else anywhere) and answers in the time
the request took once served.
Every variant runs the same way, side by side; what each did is printed beside what the log
recorded: swaps, p50 and p95 latency, errors.

What a replay leaves out: relays (requests go to the instances), preload schedules (pinned
jobs run once at the start), replicas (one gateway), and what a backend does besides loading
and generating.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from swapgate.config.loading import parse_config
from swapgate.config.paths import STATE_DIR_ENV
from swapgate.config.settings import ConfigError, parse_duration
from swapgate.tools.processes import (
    free_port,
    serving,
    sim_command,
    start,
    stop,
    wait_until_serving,
)

_ACCESS = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ swapgate\.access: \"\S+ \S+\" (\d{3}) "
    r"model=(\S*) route=(\S+) wait_ms=(\d+) ms=([\d.]+)"
)
_SWAP = re.compile(r"swap done \((?:load|wake)\): (\S+) on (\S+) in ([\d.]+)s")
TOKEN_RATE = 100.0  # the simulators' tokens per second (before speedup): 10 ms granularity
# Routing times a replay runs ``speedup`` times faster, when the config sets them.
_SCALED = ("max_wait", "min_residency", "expected_swap", "swap_timeout", "stream_idle_timeout")
REPLAY_TOKEN = "swapgate-replay"  # the admin token of the gateways a replay runs


class ReplayError(Exception):
    """The log or a variant cannot be replayed; the message says what to do."""


@dataclass(frozen=True, slots=True)
class Logged:
    at: float  # seconds since the log's first arrival
    model: str
    status: int
    seconds: float  # arrival to last byte
    waited: float  # of those, waiting for its model

    @property
    def service(self) -> float:
        """How long it took once served: what the simulator takes to answer it."""
        return max(0.0, self.seconds - self.waited)


@dataclass
class Recording:
    requests: list[Logged] = field(default_factory=list)
    swap_times: dict[str, list[float]] = field(default_factory=dict)  # model: measured loads
    # (instance, model): measured loads there — instances differ (disks, PCIe, GPUs)
    on_instance: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    @property
    def swaps(self) -> int:
        return sum(len(times) for times in self.swap_times.values())

    def swap_time(self, model: str, default: float | None, instance: str | None = None) -> float:
        """The median measured swap of ``model`` on ``instance``, else anywhere; else
        ``default``, else of all models."""
        if times := self.on_instance.get((instance or "", model)):
            return statistics.median(times)
        if times := self.swap_times.get(model):
            return statistics.median(times)
        if default is not None:
            return default
        every = [t for times in self.swap_times.values() for t in times]
        if not every:
            raise ReplayError(
                "the log holds no 'swap done' lines to measure swap times from (they are "
                "logged at log_level info); pass --swap-time, e.g. --swap-time 20s"
            )
        return statistics.median(every)


def read_log(lines: Iterable[str]) -> Recording:
    """The requests that reached a model (``route`` not ``none``) and the swaps measured."""
    recording = Recording()
    arrivals: list[tuple[float, str, int, float, float]] = []
    for line in lines:
        if access := _ACCESS.search(line):
            stamp, status, model, route, wait_ms, ms = access.groups()
            if route == "none" or not model:
                continue
            ended = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            seconds = float(ms) / 1000
            arrivals.append((ended - seconds, model, int(status), seconds, int(wait_ms) / 1000))
        elif swap := _SWAP.search(line):
            model, instance, took = swap.groups()
            recording.swap_times.setdefault(model, []).append(float(took))
            recording.on_instance.setdefault((instance, model), []).append(float(took))
    if not arrivals:
        raise ReplayError(
            "no access lines in the log: replay reads swapgate's own log (server.access_log "
            "on, log_level info), as `swapgate serve` writes it"
        )
    first = min(a[0] for a in arrivals)
    recording.requests = sorted(
        (
            Logged(at - first, model, status, seconds, waited)
            for at, model, status, seconds, waited in arrivals
        ),
        key=lambda r: r.at,
    )
    return recording


def variant(base: Mapping[str, Any], spec: str) -> dict[str, Any]:
    """``base`` changed by ``spec``: a YAML file (the whole config), or comma-separated
    ``dotted.key=value`` (``routing.eviction=demand``), ``instances=N`` (copies of the last
    instance, or the first N)."""
    if Path(spec).is_file():
        loaded = yaml.safe_load(Path(spec).read_text())
        if not isinstance(loaded, dict):
            raise ReplayError(f"variant {spec}: not a YAML mapping")
        return loaded
    config = copy.deepcopy(dict(base))
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, sep, text = item.partition("=")
        if not sep:
            raise ReplayError(
                f"variant {item!r}: expected KEY=VALUE (routing.eviction=demand, instances=3) "
                "or a config file"
            )
        value = yaml.safe_load(text)
        if key == "instances":
            config["instances"] = _resized(config.get("instances") or [], value)
            continue
        *path, last = key.split(".")
        node = config
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ReplayError(f"variant {item!r}: {part} is not a section")
        node[last] = value
    return config


def _resized(instances: list[dict[str, Any]], count: object) -> list[dict[str, Any]]:
    if not isinstance(count, int) or isinstance(count, bool) or count < 1 or not instances:
        raise ReplayError(f"instances={count!r}: expected a whole number of instances, e.g. 3")
    resized = [dict(i) for i in instances[:count]]
    while len(resized) < count:
        resized.append({**instances[-1], "name": f"{instances[-1]['name']}-{len(resized)}"})
    return resized


@dataclass(frozen=True, slots=True)
class Outcome:
    name: str
    swaps: int
    p50: float
    p95: float
    errors: int


def recorded(recording: Recording) -> Outcome:
    """What the log says happened."""
    seconds = [r.seconds for r in recording.requests]
    errors = sum(1 for r in recording.requests if r.status != 200)
    return Outcome("recorded", recording.swaps, *_quantiles(seconds), errors)


def check(configs: Mapping[str, Mapping[str, Any]]) -> None:
    """Raise ``ReplayError`` naming the first config (or variant) that is not valid."""
    for name, config in configs.items():
        try:
            parse_config(config)
        except ConfigError as exc:
            raise ReplayError(f"{name}: {exc}") from None


def replay(
    recording: Recording,
    configs: Mapping[str, Mapping[str, Any]],
    speedup: float = 1.0,
    swap_time: float | None = None,
) -> list[Outcome]:
    """Replay ``recording`` under each config, side by side."""
    check(configs)
    with ThreadPoolExecutor(len(configs)) as pool:
        runs = [
            pool.submit(_run, name, config, recording, speedup, swap_time)
            for name, config in configs.items()
        ]
        return [run.result() for run in runs]


def _run(
    name: str,
    config: Mapping[str, Any],
    recording: Recording,
    speedup: float,
    swap_time: float | None,
) -> Outcome:
    models = sorted({r.model for r in recording.requests})
    loads = {
        instance["name"]: {
            m: recording.swap_time(m, swap_time, instance["name"]) / speedup for m in models
        }
        for instance in config["instances"]
    }
    with (
        _simulators(config["instances"], models, loads, speedup) as sims,
        _gateway(_replayed(config, sims, speedup)) as url,
    ):
        before = _loads(sims.values())
        _run_pins(url, config)
        pinned = _loads(sims.values()) - before
        results = asyncio.run(_send_all(url, recording.requests, speedup))
        swaps = _loads(sims.values()) - before - pinned
    seconds = [s * speedup for s, _ in results]
    return Outcome(name, swaps, *_quantiles(seconds), sum(1 for _, ok in results if not ok))


def _replayed(config: Mapping[str, Any], sims: Mapping[str, str], speedup: float) -> dict[str, Any]:
    """``config`` in front of the simulators: no relays, replicas, schedules or secrets."""
    out = copy.deepcopy(dict(config))
    out["server"] = {
        "host": "127.0.0.1",
        "port": free_port(),
        "log_level": "warning",
        "access_log": False,
        "api_keys_env": "SWAPGATE_REPLAY_NO_KEYS",
        "admin_token_env": "SWAPGATE_REPLAY_TOKEN",
    }
    routing = dict(out.get("routing") or {})
    for key in _SCALED:
        if key in routing:
            routing[key] = _seconds(routing[key]) / speedup
    routing["poll_interval"] = min(_seconds(routing.get("poll_interval", 5.0)), 1.0)
    out["routing"] = routing
    out["instances"] = [
        {
            key: value
            for key, value in instance.items()
            if key in ("name", "capacity", "weight", "memory", "models")
        }
        | {"kind": "llama-swap", "url": sims[instance["name"]]}
        for instance in config["instances"]
    ]
    out["models"] = {
        model: {
            key: (_seconds(value) / speedup if key == "max_wait" else value)
            for key, value in (conf or {}).items()
            if key not in ("relay", "relay_model", "fallback", "relay_policy")
        }
        for model, conf in (out.get("models") or {}).items()
    }
    out.pop("relays", None)
    out["cluster"] = {"redis_url_env": "SWAPGATE_REPLAY_NO_REDIS"}  # never a live cluster's
    out["preloads"] = [
        {**job, "pin_for": _seconds(job["pin_for"]) / speedup}
        for job in out.get("preloads") or []
        if job.get("pin_for")
    ]
    return out


def _seconds(value: object) -> float:
    seconds = parse_duration(value)
    if not isinstance(seconds, float):
        raise ReplayError(f"not a duration: {value!r}")
    return seconds


@contextmanager
def _simulators(
    instances: Sequence[Mapping[str, Any]],
    models: Sequence[str],
    loads: Mapping[str, Mapping[str, float]],
    speedup: float,
) -> Iterator[dict[str, str]]:
    """A simulator per instance (its name: its URL), loading each model in ``loads[instance]``
    seconds; all started before any is waited for."""
    with ExitStack() as stack:
        started = {}
        for instance in instances:
            port = free_port()
            serves = instance.get("models") or models
            loaded = loads[instance["name"]]
            command = sim_command(
                "llama-swap",
                port,
                models=",".join(serves),
                capacity=instance.get("capacity", 1),
                load_times=",".join(f"{m}={loaded.get(m, 1.0):.4f}" for m in serves),
                ttft=0,
                token_rate=TOKEN_RATE * speedup,
            )
            process = start(command, log=subprocess.DEVNULL)
            stack.callback(stop, process)
            started[instance["name"]] = (f"http://127.0.0.1:{port}", process)
        for url, process in started.values():
            wait_until_serving(f"{url}/v1/models", process)
        yield {name: url for name, (url, _) in started.items()}


@contextmanager
def _gateway(config: Mapping[str, Any]) -> Iterator[str]:
    """A gateway serving ``config`` and nothing of the operator's environment: no ``SWAPGATE_*``
    override, no Redis of a live cluster, a state directory of its own (what it learns of the
    replayed traffic must not reach the live gateway's, swapgate/control/loops/forecast.py)."""
    with (
        tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="swapgate-replay-") as handle,
        tempfile.TemporaryDirectory(prefix="swapgate-replay-state-") as state,
    ):
        yaml.safe_dump(dict(config), handle)
        handle.flush()
        url = f"http://127.0.0.1:{config['server']['port']}"
        command = [sys.executable, "-m", "swapgate", "serve", "--config", handle.name]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWAPGATE_")}
        env |= {"SWAPGATE_REPLAY_TOKEN": REPLAY_TOKEN, STATE_DIR_ENV: state}
        with serving(command, f"{url}/healthz", env, log=subprocess.DEVNULL, clean_env=True):
            yield url


def _run_pins(url: str, config: Mapping[str, Any]) -> None:
    """Run every preload job that pins once, as if the log's day had started with them."""
    headers = {"authorization": f"Bearer {REPLAY_TOKEN}"}
    for job in config.get("preloads") or []:
        if job.get("pin_for"):
            httpx.post(f"{url}/admin/jobs/{job['name']}/run", headers=headers, timeout=600)


def _loads(sims: Iterable[str]) -> int:
    return sum(
        sum(httpx.get(f"{sim}/sim/stats", timeout=10).json()["loads"].values()) for sim in sims
    )


async def _send_all(
    url: str, requests: Sequence[Logged], speedup: float
) -> list[tuple[float, bool]]:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as client:
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def send(request: Logged) -> tuple[float, bool]:
            await asyncio.sleep(max(0.0, started + request.at / speedup - loop.time()))
            sent = loop.time()
            tokens = max(1, round(request.service * TOKEN_RATE))
            body = {
                "model": request.model,
                "max_tokens": tokens,
                "messages": [{"role": "user", "content": "replayed"}],
            }
            try:
                answer = await client.post("/v1/chat/completions", json=body)
            except httpx.HTTPError:
                return loop.time() - sent, False
            return loop.time() - sent, answer.status_code == 200

        return list(await asyncio.gather(*(send(r) for r in requests)))


def _quantiles(seconds: Sequence[float]) -> tuple[float, float]:
    if len(seconds) < 2:
        only = seconds[0] if seconds else 0.0
        return only, only
    cuts = statistics.quantiles(seconds, n=100)
    return cuts[49], cuts[94]


def render(recording: Recording, outcomes: Sequence[Outcome], speedup: float) -> str:
    span = recording.requests[-1].at if recording.requests else 0.0
    measured = ", ".join(
        f"{model} {statistics.median(times):.1f}s"
        for model, times in sorted(recording.swap_times.items())
    )
    lines = [
        f"{len(recording.requests)} requests over {span:.0f}s, replayed {speedup:g}× faster; "
        f"swap times measured in the log: {measured or 'none'}",
        "",
        f"{'run':<40} {'swaps':>6} {'p50':>8} {'p95':>8} {'errors':>7}",
    ]
    for o in [recorded(recording), *outcomes]:
        lines.append(f"{o.name:<40} {o.swaps:>6} {o.p50:>7.2f}s {o.p95:>7.2f}s {o.errors:>7}")
    return "\n".join(lines)
