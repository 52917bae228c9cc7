"""The configuration's schema: ``Settings`` and its sections, validated field by field.

``swapgate.config.loading.load_config`` reads a file into them. Secrets never live in the file:
``*_env`` keys name the environment variables that hold them (``secret``).
"""

from __future__ import annotations

import os
import re
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from swapgate.config.durations import parse_duration
from swapgate.config.model_params import Capability, ParamsConfig
from swapgate.config.sizes import Bytes, SizeConfig, parse_size

__all__ = ["ConfigError", "Settings", "parse_duration", "parse_size"]

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"


class ConfigError(Exception):
    """The configuration is invalid; ``problems`` lists each one as ``path: message``."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration:\n" + "\n".join(f"  {p}" for p in problems))
        self.problems = problems


def _check_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a URL: {value!r}; expected http://host:port")
    return value.rstrip("/")


def _yaml_off(value: object) -> object:
    """YAML 1.1 reads a bare ``off`` as false; in these keys it means the word."""
    return "off" if value is False else value


# Finite: YAML reads ``.inf`` and a long run of digits overflows to it, and an infinite timeout
# crashes the server where it is rounded to whole seconds (uvicorn's keep-alive, Retry-After).
Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0, allow_inf_nan=False)]
PositiveDuration = Annotated[
    float, BeforeValidator(parse_duration), Field(gt=0, allow_inf_nan=False)
]
Url = Annotated[str, AfterValidator(_check_url)]


Name = Annotated[str, Field(pattern=_NAME)]
RelayPolicy = Annotated[Literal["off", "error", "slow", "swap"], BeforeValidator(_yaml_off)]
# Which model makes room (docs/configuration.md, "eviction"): the one list of the modes.
EvictionMode = Literal["lru", "demand"]
InstanceKind = Literal[
    "llama-swap", "ollama", "openai", "swap-on-request", "process", "vllm-sleep", "llama-router"
]
# The APIs an upstream speaks besides OpenAI's chat, completions and embeddings: a Messages
# request for one that does not speak ``anthropic``, or a Responses request for one that does
# not speak ``responses``, is translated to chat completions (docs/compatibility.md).
Protocols = Annotated[
    list[Literal["openai", "anthropic", "responses"]],
    Field(default_factory=lambda: ["openai"], min_length=1),
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_PER = {"h": 1.0, "m": 60.0, "s": 3600.0}


def parse_rate(value: object) -> object:
    """Bytes per hour: ``500MiB/h``, ``10MiB/m``, ``1MiB/s``, or a plain number per hour."""
    hint = "use e.g. 500MiB/h, 10MiB/m or a number of bytes per hour"
    if isinstance(value, str):
        amount, _, per = value.strip().rpartition("/")
        if per.strip() in _PER and amount:
            size = parse_size(amount.strip())
            assert isinstance(size, int)
            return size * _PER[per.strip()]
        raise ValueError(f"not a rate: {value!r}; {hint}")
    if isinstance(value, bool):
        raise ValueError(f"not a rate: {hint}")
    return value


BytesPerHour = Annotated[float, BeforeValidator(parse_rate), Field(gt=0, allow_inf_nan=False)]


def _per_second(value: object) -> object:
    """Bytes per second: ``512MiB/s``, ``1GiB/m``, or a plain number of bytes."""
    if isinstance(value, str) and "/" in value:
        per_hour = parse_rate(value)
        assert isinstance(per_hour, float | int)
        return per_hour / 3600
    return parse_size(value)


BytesPerSecond = Annotated[float, BeforeValidator(_per_second), Field(gt=0, allow_inf_nan=False)]


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    api_keys_env: str = "SWAPGATE_API_KEYS"
    admin_token_env: str = "SWAPGATE_ADMIN_TOKEN"
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    access_log: bool = True
    shutdown_grace: Duration = 30.0
    # An idle client connection stays open this long: longer than a proxy in front keeps one
    # (nginx: 60s), so the proxy never sends a request on a connection swapgate is closing.
    idle_timeout: PositiveDuration = 75.0
    # Bounds on what a client connection may cost (swapgate/server/connections.py); answers are
    # unbounded.
    max_header_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)
    request_read_timeout: PositiveDuration = 30.0
    max_connections: int = Field(4096, ge=1, le=1_000_000)


class RoutingConfig(_Section):
    poll_interval: PositiveDuration = 5.0
    max_wait: PositiveDuration = 120.0
    queue_limit: int = Field(256, ge=1)
    # Unset: follow the measured swaps (swapgate/policy/timing.py), so one config fits 1 s wakes and
    # 60 s loads; a value set here is used as it is.
    min_residency: Duration | None = None
    swap_timeout: PositiveDuration = 300.0
    # The ttl of every model that sets none (Ollama's OLLAMA_KEEP_ALIVE); 0: never
    ttl: Duration = 0.0
    # Among warm copies of a model, a conversation goes back to the one that served it last
    # unless that one has more than this many requests in flight beyond the least busy; 0: off
    affinity_slack: int = Field(2, ge=0)
    # Two or more of an instance's models failing to load within this window back off the
    # whole instance; one alone backs off only itself (swapgate/policy/backoff.py).
    backoff_window: PositiveDuration = 60.0
    expected_swap: PositiveDuration | None = None
    stream_idle_timeout: PositiveDuration = 120.0
    eviction: EvictionMode = "lru"
    # Under demand: a model likely requested again within this many of its swap times stays.
    demand_horizon: float = Field(3.0, gt=0, allow_inf_nan=False)
    # A request that has waited this fraction of max_wait for capacity closes a busy model;
    # unset: after its model's measured swap time, and never later than 0.25 of max_wait.
    starvation_after: Annotated[float, Field(gt=0, lt=1)] | None = None
    # The longest a request waits behind another model's requests (their batch keeps that model
    # busy) before that model closes for it; unset: as starvation_after says. Set, it wins.
    max_passover: PositiveDuration | None = None


StreamingKeepalive = Annotated[Literal["comment", "reasoning", "off"], BeforeValidator(_yaml_off)]
NonStreamingKeepalive = Annotated[Literal["whitespace", "off"], BeforeValidator(_yaml_off)]
# What a streamed chat completion waiting for a swap is told (docs/operations.md, "Load progress")
ProgressMode = Annotated[Literal["off", "reasoning"], BeforeValidator(_yaml_off)]


class KeepaliveConfig(_Section):
    early_headers_after: Duration = 1.0
    interval: PositiveDuration = 5.0
    streaming: StreamingKeepalive = "comment"
    non_streaming: NonStreamingKeepalive = "whitespace"
    # reasoning: a streamed chat completion waiting for a swap gets the load's progress as
    # reasoning_content; per model (models.NAME.progress), per key, per request too
    progress: ProgressMode = "off"

    @property
    def progress_mode(self) -> ProgressMode:
        """``progress``, where ``streaming: reasoning`` (before progress existed) means it."""
        return "reasoning" if self.streaming == "reasoning" else self.progress


class KeepaliveOverride(_Section):
    """Per-model keep-alive settings; unset keys take the global ``keepalive`` section's."""

    early_headers_after: Duration | None = None
    interval: PositiveDuration | None = None
    streaming: StreamingKeepalive | None = None
    non_streaming: NonStreamingKeepalive | None = None
    progress: ProgressMode | None = None


