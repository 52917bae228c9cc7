"""The ``swapgate`` command: thin over serve, check-config, the simulator and the demo."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

# What a command alone needs (the config and its models, Redis's client, the server) it imports
# in its own function: the simulator starts on 0.13 s of CPU, not 0.29 s (the suite starts
# hundreds).
from swapgate import __version__
from swapgate.tools.activity_cli import add_activity_command
from swapgate.tools.admin_cli import add_commands as add_admin_commands
from swapgate.tools.admin_cli import connection_options
from swapgate.tools.arguments import duration, load_times, port_list, size

if TYPE_CHECKING:
    from swapgate.config.settings import Settings


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    result: int = args.run(args)
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swapgate", description=__doc__)
    parser.add_argument("--version", action="version", version=f"swapgate {__version__}")
    commands = parser.add_subparsers(title="commands")

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", default=os.environ.get("SWAPGATE_CONFIG"), help="YAML file")
    serve.add_argument("--host", help="override server.host")
    serve.add_argument("--port", type=int, help="override server.port")
    serve.set_defaults(run=_serve)

    check = commands.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("path")
    check.set_defaults(run=_check_config)

    plan = commands.add_parser(
        "plan", help="what each model takes in memory, and what fits where (docs/memory.md)"
    )
    plan.add_argument("path", help="the config file")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    plan.add_argument(
        "--measured",
        action="store_true",
        help="add what a running gateway (--url) measured each loaded model to take",
    )
    connection_options(plan)
    plan.set_defaults(run=_plan)

    _replay_command(commands)

    sim = commands.add_parser("sim", help="run a simulated inference server")
    _sim_arguments(sim)
    sim.set_defaults(run=_sim)

    demo = commands.add_parser("demo", help="two simulated llama-swap instances + the gateway")
    demo.add_argument(
        "--config",
        help="YAML file of the demo (default: config/demo.yaml, or config/demo-ENGINE.yaml "
        "with --engine: demo-llama-cpp.yaml, demo-llama-server.yaml, demo-llama-swap.yaml)",
    )
    demo.add_argument(
        "--engine",
        choices=("llama.cpp", "llama-server", "llama-swap"),
        help="real engines instead of simulators (built once per machine): llama-cpp-python "
        "servers, llama.cpp's llama-server in router mode, or llama-swap running llama-server",
    )
    demo.add_argument("--load-time", type=duration, default=4.0)
    demo.set_defaults(run=_demo)

    add_admin_commands(commands)
    add_activity_command(commands)
    return parser


def _replay_command(commands: Any) -> None:
    replay = commands.add_parser(
        "replay", help="replay a swapgate log against simulators, under a config and variants"
    )
    replay.add_argument("log", help="swapgate's own log: its access and 'swap done' lines")
    replay.add_argument("--config", required=True, help="the config to replay under")
    replay.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="SPEC",
        help="also replay under KEY=VALUE[,KEY=VALUE…] (routing.eviction=demand, instances=3) "
        "or a config file; repeatable",
    )
    replay.add_argument("--speedup", type=float, default=1.0, help="replay N times faster")
    replay.add_argument("--swap-time", type=duration, help="for models the log measured no swap of")
    replay.add_argument("--json", action="store_true", help="machine-readable output")
    replay.set_defaults(run=_replay)


def _sim_arguments(sim: argparse.ArgumentParser) -> None:
    sim.add_argument(
        "--flavor", choices=("llama-swap", "ollama", "openai", "vllm"), default="llama-swap"
    )
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=9001)
    sim.add_argument(
        "--ports",
        type=port_list,
        default=(),
        help="comma-separated ports, one simulator on each (its own state), in this one process",
    )
    sim.add_argument("--models", default="a,b,c", help="comma-separated model names")
    sim.add_argument("--capacity", type=int, default=1, help="models resident at once")
    sim.add_argument("--load-time", type=duration, default=5.0)
    sim.add_argument(
        "--load-times", type=load_times, default={}, help="per model, over --load-time: a=2,b=30s"
    )
    sim.add_argument("--ttft", type=duration, default=0.05)
    sim.add_argument(
        "--wake-time", type=duration, default=1.0, help="flavour vllm: a wake from sleep level 1"
    )
    sim.add_argument(
        "--keep-alive", type=duration, default=5.0, help="how long an idle connection stays open"
    )
    sim.add_argument(
        "--asleep", type=int, choices=(0, 1, 2), default=0, help="flavour vllm: start asleep"
    )
    sim.add_argument(
        "--prefill", type=duration, default=0.0, help="a stream's headers, then this, then tokens"
    )
    sim.add_argument("--token-rate", type=float, default=50.0, help="tokens per second")
    sim.add_argument("--max-tokens", type=int, default=16, help="answer length by default")
    sim.add_argument("--api-key", help="require this bearer key on /v1 requests")
    sim.add_argument(
        "--protocols",
        default="openai",
        help="comma-separated APIs it speaks: openai, anthropic (/v1/messages)",
    )
    _sim_faults(sim)


def _sim_faults(sim: argparse.ArgumentParser) -> None:
    """How the simulator fails, leaks and decays, as engines do."""
    sim.add_argument("--fail-load-rate", type=float, default=0.0)
    sim.add_argument(
        "--broken", default="", help="comma-separated models whose engine exits at every start"
    )
    sim.add_argument("--crash-mid-stream-rate", type=float, default=0.0)
    sim.add_argument("--hang-rate", type=float, default=0.0)
    sim.add_argument(
        "--crash-on",
        default="",
        help="a request with this text is held --crash-after, then it dies",
    )
    sim.add_argument("--crash-after", type=duration, default=3.0)
    sim.add_argument(
        "--bad-gateway-hold", type=duration, default=0.0, help="each faulted 502 is held so long"
    )
    sim.add_argument(
        "--grow-rss", type=size, default=0, help="bytes kept per request (e.g. 20MiB): a leak"
    )
    sim.add_argument(
        "--ttft-per-gib",
        type=float,
        default=0.0,
        help="seconds its TTFT grows per GiB kept by --grow-rss: a decaying engine",
    )
    sim.add_argument("--seed", type=int, help="seed for the fault dice")


def _load(path: str | None) -> Settings | None:
    from swapgate.config.loading import load_config
    from swapgate.config.settings import ConfigError

    if not path:
        print("swapgate: no config; pass --config PATH or set SWAPGATE_CONFIG", file=sys.stderr)
        return None
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"swapgate: {path}: {exc}", file=sys.stderr)
        return None


def _check_config(args: argparse.Namespace) -> int:
    settings = _load(args.path)
    if settings is None:
        return 1
    names = ", ".join(i.name for i in settings.instances)
    print(f"{args.path}: OK ({len(settings.instances)} instances: {names})")
    for inst in settings.instances:
        print(f"  {inst.name}: resident models limited by {inst.limited_by}")
    for line in keepalive_advice(settings):
        print(line)
    for line in keys_summary(settings):
        print(line)
    for line in slope_advice(settings):
        print(line)
    return 0


def slope_advice(settings: Settings) -> list[str]:
    """A warning for each memory slope that cannot be measured at ``routing.poll_interval``:
    a slope takes three samples, one a poll, so its window must span two polls at least."""
    interval = settings.routing.poll_interval
    windows: dict[str, float] = {}
    for inst in settings.instances:
        for model, command in inst.commands.items():
            if command.recycle_rss_slope is not None:
                windows[f"instances.{inst.name}.commands.{model}.slope_window"] = (
                    command.slope_window
                )
        if inst.commands:
            windows["diagnosis.window"] = settings.diagnosis.window
    from swapgate.control.loops.decay import SLOPE_POINTS

    least = (SLOPE_POINTS - 1) * interval
    return [
        f"warning: {key} {window:g}s cannot be measured at routing.poll_interval {interval:g}s "
        f"(a memory slope takes {SLOPE_POINTS} samples, one a poll): make it {least:g}s or "
        f"more, or poll more often"
        for key, window in windows.items()
        if window < least
    ]


def keys_summary(settings: Settings, today: date | None = None) -> list[str]:
    """The client keys in a line each (docs/keys.md), and which look wrong: expired, or scoped
    to names that match none of the models the config names."""
    from swapgate.proxy.auth import in_scope, scope

    keys = settings.auth.keys
    if not keys:
        return []
    named = set(settings.models) | {m for i in settings.instances for m in i.models or ()}
    today = today or datetime.now(UTC).date()
    lines = [f"  keys: {len(keys)}"]
    for key in keys:
        limits = [f"{key.rpm} rpm"] if key.rpm else []
        limits += [f"{key.concurrency} at once"] if key.concurrency else []
        line = f"    {key.name}: models {', '.join(key.models)}; priority {key.priority}"
        line += "".join(f"; {limit}" for limit in limits)
        if key.expires is not None and key.expires < today:
            line += f"; EXPIRED on {key.expires.isoformat()}"
        elif named and not in_scope(scope(key.models), named):
            line += "; matches none of the models this config names"
        lines.append(line)
    return lines


# Read timeouts of the common fronts, in seconds (docs/operations.md); None: it has none.
FRONT_TIMEOUTS = {
    "nginx proxy_read_timeout": 60.0,
    "AWS ALB idle timeout": 60.0,
    "Cloudflare": 100.0,
    "HAProxy timeout server": None,  # no default: whatever the config says
    "Caddy": None,
}


def keepalive_advice(settings: Settings) -> list[str]:
    """The rule for a proxy in front, and a warning for every keep-alive setting that breaks it
    at a common front's default: each gap without a byte must stay under its read timeout."""
    shortest = min(t for t in FRONT_TIMEOUTS.values() if t is not None)
    fronts = ", ".join(
        f"{name} {t:g}s" if t is not None else f"{name}: none by default"
        for name, t in FRONT_TIMEOUTS.items()
    )
    lines = [
        f"  keep-alives: keep every gap without a byte well under the read timeout of any "
        f"proxy in front ({fronts})"
    ]
    gaps = {
        "keepalive.early_headers_after": settings.keepalive.early_headers_after,
        "keepalive.interval": settings.keepalive.interval,
    }
    for model, conf in settings.models.items():
        own = conf.keepalive
        for key in ("early_headers_after", "interval"):
            value = getattr(own, key) if own is not None else None
            if value is not None:
                gaps[f"models.{model}.keepalive.{key}"] = value
    for key, seconds in gaps.items():
        if seconds >= shortest / 2:
            lines.append(
                f"warning: {key} {seconds:g}s is not well under the {shortest:g}s read timeout "
                f"of nginx and AWS ALB by default: a request that waits behind one gets a cut "
                f"200; keep it under {shortest / 4:g}s, or raise the front's timeout"
            )
    return lines


