"""``python -m bench.conversations``: what a conversation waits for its next turn (docs/kv-keep.md).

1. **After a swap.** A ~3,000-token conversation on model a (llama-server, Gemma-3-270M, CPU),
   one request for b (a swap away) and a's next turn (a swap back): its time to first token,
   with and without ``kv_keep``, beside the same turn warm.
2. **Agents after a swap.** Three Anthropic-shaped conversations at once (a ~1,000-token system
   prompt each, as coding agents send) on a 4-slot server, a swap away and back, and their next
   turns sent together: their time to first token with and without ``kv_keep``, and the prompt
   tokens the engine read for them.
3. **Among warm copies.** Two warm copies of one model, three conversations interleaved (each
   round's turns 0.3 s apart, in an order that turns each round): the later turns' time to
   first token, p50, with prefix affinity (``affinity_slack: 2``) and without (``0``).

Side by side in one run; times to the first streamed token, as a client sees them. Writes its
section of docs/benchmarks.md.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench import procs
from bench.sections import replace_section
from swapgate.tools.processes import free_port
from testbed.engines import ensure_llama_server
from testbed.served import engine_url, prompt_tokens_read

DOCS = Path(__file__).resolve().parents[1] / "docs"
LONG = "You answer questions about birds of the northern lakes in one short sentence. " * 200
SHORT = "You answer questions about birds in one short sentence. " * 40
TOPICS = ("ducks", "geese", "swans")
AGENTS = ("loons", "terns", "owls")


def first_token(url: str, model: str, messages: list[dict[str, Any]]) -> tuple[float, str, int]:
    """Seconds to the first streamed token, the whole reply, and the prompt tokens read."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
        "timings_per_token": False,
    }
    started, first, reply, read = time.monotonic(), None, "", 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as answer:
        for line in answer.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or ():
                text = (choice.get("delta") or {}).get("content")
                if text:
                    first = first or time.monotonic() - started
                    reply += text
            read = chunk.get("timings", {}).get("prompt_n", read)
    return (first or time.monotonic() - started), reply, read


def commands(slots: int) -> dict[str, Any]:
    server = ensure_llama_server()
    words = server.single("{name}", "${PORT}", ctx=8192)
    words[words.index("-np") + 1] = str(slots)
    line = " ".join([*words, "--swa-full"])
    return {"cmd": line, "ready": "/health"}


def two_models(slots: int, kv: Path | None, flags: str = "") -> dict[str, Any]:
    """A gateway's config: models a and b on one process instance (one at a time), with
    ``kv_keep`` in ``kv`` if given."""
    base = commands(slots)
    line = base["cmd"] + flags
    node: dict[str, Any] = {
        "name": "node",
        "kind": "process",
        "capacity": 1,
        "start_port": free_port(),
        "commands": {n: {**base, "cmd": line.replace("{name}", n)} for n in ("a", "b")},
    }
    if kv is not None:
        node["kv_keep"] = {"dir": str(kv), "budget": "1GiB"}
    return {"routing": {"min_residency": 0}, "instances": [node]}


def after_swap(kept: bool, root: Path) -> dict[str, float]:
    config = two_models(1, root / "kv" if kept else None)
    history: list[dict[str, Any]] = [{"role": "system", "content": LONG}]
    figures = {}
    with procs.swapgate_with(config) as gw:
        for turn in ("first", "warm", "after a swap"):
            if turn == "after a swap":
                first_token(gw.url, "b", [{"role": "user", "content": "Hi."}])
            history.append({"role": "user", "content": f"Tell me of loons ({turn})."})
            seconds, reply, read = first_token(gw.url, "a", history)
            history.append({"role": "assistant", "content": reply})
            figures[turn], figures[f"{turn} read"] = seconds, read
    return figures


def anthropic_first_token(
    url: str, system: str, messages: list[dict[str, Any]]
) -> tuple[float, str]:
    """An Anthropic Messages turn, streamed: seconds to its first text, and its text."""
    body = {
        "model": "a",
        "max_tokens": 8,
        "stream": True,
        "messages": messages,
        "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
    }
    started, first, reply = time.monotonic(), None, ""
    with httpx.stream("POST", f"{url}/v1/messages", json=body, timeout=300) as answer:
        for line in answer.iter_lines():
            if not line.startswith("data: {"):
                continue
            delta = json.loads(line[6:]).get("delta") or {}
            if delta.get("type") == "text_delta" and delta.get("text"):
                first = first or time.monotonic() - started
                reply += delta["text"]
    return (first or time.monotonic() - started), reply or "."