class ProcessCommand(_Section):
    """How a ``process`` instance runs one model's server (docs/configuration.md)."""

    cmd: str = Field(min_length=1)
    env: dict[str, str] = {}
    ready: str = Field("/v1/models", pattern=r"^/")
    stop_timeout: PositiveDuration = 10.0
    # Drained and restarted once idle when its process group's resident size passes this.
    recycle_rss: Bytes | None = None
    # ... or when its resident size grows this fast, sustained over ``slope_window``
    recycle_rss_slope: BytesPerHour | None = None
    slope_window: PositiveDuration = 1800.0


def _command(value: object) -> object:
    return {"cmd": value} if isinstance(value, str) else value


KV_KINDS = ("process", "llama-router", "llama-swap")  # the kinds kv_keep saves slots on


class KvKeepConfig(_Section):
    """Conversations kept across swaps (docs/kv-keep.md): each slot's KV cache saved to
    ``dir`` before its model is unloaded, restored when a turn of it comes back."""

    dir: str = Field(min_length=1)
    budget: Bytes = 20 * 2**30  # saved files beyond it go, least recently used first
    # Saving before an unload stops after this long: it holds up the swap, not its swap_timeout
    save_timeout: PositiveDuration = 10.0
    # One client key's saved KV is restored into another key's request only when this is set:
    # a turn that reads fast betrays that another tenant sent the same prompt
    share_across_keys: bool = False