def _plan(args: argparse.Namespace) -> int:
    """Exit 0 when every model fits somewhere, 1 when one does not (or the config is invalid)."""
    from swapgate.tools.admin_cli import AdminClient, AdminError
    from swapgate.tools.plan import as_json, make_plan, measured_from, render

    settings = _load(args.path)
    if settings is None:
        return 1
    measured = None
    if args.measured:  # docs/memory.md, "Measured memory"
        client = AdminClient(args.url, args.token)
        try:
            measured = measured_from(client.call("GET", "/admin/state"))
        except AdminError as exc:
            print(f"swapgate: {exc}", file=sys.stderr)
            return 1
        finally:
            client.close()
    plan = make_plan(settings, measured)
    print(json.dumps(as_json(plan), indent=2) if args.json else render(plan))
    return 1 if plan.warnings else 0


def _serve(args: argparse.Namespace) -> int:
    from swapgate.config.settings import secret
    from swapgate.server.serve import serve

    settings = _load(args.config)
    if settings is None:
        return 1
    env_name = settings.cluster.redis_url_env
    url = secret(env_name)
    if url is not None:  # Redis's client is imported by a gateway that has replicas
        from swapgate.cluster.store import url_problem

        problem = url_problem(env_name, url)
        if problem is not None:
            print(f"swapgate: {problem}", file=sys.stderr)
            return 1
    serve(settings, config_path=args.config, host=args.host, port=args.port)
    return 0