def agents(kept: bool, root: Path) -> dict[str, Any]:
    """Three agents' conversations: turn 1 and 2 at once, a swap away and back, turn 3 at once."""
    config = two_models(4, root / "kv-agents" if kept else None, " --metrics")
    systems = {t: f"You are a coding agent working on the {t} module. " * 90 for t in AGENTS}
    history: dict[str, list[dict[str, Any]]] = {t: [] for t in AGENTS}
    ttfts: list[float] = []

    def turn(topic: str, number: int) -> None:
        history[topic].append({"role": "user", "content": f"Step {number}: go on."})
        seconds, reply = anthropic_first_token(gw.url, systems[topic], history[topic])
        history[topic].append({"role": "assistant", "content": reply})
        if number == 3:
            ttfts.append(seconds)

    with procs.swapgate_with(config) as gw:
        for number in (1, 2, 3):
            if number == 3:
                first_token(gw.url, "b", [{"role": "user", "content": "Hi."}])
            threads = [threading.Thread(target=turn, args=(t, number)) for t in AGENTS]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        read = prompt_tokens_read(engine_url(gw.process.pid, "a"))  # since the swap back
    return {"ttfts": ttfts, "read": read}


def sessions(slack: int) -> list[float]:
    base = commands(3)
    cmd = {**base, "cmd": base["cmd"].replace("{name}", "gemma")}
    config = {
        "server": {"admin_token_env": "BENCH_ADMIN"},
        "routing": {"min_residency": 0, "affinity_slack": slack},
        "instances": [
            {
                "name": n,
                "kind": "process",
                "capacity": 1,
                "start_port": free_port(),
                "commands": {"gemma": cmd},
            }
            for n in ("node-1", "node-2")
        ],
    }
    later: list[float] = []
    history = {t: [{"role": "system", "content": SHORT}] for t in TOPICS}
    with procs.swapgate_with(config, {"BENCH_ADMIN": "b"}) as gw:
        for name in ("node-1", "node-2"):
            body = {"model": "gemma", "instance": name}
            admin = {"authorization": "Bearer b"}
            httpx.post(f"{gw.url}/admin/preload", json=body, headers=admin, timeout=120)

        def turn(topic: str, round_: int) -> None:
            history[topic].append({"role": "user", "content": f"More on {topic}, please."})
            seconds, reply, _ = first_token(gw.url, "gemma", history[topic])
            history[topic].append({"role": "assistant", "content": reply})
            if round_:
                later.append(seconds)

        for round_ in range(4):
            order = TOPICS[round_ % 3 :] + TOPICS[: round_ % 3]
            threads = []
            for topic in order:
                threads.append(threading.Thread(target=turn, args=(topic, round_)))
                threads[-1].start()
                time.sleep(0.3)
            for thread in threads:
                thread.join()
    return later


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        kept = after_swap(True, Path(root))
        lost = after_swap(False, Path(root))
        agents_kept = agents(True, Path(root))
        agents_lost = agents(False, Path(root))
    near = sessions(2)
    far = sessions(0)
    print(
        "kv_keep",
        kept,
        "without",
        lost,
        "agents",
        agents_kept,
        "without",
        agents_lost,
        "affinity",
        near,
        "without",
        far,
        flush=True,
    )
    agent_rows = "\n".join(
        f"| {name} | {statistics.median(a['ttfts']):.2f} s | {max(a['ttfts']):.2f} s "
        f"| {a['read']} |"
        for name, a in (("`kv_keep`", agents_kept), ("without", agents_lost))
    )
    p50_near, p50_far = statistics.median(near), statistics.median(far)
    rows = "\n".join(
        f"| {name} | {f['first']:.2f} s | {f['warm']:.2f} s | **{f['after a swap']:.2f} s** | "
        f"{f['after a swap read']:.0f} |"
        for name, f in (("`kv_keep`", kept), ("without", lost))
    )
    replace_section(
        DOCS / "benchmarks.md",
        "conversations",
        f"""
## Conversations across swaps and copies (`python -m bench.conversations`)

llama-server (CPU, Gemma-3-270M, `--swa-full`) behind swapgate, time to the first streamed token
as a client sees it, one run, side by side, on this 2-core machine.

**The turn after a swap.** A conversation of {kept["first read"]:.0f} prompt tokens on model a,
a request for b (a swap away), then a's next turn (a swap back, `capacity: 1`, `kind: process`):

| | first turn | next turn, warm | next turn after a swap away and back | tokens it read |
|---|---|---|---|---|
{rows}

With `kv_keep` the turn after the swap waits for the swap back and reads only its new tokens;
without, it reads its whole prompt again.

**Agents after a swap.** Three Anthropic-shaped conversations at once (a ~1,000-token system
prompt each) on a 4-slot server (`kind: process`), turns 1 and 2 sent together, a swap away and
back, then their third turns sent together:

| | third turns' time to first token, p50 | max | prompt tokens the engine read for them |
|---|---|---|---|
{agent_rows}

Each conversation is restored into a slot of its own and reads only its new tokens.

**Among warm copies.** Two warm copies of one model (3 slots each), three conversations of
~500-token prompts interleaved over four rounds: the later turns' time to first token, p50
**{p50_near:.2f} s** with prefix affinity (`affinity_slack: 2`) against **{p50_far:.2f} s**
without (`0`): {p50_near / p50_far:.2f}×.
""",
    )


if __name__ == "__main__":
    main()