class InstanceConfig(_Section):
    name: Name
    kind: InstanceKind = "llama-swap"
    url: Url = ""  # required but for kind: process, whose servers are swapgate's own children
    models: list[str] | None = None
    # Unset: 1, or what the backend says it runs at once (a llama-router's --models-max)
    capacity: int = Field(1, ge=1)
    api_key_env: str | None = None
    weight: float = Field(1.0, gt=0, allow_inf_nan=False)
    memory: Bytes | None = None  # what its models may take at once (docs/memory.md), with capacity
    protocols: Protocols
    # kind: process only
    start_port: int = Field(5800, ge=1024, le=65535)
    commands: dict[str, Annotated[ProcessCommand, BeforeValidator(_command)]] = {}
    # kind: vllm-sleep only: a vLLM server per model, all but capacity of them asleep
    servers: dict[str, Url] = {}
    sleep_level: Literal[1, 2] = 1
    # kind: process (llama-server) or llama-router: conversations saved across swaps
    kv_keep: KvKeepConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _process_defaults(cls, data: object) -> object:
        """A process instance's models are its commands', at swapgate's own loopback."""
        if isinstance(data, dict) and data.get("kind") == "llama-router":
            # llama-server speaks Messages and Responses itself: no translation to chat
            data = {"protocols": ["openai", "anthropic", "responses"], **data}
        if isinstance(data, dict) and data.get("kind") in ("process", "vllm-sleep"):
            own = data.get("commands" if data["kind"] == "process" else "servers")
            data = {"url": "http://127.0.0.1", **data}
            if data.get("models") is None and isinstance(own, dict):
                data["models"] = list(own)
        return data

    @property
    def capacity_set(self) -> bool:
        """Whether the operator set ``capacity`` (else a backend's own limit may replace it)."""
        return "capacity" in self.model_fields_set

    @property
    def count_limit(self) -> int | None:
        """How many models may be resident at once by count: ``capacity`` when set; none when
        ``memory`` alone limits (it is set and ``capacity`` is not); else 1."""
        if self.capacity_set or self.memory is None:
            return self.capacity
        return None

    @property
    def limited_by(self) -> str:
        """Which limit applies, in words, for check-config and plan."""
        count = self.count_limit
        if self.memory is None:
            return f"capacity {count}"
        memory = f"memory {self.memory / 2**30:g} GiB"
        return memory if count is None else f"capacity {count} and {memory}"

    @model_validator(mode="after")
    def _fits_its_kind(self) -> InstanceConfig:
        if self.kind == "process":
            if not self.commands:
                raise ValueError("kind: process needs commands: one server command per model")
            if set(self.models or ()) != set(self.commands):
                raise ValueError("models and commands name different models; drop models")
        elif self.kind == "vllm-sleep":
            if not self.servers:
                raise ValueError("kind: vllm-sleep needs servers: one vLLM server URL per model")
            if set(self.models or ()) != set(self.servers):
                raise ValueError("models and servers name different models; drop models")
        elif not self.url:
            raise ValueError(f"kind: {self.kind} needs the url of its server")
        if self.commands and self.kind != "process":
            raise ValueError("commands are for kind: process only")
        if self.servers and self.kind != "vllm-sleep":
            raise ValueError("servers are for kind: vllm-sleep only")
        if self.kv_keep is not None and self.kind not in KV_KINDS:
            raise ValueError(
                "kv_keep is for kind: process (running llama-server), llama-router and "
                "llama-swap (running llama-server) only: they save and restore a slot's KV cache"
            )
        return self

    @property
    def kv_folder(self) -> Path | None:
        """Where its llama-servers save their slots (``--slot-save-path``, docs/kv-keep.md):
        ``kv_keep.dir`` itself for ``llama-swap``, whose commands name it; else a folder per
        instance under it."""
        if self.kv_keep is None:
            return None
        root = Path(self.kv_keep.dir).expanduser()
        return root if self.kind == "llama-swap" else root / self.name


