"""``swapgate activity``: the activity log's rows over the admin API, newest first; ``swapgate
usage``: requests and tokens per key or model over a period (docs/operations.md, "Activity")."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from swapgate.tools.admin_cli import AdminClient, connection_options, run_command, table

FILTERS = ("model", "key", "instance", "status", "since", "before", "limit")


def add_activity_command(commands: Any) -> None:
    activity = commands.add_parser(
        "activity", help="each request: where it went, how it was placed, how long it waited"
    )
    connection_options(activity)
    activity.add_argument("--model")
    activity.add_argument("--key", help="the client key's configured name")
    activity.add_argument("--instance")
    activity.add_argument("--status", type=int, help="e.g. 429")
    activity.add_argument("--since", help="epoch seconds, or a duration ago: 10m, 2h")
    activity.add_argument("--before", type=int, help="a row's id: the page before it")
    activity.add_argument("--limit", type=int, default=50)
    activity.add_argument("--json", action="store_true", help="the rows as the API gives them")
    activity.set_defaults(run=_activity)
    usage = commands.add_parser(
        "usage", help="requests and tokens per client key or per model over a period"
    )
    connection_options(usage)
    usage.add_argument("--since", default="24h", help="epoch seconds, or a duration ago: 1h, 7d")
    usage.add_argument("--by", choices=("key", "model"), default="key")
    usage.add_argument("--json", action="store_true", help="the sums as the API gives them")
    usage.set_defaults(run=_usage)


def _activity(args: argparse.Namespace) -> int:
    def show(client: AdminClient, _: argparse.Namespace) -> None:
        wanted = {f: getattr(args, f) for f in FILTERS if getattr(args, f) is not None}
        page = client.call("GET", "/admin/activity", params=wanted)
        print(json.dumps(page, indent=2) if args.json else render_activity(page))

    return run_command(args, show)


def render_activity(page: dict[str, Any]) -> str:
    """The rows as a table, newest first, and how to ask for the page before."""
    if not page["rows"]:
        return "no requests recorded" + ("" if page.get("recording", True) else " (activity off)")
    rows = [
        (
            "ID",
            "TIME",
            "KEY",
            "MODEL",
            "INSTANCE",
            "PLACED",
            "SWAP",
            "WAIT",
            "TTFT",
            "TOTAL",
            "TOKENS",
            "STATUS",
            "REQUEST",
        )
    ]
    for row in page["rows"]:
        rows.append(
            (
                str(row["id"]),
                time.strftime("%H:%M:%S", time.localtime(row["at"])),
                row["key"] or "-",
                row["model"],
                row["instance"] or "-",
                row["placement"],
                f"#{row['swap_id']}" if row["swap_id"] is not None else "-",
                _ms(row["wait_ms"]),
                _ms(row["ttft_ms"]),
                _ms(row["duration_ms"]),
                _tokens(row),
                _status(row),
                row["request_id"],
            )
        )
    more = page["next_before"]
    return table(rows) + (f"\nolder: --before {more}" if more is not None else "")


def _usage(args: argparse.Namespace) -> int:
    def show(client: AdminClient, _: argparse.Namespace) -> None:
        sums = client.call("GET", "/admin/usage", params={"since": args.since, "by": args.by})
        print(json.dumps(sums, indent=2) if args.json else render_usage(sums))

    return run_command(args, show)


def render_usage(sums: dict[str, Any]) -> str:
    """Each key's (or model's) requests and tokens, most tokens first, and the total."""
    by = sums["by"]
    if not sums["rows"]:
        return "no requests recorded" + ("" if sums.get("recording", True) else " (activity off)")
    header = (by.upper(), "REQUESTS", "PROMPT", "COMPLETION", "TOTAL")
    rows: list[tuple[str, ...]] = [header]
    for row in sums["rows"]:
        counts = (row["requests"], row["prompt_tokens"], row["completion_tokens"])
        name = row[by] if row[by] is not None else "(no key)"
        rows.append((name, *(f"{n:,}" for n in counts), f"{row['total_tokens']:,}"))
    totals = [sum(row[field] for row in sums["rows"]) for field in _SUMMED]
    rows.append(("all", *(f"{n:,}" for n in totals)))
    since = time.strftime("%Y-%m-%d %H:%M", time.localtime(sums["since"]))
    return f"since {since}\n" + table(rows)


_SUMMED = ("requests", "prompt_tokens", "completion_tokens", "total_tokens")


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f}s" if value >= 1000 else f"{value:.0f}ms"


def _tokens(row: dict[str, Any]) -> str:
    told = [row["tokens_in"], row["tokens_out"]]
    if told == [None, None]:
        return "-"
    return "→".join("?" if count is None else str(count) for count in told)


def _status(row: dict[str, Any]) -> str:
    return f"{row['status']} {row['error']}" if row["error"] else str(row["status"])
