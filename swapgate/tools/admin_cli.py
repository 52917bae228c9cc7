"""``swapgate status | preload | unload | jobs | logs``: the admin API from a terminal
(docs/operations.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from swapgate.config.paths import state_directory
from swapgate.tools.arguments import duration_text

DEFAULT_URL = "http://127.0.0.1:8080"
PROGRESS_INTERVAL = 0.5


class AdminError(Exception):
    """What went wrong, in words an operator can act on."""


def add_commands(commands: Any) -> None:
    status = commands.add_parser("status", help="every instance and model: warm, loading, pinned")
    connection_options(status)
    status.set_defaults(run=_status)

    preload = commands.add_parser("preload", help="make a model warm now and show progress")
    connection_options(preload)
    preload.add_argument("model")
    preload.add_argument("--instance", help="on this instance (default: placed like a request)")
    preload.add_argument("--count", type=int, default=1, help="on this many instances")
    preload.add_argument(
        "--pin-for", type=duration_text, default="0s", help="pin it for this long, e.g. 10h"
    )
    preload.set_defaults(run=_preload)

    unload = commands.add_parser("unload", help="evict a model (and drop its pin)")
    connection_options(unload)
    unload.add_argument("model")
    unload.add_argument("--instance", help="only from this instance")
    unload.set_defaults(run=_unload)

    jobs = commands.add_parser("jobs", help="scheduled preloads with their next runs")
    connection_options(jobs)
    jobs.set_defaults(run=_jobs)

    logs = commands.add_parser("logs", help="the last output of a model's process (kind: process)")
    connection_options(logs)
    logs.add_argument("model")
    logs.add_argument("--instance", help="only on this instance")
    logs.set_defaults(run=_logs)


def connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("SWAPGATE_URL", DEFAULT_URL),
        help="the gateway (env SWAPGATE_URL)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("SWAPGATE_ADMIN_TOKEN"),
        help="the admin token (env SWAPGATE_ADMIN_TOKEN)",
    )


def demo_token_path() -> Path:
    """Where a running demo keeps its admin token for the CLI (swapgate/tools/demo.py)."""
    # not .json: the process ledger sweeps those from the same directory
    return state_directory() / "demo-admin-token"


def _demo_token(url: str) -> str | None:
    """A running demo's own token (``make run``), when the CLI talks to that demo."""
    try:
        saved = json.loads(demo_token_path().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("url") != url.rstrip("/"):
        return None
    token, pid = saved.get("token"), saved.get("pid")
    return token if isinstance(token, str) and isinstance(pid, int) and _alive(pid) else None


def _alive(pid: int) -> bool:
    """Whether the demo that wrote a token still runs (a killed one, SIGKILL, leaves its file)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class AdminClient:
    def __init__(self, url: str, token: str | None, timeout: float | None = 30.0) -> None:
        import httpx  # here: the commands that never call the admin API start without it

        self.url = url.rstrip("/")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def call(self, method: str, path: str, **options: Any) -> Any:
        import httpx  # imported once already, by __init__

        try:
            response = self._http.request(method, path, **options)
        except httpx.HTTPError as exc:
            raise AdminError(
                f"cannot reach swapgate at {self.url} ({type(exc).__name__}); is it running? "
                "Point --url or SWAPGATE_URL at it"
            ) from None
        body = (
            response.json()
            if response.headers.get("content-type", "").startswith("application/json")
            else {}
        )
        if response.status_code == 401:
            raise AdminError(
                "the admin token was refused; pass --token or set SWAPGATE_ADMIN_TOKEN"
            )
        if response.status_code >= 400 and "error" in body:
            problems = body["error"].get("problems", [])
            raise AdminError("\n  ".join([body["error"]["message"], *problems]))
        return body

    def close(self) -> None:
        self._http.close()


def run_command(args: argparse.Namespace, command: Any, timeout: float | None = 30.0) -> int:
    client = AdminClient(args.url, args.token or _demo_token(args.url), timeout)
    try:
        command(client, args)
    except AdminError as exc:
        print(f"swapgate: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


def _status(args: argparse.Namespace) -> int:
    return run_command(
        args, lambda client, _: print(render_status(client.call("GET", "/admin/state")))
    )


def render_status(state: dict[str, Any]) -> str:
    rows = [
        (
            "INSTANCE",
            "MODEL",
            "STATE",
            "PINNED UNTIL",
            "IN-FLIGHT",
            "QUEUE",
            "ETA",
            "WEIGHTS IN RAM",
            "ENGINE",
        )
    ]
    for inst in state["instances"]:
        name = inst["name"] + _condition(inst)
        for model in sorted(set(inst["serves"]) | set(inst["models"])):
            view = inst["models"].get(model, {})
            summary = state["models"].get(model, {})
            eta = summary.get("eta_seconds", {}).get(inst["name"])
            rows.append(
                (
                    name,
                    model,
                    _model_state(view),
                    view.get("pinned_until") or "-",
                    str(view.get("inflight", 0)),
                    str(summary.get("queue", 0)),
                    f"{eta:.0f}s" if eta is not None else "-",
                    _weights(summary.get("weights")),
                    _diagnosis(view.get("diagnosis")),
                )
            )
    cluster = state.get("cluster")
    keys = render_keys(state.get("keys", {}), (cluster or {}).get("keys"))
    failing = render_failing(state.get("failing") or {})
    return (
        table(rows)
        + (f"\n\n{failing}" if failing else "")
        + (f"\n\n{keys}" if keys else "")
        + (f"\n\n{render_cluster(cluster)}" if cluster else "")
    )


def render_failing(failing: dict[str, Any]) -> str:
    """The models whose loads fail fleet-wide (docs/operations.md, "When part of the fleet
    breaks"): answered at once until their next probe."""
    if not failing:
        return ""
    rows = [("FAILING MODEL", "SINCE", "NEXT TRY IN", "FAILED PROBES", "LAST ERROR")]
    for model, view in sorted(failing.items()):
        rows.append(
            (
                model,
                f"{view['since_seconds']:.0f}s ago",
                f"{view['next_probe_in']:.0f}s",
                str(view["failed_probes"]),
                str(view["error"]).replace("\n", " | ")[:120],
            )
        )
    return table(rows)


def render_keys(keys: dict[str, Any], shared: dict[str, Any] | None) -> str:
    """Each client key's use against its limits (docs/keys.md): on this replica, and with
    replicas in all of them; "" without keys."""
    if not keys:
        return ""

    def use(name: str, key: dict[str, Any], what: str, limit: int | None) -> str:
        everywhere = (shared or {}).get(name, {}).get(what)
        text = str(key[what]) + (f" here, {everywhere} in all" if everywhere is not None else "")
        return text + (f" of {limit}" if limit else "")

    rows = [("KEY", "CLASS", "MODELS", "IN-FLIGHT", "LAST MINUTE", "EXPIRES")]
    for name, key in keys.items():
        rows.append(
            (
                name,
                _priority_class(key["priority"]),
                ", ".join(key["models"]),
                use(name, key, "in_flight", key["concurrency"]),
                use(name, key, "last_minute", key["rpm"]),
                key["expires"] or "never",
            )
        )
    return table(rows)


def _diagnosis(diagnosis: dict[str, Any] | None) -> str:
    """A warm engine's diagnosis and the figure behind it (docs/operations.md)."""
    if not diagnosis:
        return "-"
    state, drift = diagnosis["state"], diagnosis.get("ttft_drift_ratio")
    if drift is None:
        return f"{state} (TTFT baseline not ready)" if state == "healthy" else state
    figures = f"TTFT p95 {drift:.1f}× baseline"
    slope = diagnosis.get("rss_slope_bytes_per_hour")
    if slope is not None:
        figures += f", memory {slope / 2**20:+.0f} MiB/h"
    relay = diagnosis.get("relay_drift_ratio")
    if relay is not None:
        figures += f", relay {relay:.1f}×"
    return f"{state} ({figures})"


def _priority_class(priority: int) -> str:
    from swapgate.config.settings import PRIORITY_CLASSES

    named = {value: name for name, value in PRIORITY_CLASSES.items()}
    return f"{named[priority]} ({priority})" if priority in named else str(priority)


def render_cluster(cluster: dict[str, Any]) -> str:
    """The replicas sharing state (docs/deploy.md): heartbeats, swap locks, the scheduler."""
    now = time.time()
    rows = [("REPLICA", "LAST HEARTBEAT", "HOLDS")]
    locks = cluster.get("swap_locks", {})
    for replica in cluster.get("replicas", []):
        rid = replica["id"]
        holds = [
            f"swap lock {i} ({lock['model']})"
            for i, lock in locks.items()
            if lock["replica"] == rid
        ]
        holds += ["scheduler"] if cluster.get("scheduler") == rid else []
        mark = " (this one)" if rid == cluster.get("replica") else ""
        ago = max(0.0, now - float(replica["last_heartbeat"]))
        rows.append((rid + mark, f"{ago:.1f}s ago", ", ".join(holds) or "-"))
    redis = "up" if cluster.get("redis_up") else "DOWN (each replica on its own view)"
    return f"redis: {redis}\n" + table(rows)


def _weights(weights: dict[str, int] | None) -> str:
    """How much of a model's weight files the page cache holds (docs/host-cache.md)."""
    if not weights or not weights["bytes"]:
        return "-"
    from swapgate.config.sizes import human

    share = weights["resident_bytes"] / weights["bytes"]
    return f"{share:.0%} of {human(weights['bytes'])}"


def _model_state(view: dict[str, Any]) -> str:
    """A model's state on an instance, and why it cannot load there now, if it cannot."""
    state = str(view.get("state", "cold"))
    if view.get("unreachable"):
        return f"{state} (unreachable: {view['unreachable']})"
    if view.get("backoff_until"):
        return f"{state} (backing off until {view['backoff_until']}: its load failed)"
    return state


def _condition(inst: dict[str, Any]) -> str:
    notes = [] if inst["up"] else ["down"]
    notes += ["drained"] if inst["drained"] else []
    notes += [f"swapping {inst['swapping']}"] if inst["swapping"] else []
    notes += ["backing off"] if inst["backoff_until"] else []
    return f" ({', '.join(notes)})" if notes else ""


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _preload(args: argparse.Namespace) -> int:
    return run_command(args, _preload_with_progress, timeout=None)


def _preload_with_progress(client: AdminClient, args: argparse.Namespace) -> None:
    body = {"model": args.model, "count": args.count, "pin_for": args.pin_for}
    if args.instance:
        body["instance"] = args.instance
    outcome: dict[str, Any] = {}

    def request() -> None:
        try:
            outcome["result"] = client.call("POST", "/admin/preload", json=body)
        except AdminError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=request, daemon=True)
    started = time.monotonic()
    worker.start()
    shown = ""
    while worker.is_alive():
        worker.join(PROGRESS_INTERVAL)
        if worker.is_alive():
            line = _progress(client, args.model, time.monotonic() - started)
            if line != shown:
                print(line, flush=True)
                shown = line
    if "error" in outcome:
        raise outcome["error"]
    print(_preload_summary(outcome["result"], args.pin_for))


def _progress(client: AdminClient, model: str, elapsed: float) -> str:
    try:
        summary = client.call("GET", "/admin/state")["models"].get(model, {})
    except AdminError:
        return f"waiting for {model}… {elapsed:.0f}s"
    loading = ", ".join(summary.get("loading_on", [])) or "-"
    warm = ", ".join(summary.get("warm_on", [])) or "-"
    return f"{model}: loading on {loading}; warm on {warm} ({elapsed:.0f}s)"


def _preload_summary(result: dict[str, Any], pin_for: str) -> str:
    where = ", ".join(result["instances"]) or "no instance"
    if not result["ok"]:
        raise AdminError(
            f"preload of {result['model']} failed: {result['error']} (warm on {where})"
        )
    pinned = f", pinned for {pin_for}" if pin_for not in ("0", "0s") else ""
    return f"{result['model']} is warm on {where}{pinned} ({result['seconds']:.1f}s)"


def _unload(args: argparse.Namespace) -> int:
    def unload(client: AdminClient, _: argparse.Namespace) -> None:
        body = {"model": args.model, **({"instance": args.instance} if args.instance else {})}
        done = client.call("POST", "/admin/unload", json=body)["unloaded"]
        print(
            f"unloaded {args.model} from {', '.join(done)}"
            if done
            else f"{args.model} was not loaded anywhere"
        )

    return run_command(args, unload)


def _jobs(args: argparse.Namespace) -> int:
    return run_command(
        args, lambda client, _: print(render_jobs(client.call("GET", "/admin/jobs")))
    )


def render_jobs(body: dict[str, Any]) -> str:
    if not body["jobs"]:
        return "no preload jobs configured"
    rows = [("NAME", "MODEL", "CRON", "TIMEZONE", "NEXT RUN", "LAST RUN", "LAST RESULT")]
    for job in body["jobs"]:
        result = job["last_result"]
        outcome = (
            "-" if result is None else ("ok" if result["ok"] else f"failed: {result['error']}")
        )
        rows.append(
            (
                job["name"],
                job["model"],
                job["cron"] or "auto",
                job["timezone"],
                job["next_run"] or "-",
                job["last_run"] or "-",
                outcome,
            )
        )
    notes = [_predicted(job) for job in body["jobs"] if job.get("prediction")]
    return "\n".join([table(rows), *notes])


def _predicted(job: dict[str, Any]) -> str:
    """What an auto job learned, in a sentence."""
    p = job["prediction"]
    kinds = []
    for kind, peaks in p["peaks"].items():
        days = p["learned_days"][kind]
        learned = f"learned over {days} day{'s' if days != 1 else ''}"
        if peaks:
            kinds.append(f"at {', '.join(peaks)} {job['timezone']} on {kind} ({learned})")
        else:
            kinds.append(f"on {kind} no peak yet ({learned})")
    line = f"{job['name']}: {job['model']} peaks " + "; ".join(kinds)
    if p["next_peak"]:
        line += (
            f"; next peak {p['next_peak']} (usually {p['usual_requests']:g} requests in "
            f"its first 15 minutes), warmed from {job['next_run']}"
        )
    if p["skipped"]:
        line += f"; last peak not warmed for: {p['skipped']}"
    return line


def _logs(args: argparse.Namespace) -> int:
    return run_command(
        args,
        lambda client, _: print(
            render_logs(client.call("GET", "/admin/state"), args.model, args.instance)
        ),
    )


def render_logs(state: dict[str, Any], model: str, instance: str | None = None) -> str:
    """The last lines each process of ``model`` wrote, one block per instance."""
    found = [
        (inst["name"], inst["processes"][model])
        for inst in state["instances"]
        if model in inst.get("processes", {}) and instance in (None, inst["name"])
    ]
    if not found:
        where = f"instance {instance}" if instance else "any instance"
        raise AdminError(
            f"{model} has no process on {where}: swapgate keeps the output of the processes "
            "it starts (instances of kind: process); see `swapgate status` for where it runs"
        )
    blocks = []
    for name, proc in found:
        running = f"pid {proc['pid']}, port {proc['port']}" if "pid" in proc else "not running"
        lines = proc["output"] or ["(no output yet)"]
        blocks.append("\n".join([f"== {name}/{model} ({running}) ==", *lines]))
    return "\n\n".join(blocks)