class PoolConfig(_Section):
    """Some of a model's instances, for prompts up to ``max_prompt_tokens`` (docs/operations.md)."""

    name: Name
    instances: Annotated[list[str], Field(min_length=1)]
    max_prompt_tokens: Annotated[int, Field(ge=1)] | None = None


class ChooseConfig(_Section):
    """A selector (docs/configuration.md, "Selectors"): a model name whose requests go to the
    first of ``from`` that is warm (``warm``; then waking, then cached, else the first), or
    always to the first (``first``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    targets: Annotated[list[str], Field(min_length=1, alias="from")]
    strategy: Literal["warm", "first"] = "warm"


class ModelConfig(SizeConfig):
    """A model's routing keys; its memory keys are ``SizeConfig``'s (docs/memory.md)."""

    choose: ChooseConfig | None = None  # a selector: no instance serves it, its targets do
    progress: ProgressMode | None = None  # the load's progress told while waiting; None: global

    aliases: list[str] = []
    upstream_names: dict[str, str] = {}
    relay: str | None = None
    relay_model: str | None = None
    fallback: RelayPolicy | None = None
    # Other models of this gateway that answer, in order, when this one cannot
    # (docs/configuration.md, "Fallback models")
    fallbacks: list[str] = []
    max_wait: PositiveDuration | None = None
    keepalive: KeepaliveOverride | None = None
    pools: list[PoolConfig] = []  # tried in order: the first the prompt fits
    # Requests at once on each instance; those beyond it wait in swapgate's queue (None: no cap)
    max_concurrency: Annotated[int, Field(ge=1)] | None = None
    # Unloaded once idle this long on an instance (0: never; unset: routing.ttl); a request's
    # keep_alive replaces it unless allow_keep_alive is false (docs/configuration.md, "Idle unload")
    ttl: Duration | None = None
    allow_keep_alive: bool = True
    # Body keys forced, defaulted, stripped (swapgate/config/model_params.py); None: as sent
    params: ParamsConfig | None = None
    capabilities: list[Capability] = []  # told by /v1/models, with what its engine says

    @property
    def relay_policy(self) -> RelayPolicy:
        """The policy in force: ``swap`` when a relay is set and none is named, else ``off``."""
        if self.fallback is not None:
            return self.fallback
        return "swap" if self.relay else "off"


class RelayConfig(_Section):
    url: Url
    api_key_env: str | None = None
    timeout: PositiveDuration = 120.0
    protocols: Protocols
    # A tiny prompt to each warm model with this relay and to the relay itself, this often: the
    # relay as a control for the engines' decay (docs/operations.md). Off unless set.
    probe_interval: PositiveDuration | None = None


class DiagnosisConfig(_Section):
    """How engine decay is told apart (docs/operations.md, "Is the decay local?")."""

    baseline: PositiveDuration = 3600.0  # after a load: what its TTFT is measured against
    window: PositiveDuration = 600.0  # the rolling TTFT and requests per second
    drift: float = Field(1.5, gt=1, allow_inf_nan=False)  # TTFT p95 / baseline p95 that is decay
    # A process's memory growing at least this fast is growing, not flat
    memory_slope: BytesPerHour = 100 * 2**20


class PreloadConfig(_Section):
    name: Name
    model: str
    cron: str | None = None
    # Instead of a cron: learn the model's time-of-day peaks and warm it shortly before each
    # (swapgate/control/loops/forecast.py); its name defaults to auto-MODEL.
    auto: bool = False
    timezone: str = "UTC"
    instances: int = Field(1, ge=1)
    pin_for: Duration = 0.0

    @model_validator(mode="before")
    @classmethod
    def _auto_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("auto") is True and "name" not in data:
            model = data.get("model")
            if isinstance(model, str) and model:
                return {**data, "name": "auto-" + re.sub(r"[^A-Za-z0-9_.:-]", "-", model)}
        return data


class ClusterConfig(_Section):
    """Replicas sharing state through Redis (docs/deploy.md): on once the variable holds a URL."""

    redis_url_env: str = "SWAPGATE_REDIS_URL"
    replica_id: str = ""  # default: hostname-pid


# The named priority classes; any integer is a class too, higher served first (docs/keys.md).
PRIORITY_CLASSES = {"interactive": 10, "default": 0, "batch": -10}


def parse_priority(value: object) -> object:
    """``interactive``, ``default``, ``batch`` or an integer (a string of one too)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in PRIORITY_CLASSES:
            return PRIORITY_CLASSES[text]
        if re.fullmatch(r"[+-]?\d{1,6}", text):
            return int(text)
        raise ValueError(
            f"not a priority: {value!r}; use interactive, default, batch or an integer"
        )
    if isinstance(value, bool):
        raise ValueError("not a priority: use interactive, default, batch or an integer")
    return value