def _sim(args: argparse.Namespace) -> int:
    from swapgate.sim import SimConfig, run_sim, run_sim_fleet

    options = {k: v for k, v in vars(args).items() if k in SimConfig.__dataclass_fields__}
    for name in ("models", "protocols", "broken"):
        options[name] = tuple(m.strip() for m in getattr(args, name).split(",") if m.strip())
    try:
        config = SimConfig(**options)
    except ValueError as exc:
        print(f"swapgate sim: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s sim %(message)s")
    if args.ports:
        run_sim_fleet(config, args.ports)
    else:
        run_sim(config)
    return 0


def _replay(args: argparse.Namespace) -> int:
    import yaml

    from swapgate.tools import replay

    if args.speedup <= 0:
        print("swapgate replay: --speedup must be above 0, e.g. 10", file=sys.stderr)
        return 2
    if _load(args.config) is None:
        return 1
    try:
        with open(args.log, encoding="utf-8", errors="replace") as log:
            recording = replay.read_log(log)
        base = yaml.safe_load(Path(args.config).read_text())
        configs = {"as configured": base} | {v: replay.variant(base, v) for v in args.variant}
        replay.check(configs)
        span = recording.requests[-1].at / args.speedup
        print(
            f"replaying {len(recording.requests)} requests under {len(configs)} configs, "
            f"side by side: about {span:.0f}s",
            file=sys.stderr,
            flush=True,
        )
        outcomes = replay.replay(recording, configs, args.speedup, args.swap_time)
    except (OSError, replay.ReplayError) as exc:
        print(f"swapgate replay: {exc}", file=sys.stderr)
        return 1
    if args.json:
        rows = [replay.recorded(recording), *outcomes]
        print(json.dumps([dataclasses.asdict(o) for o in rows], indent=2))
    else:
        print(replay.render(recording, outcomes, args.speedup))
    return 0


DEMO_CONFIGS = {
    "llama.cpp": "config/demo-llama-cpp.yaml",
    "llama-server": "config/demo-llama-server.yaml",
    "llama-swap": "config/demo-llama-swap.yaml",
}


def _demo(args: argparse.Namespace) -> int:
    from swapgate.tools.demo import run_demo

    config = args.config or DEMO_CONFIGS.get(args.engine, "config/demo.yaml")
    settings = _load(config)
    if settings is None:
        return 1
    return run_demo(settings, load_time=args.load_time, config_path=config, engine=args.engine)