Priority = Annotated[int, BeforeValidator(parse_priority), Field(ge=-999_999, le=999_999)]


def _lower(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


class KeyConfig(_Section):
    """One client key: who it is, what it may use, how much, and how urgent (docs/keys.md)."""

    name: Name
    # The SHA-256 of the key, in hex: the key itself is never written down
    sha256: Annotated[str, BeforeValidator(_lower), Field(pattern=r"^[0-9a-f]{64}$")]
    models: Annotated[list[str], Field(min_length=1)] = ["*"]  # names or glob patterns
    priority: Priority = 0
    # Whether x-swapgate-priority may raise a request above the key's own class (lowering
    # it is always allowed)
    priority_header: bool = False
    progress: ProgressMode | None = None  # what its waiting streams are told; None: the model's
    rpm: Annotated[int, Field(ge=1)] | None = None  # requests per minute
    # Tokens per minute, prompt and completion as the engines report them (their usage)
    tpm: Annotated[int, Field(ge=1)] | None = None
    concurrency: Annotated[int, Field(ge=1)] | None = None  # requests at once
    expires: date | None = None  # the last day it works (UTC)
    allow_keep_alive: bool = True  # false: its requests' keep_alive is ignored


class AuthConfig(_Section):
    """Who may call besides the admin token: scoped client keys and a viewer's token
    (docs/keys.md, docs/operations.md)."""

    keys: list[KeyConfig] = []
    # A YAML file of more keys (a list, or a mapping with ``keys``), read again at each reload;
    # relative to the config file's folder.
    keys_file: str | None = None
    # A read-only token: the admin API's GET routes, the event stream and the dashboard.
    viewer_token_env: str = "SWAPGATE_VIEWER_TOKEN"


class HostCacheConfig(_Section):
    """Weights of the models likeliest to load next, kept in the host's page cache ahead of
    their swap (docs/host-cache.md). Off unless ``budget`` is set."""

    budget: Bytes | None = None  # page cache swapgate may fill with weights of models not loaded
    read_rate: BytesPerSecond = 512 * 2**20  # how fast it reads them in, never during a load
    interval: PositiveDuration = 1.0  # how often it looks again


class ActivityConfig(_Section):
    """The activity log: one row per request, kept in SQLite (docs/operations.md, "Activity")."""

    enabled: bool = True
    # The database file; unset: activity-PORT.sqlite3 in the state directory (config/paths.py);
    # ":memory:" keeps it in memory, for as long as the gateway runs.
    path: str | None = None
    max_rows: Annotated[int, Field(ge=1)] = 100_000
    max_age: PositiveDuration = 7 * 24 * 3600.0  # a week


class CaptureConfig(_Section):
    """Whose request and response bodies are kept, compressed, beside the activity log: none
    unless the operator writes ``capture:`` (docs/operations.md, "Captures")."""

    models: list[str] = []
    keys: list[str] = []  # client keys' names
    max_bytes: Annotated[int, BeforeValidator(parse_size), Field(ge=0)] = 2**20  # per body
    keep: Annotated[int, Field(ge=1)] = 200  # the newest captures kept

    def wants(self, model: str, key: str | None) -> bool:
        """Captured when the model or the key's name is listed."""
        return model in self.models or (key is not None and key in self.keys)


class TracingConfig(_Section):
    """OpenTelemetry traces over OTLP/HTTP (docs/operations.md, "Tracing"). No endpoint here
    nor in OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: no tracing."""

    endpoint: Url | None = None  # the collector's base URL: http://collector:4318
    # Of the traces swapgate starts; a client's traceparent decides for its own (parent-based)
    sample_ratio: Annotated[float, Field(ge=0, le=1)] = 1.0
    # The trace backend's page of one trace, with {trace_id}: the dashboard links each request
    ui_url: str | None = None

    @field_validator("ui_url")
    @classmethod
    def _names_the_trace(cls, value: str | None) -> str | None:
        if value is not None and "{trace_id}" not in value:
            raise ValueError(
                "ui_url must contain {trace_id}, where the trace's id goes (for Jaeger: "
                "http://jaeger:16686/trace/{trace_id})"
            )
        return value


class MetricsConfig(_Section):
    enabled: bool = True
    path: Annotated[str, Field(pattern=r"^/")] = "/metrics"


class Settings(BaseSettings):
    """The whole configuration; every key but ``instances`` has a default."""

    model_config = SettingsConfigDict(
        env_prefix="SWAPGATE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    server: ServerConfig = ServerConfig()
    routing: RoutingConfig = RoutingConfig()
    keepalive: KeepaliveConfig = KeepaliveConfig()
    instances: Annotated[list[InstanceConfig], Field(min_length=1)]
    models: dict[str, ModelConfig] = {}
    relays: dict[str, RelayConfig] = {}
    preloads: list[PreloadConfig] = []
    metrics: MetricsConfig = MetricsConfig()
    cluster: ClusterConfig = ClusterConfig()
    auth: AuthConfig = AuthConfig()
    diagnosis: DiagnosisConfig = DiagnosisConfig()
    host_cache: HostCacheConfig = HostCacheConfig()
    activity: ActivityConfig = ActivityConfig()
    tracing: TracingConfig = TracingConfig()
    capture: CaptureConfig | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file arrives as init arguments; the environment must win over it.
        return (env_settings, init_settings)

    def model_settings(self, model: str) -> ModelConfig:
        return self.models.get(model) or _DEFAULT_MODEL

    def keepalive_for(self, model: str) -> KeepaliveConfig:
        """The model's keep-alive settings: the global ones, its ``keepalive`` over them, and
        its ``progress`` over that."""
        conf = self.model_settings(model)
        merged = self.keepalive
        if conf.keepalive is not None:
            merged = merged.model_copy(update=conf.keepalive.model_dump(exclude_none=True))
        if conf.progress is not None:
            streaming = "comment" if merged.streaming == "reasoning" else merged.streaming
            merged = merged.model_copy(update={"progress": conf.progress, "streaming": streaming})
        return merged


_DEFAULT_MODEL = ModelConfig()


def secret(env_name: str | None) -> str | None:
    """The value of the environment variable a ``*_env`` key names; empty counts as unset."""
    if not env_name:
        return None
    return os.environ.get(env_name) or None
