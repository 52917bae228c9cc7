"""Every ``swapgate_*`` metric (docs/metrics.md), in one ``CollectorRegistry`` owned by the app.

Gauges that mirror live state (warm models, instance health, in-flight, queues, swaps running)
are read from the registry at scrape time, so the request path never pays for them
(swapgate/live_gauges.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from swapgate.data.snapshot import Snapshot
from swapgate.live_gauges import DecayGauges, EngineRow, LiveGauges, MetricsRegistry
from swapgate.loop_metrics import LoopCounter, LoopHistogram

SWAP_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
UNKNOWN = "unknown"
# Where a fault of swapgate's own may arise (swapgate_internal_errors_total's ``where``)
INTERNAL_WHERE = ("request", "keepalive", "swap")
M = TypeVar("M", Counter, Gauge, Histogram, LoopCounter, LoopHistogram)


class Declared(Generic[M]):
    """One metric as ``Metrics`` declares it: its type, name, help, labels (space-separated)
    and a histogram's buckets. Read on a ``Metrics``, it is that app's metric."""

    def __init__(
        self, kind: type[M], name: str, doc: str, labels: str, *, buckets: Sequence[float] = ()
    ) -> None:
        self.kind: type[M] = kind
        self.name, self.doc, self.labels, self.buckets = name, doc, labels, buckets
        self._attribute = ""

    def __set_name__(self, owner: type, attribute: str) -> None:
        self._attribute = attribute

    @overload
    def __get__(self, metrics: None, owner: type) -> Declared[M]: ...
    @overload
    def __get__(self, metrics: Metrics, owner: type) -> M: ...
    def __get__(self, metrics: Metrics | None, owner: type) -> Declared[M] | M:
        if metrics is None:
            return self
        # Never reached: each Metrics holds its built metric as an attribute of its own, which
        # comes before a descriptor that defines only __get__ (here for the metric's type).
        raise AttributeError(self._attribute)

    def build(self, registry: CollectorRegistry) -> M:
        names, extra = self.labels.split(), {"buckets": self.buckets} if self.buckets else {}
        make: Callable[..., M] = self.kind  # buckets: a histogram's alone
        return make(self.name, self.doc, names, registry=registry, **extra)


class Metrics:
    """Every metric, each declared once below; the app owns one instance."""

    # swapgate_requests_total's labels are fixed (docs/metrics.md): requests by endpoint and by
    # pool are counted apart. Wakes of models asleep (vLLM's sleep mode) are swaps, and counted
    # apart too.
    requests = Declared(LoopCounter, "swapgate_requests", "Requests answered", "model route status")
    endpoint_requests = Declared(
        LoopCounter,
        "swapgate_endpoint_requests",
        "Requests answered, by endpoint (chat, responses, messages, ...)",
        "endpoint status",
    )
    pool_requests = Declared(
        LoopCounter,
        "swapgate_pool_requests",
        "Requests answered, by the pool they went to",
        "model pool status",
    )
    pool_wait = Declared(
        LoopHistogram,
        "swapgate_pool_wait_seconds",
        "Time spent waiting for a swap or the queue, by pool",
        "model pool",
        buckets=Histogram.DEFAULT_BUCKETS,
    )
    request_duration = Declared(
        LoopHistogram,
        "swapgate_request_duration_seconds",
        "Time from a request's arrival to its last byte",
        "model route",
        buckets=LATENCY_BUCKETS,
    )
    ttfb = Declared(
        LoopHistogram,
        "swapgate_time_to_first_byte_seconds",
        "Time from a request's arrival to the upstream's first byte (keep-alives excluded)",
        "model route",
        buckets=LATENCY_BUCKETS,
    )
    wait = Declared(
        LoopHistogram,
        "swapgate_wait_seconds",
        "Time a request waited for a swap or the queue",
        "model",
        buckets=LATENCY_BUCKETS,
    )
    swap_duration = Declared(
        Histogram,
        "swapgate_swap_duration_seconds",
        "Time from a swap's start to the model being ready, by where its weights were read from"
        " (cached: the page cache; cold: disk; unknown)",
        "instance model result weights",
        buckets=SWAP_BUCKETS,
    )
    wake_duration = Declared(
        Histogram,
        "swapgate_wake_duration_seconds",
        "Wakes of a model asleep, from the swap's start to the model being ready",
        "instance model result",
        buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
    )
    swaps = Declared(Counter, "swapgate_swaps", "Swaps finished", "instance model result")
    placements = Declared(
        LoopCounter,
        "swapgate_placements",
        "Requests by how their model was found: warm, after a swap, queued, or relayed",
        "model placement",
    )
    placement_wait = Declared(
        LoopHistogram,
        "swapgate_placement_wait_seconds",
        "Time each request waited for its model, by how it was found (warm: 0)",
        "model placement",
        buckets=LATENCY_BUCKETS,
    )
    swaps_avoided = Declared(
        Counter,
        "swapgate_swaps_avoided",
        "Requests served after a swap another request started: swaps grouping saved",
        "model",
    )
    thrash = Declared(
        Counter,
        "swapgate_thrash",
        "Swaps that load a model evicted from the same instance within THRASH_WINDOW of its"
        " swap time",
        "instance model",
    )
    keepalives = Declared(
        LoopCounter, "swapgate_keepalives_sent", "Keep-alive writes", "model kind"
    )
    fallbacks = Declared(
        Counter, "swapgate_fallbacks", "Requests sent to a relay", "model relay reason"
    )
    model_fallbacks = Declared(
        Counter,
        "swapgate_model_fallbacks",
        "Requests answered by another model of the gateway (models.M.fallbacks), by why",
        "model to reason",
    )
    key_requests = Declared(
        LoopCounter,
        "swapgate_key_requests",
        "Requests answered, by the client key's configured name",
        "key status",
    )
    tokens = Declared(
        LoopCounter,
        "swapgate_tokens",
        "Tokens the engines reported in their answers' usage, by the client key's name (empty:"
        " no key) and kind (prompt or completion)",
        "key model kind",
    )
    preload_runs = Declared(Counter, "swapgate_preload_runs", "Preload job runs", "job result")
    upstream_errors = Declared(
        Counter, "swapgate_upstream_errors", "Failed upstream calls", "instance kind"
    )
    # A fault of swapgate's own (a bug): the request still gets a shaped answer, the log the
    # traceback; where: request (the endpoint), keepalive (a progress line), swap (a load's task)
    internal_errors = Declared(
        Counter, "swapgate_internal_errors", "Faults of swapgate's own, by where", "where"
    )
    trace_spans_dropped = Declared(
        Counter,
        "swapgate_trace_spans_dropped",
        "Trace spans dropped: the export queue was full, or the collector refused them",
        "",
    )
    process_exits = Declared(
        Counter,
        "swapgate_process_exits",
        "Model processes that exited by themselves",
        "instance model",
    )
    process_rss = Declared(
        Gauge,
        "swapgate_process_rss_bytes",
        "Resident size of a model's process group",
        "instance model",
    )
    probe_ttft = Declared(
        Histogram,
        "swapgate_probe_ttft_seconds",
        "Time to first token of the decay probe, by target: instance/NAME or relay/NAME",
        "target",
        buckets=LATENCY_BUCKETS,
    )
    probes = Declared(
        Counter,
        "swapgate_probe_requests",
        "Decay probe requests (counted here only, not in swapgate_requests_total)",
        "target result",
    )
    process_recycles = Declared(
        Counter,
        "swapgate_process_recycles",
        "Model processes restarted above their recycle_rss",
        "instance model",
    )
    unloads = Declared(
        Counter,
        "swapgate_unloads",
        "Copies unloaded for sitting idle: their model's ttl, or the keep_alive a request asked",
        "instance model reason",
    )
    affinity = Declared(
        Counter,
        "swapgate_affinity",
        "Requests placed among two or more warm copies by prefix affinity: hit (the copy that"
        " served its conversation last), miss (none known, or not open), overflow (too busy)",
        "result",
    )
    kv_saves = Declared(
        Counter,
        "swapgate_kv_saves",
        "Slots saved before their model was unloaded (kv_keep)",
        "instance model result",
    )
    kv_restores = Declared(
        Counter,
        "swapgate_kv_restores",
        "Saved conversations restored into a slot when a turn came back (kv_keep)",
        "instance model result",
    )
    kv_saved_bytes = Declared(
        Gauge,
        "swapgate_kv_saved_bytes",
        "Bytes of saved conversations kept on disk for an instance (kv_keep)",
        "instance",
    )
    weights_resident = Declared(
        Gauge,
        "swapgate_weights_resident_bytes",
        "Bytes of a model's weight files in the host's page cache",
        "model",
    )
    host_cache_bytes = Declared(
        Gauge,
        "swapgate_host_cache_bytes",
        "Bytes of weight files the host cache brought into the page cache and holds",
        "",
    )

    def __init__(self) -> None:
        self.registry = MetricsRegistry()
        built: dict[str, Any] = {
            name: declared.build(self.registry)
            for name, declared in vars(Metrics).items()
            if isinstance(declared, Declared)
        }
        self._cluster_up: Gauge | None = None
        # Each metric an attribute of its own: read on the request path without a descriptor
        # call (``Declared`` defines only __get__, so these take precedence).
        vars(self).update(built)
        for where in INTERNAL_WHERE:  # at 0 from the start, so that an alert has a series to watch
            self.internal_errors.labels(where)

    def request_done(
        self, model: str, route: str, status: int, elapsed: float, waited: float
    ) -> None:
        """Count one answered request; called once per request on the hot path."""
        self.requests.labels(model, route, str(status)).inc()
        self.request_duration.labels(model, route).observe(elapsed)
        if waited:
            self.wait.labels(model).observe(waited)

    def placed(self, model: str, placement: str, waited: float) -> None:
        """How one request found its model; on the hot path, like ``request_done``."""
        self.placements.labels(model, placement).inc()
        self.placement_wait.labels(model, placement).observe(waited)

    def cluster_up(self) -> Gauge:
        """``swapgate_cluster_up``: exported only by a replica configured to share state."""
        if self._cluster_up is None:
            self._cluster_up = Gauge(
                "swapgate_cluster_up",
                "1 while this replica shares state through Redis",
                registry=self.registry,
            )
        return self._cluster_up

    def pool_done(self, model: str, pool: str, status: int, waited: float) -> None:
        self.pool_requests.labels(model, pool, str(status)).inc()
        if waited:
            self.pool_wait.labels(model, pool).observe(waited)

    def key_done(self, key: str, status: int) -> None:
        self.key_requests.labels(key, str(status)).inc()

    def tokens_spent(self, key: str | None, model: str, prompt: int, completion: int) -> None:
        if prompt:
            self.tokens.labels(key or "", model, "prompt").inc(prompt)
        if completion:
            self.tokens.labels(key or "", model, "completion").inc(completion)

    def endpoint_done(self, endpoint: str, status: int) -> None:
        self.endpoint_requests.labels(endpoint, str(status)).inc()

    def first_byte(self, model: str, route: str, seconds: float) -> None:
        self.ttfb.labels(model, route).observe(seconds)

    def watch(
        self,
        snapshot: Callable[[], Snapshot],
        queue_depths: Callable[[], dict[str, int]],
        failing: Callable[[], dict[str, float]] = dict,
    ) -> None:
        """Export the live-state gauges at every scrape: the warm state of ``snapshot()``, the
        queues of ``queue_depths()``, the models ``failing()``: the registry's
        (swapgate/control/, which counts with these metrics and so is not imported here)."""
        self.registry.written.append(LiveGauges(snapshot, queue_depths, failing))

    def exposition(self) -> bytes:
        """What ``/metrics`` serves: every metric in Prometheus's text format, the same as
        ``generate_latest(self.registry)`` but faster (swapgate/live_gauges.py)."""
        return self.registry.exposition()

    def watch_progress(self, ratios: Callable[[], dict[tuple[str, str], float]]) -> None:
        """Export how far each running load has got at every scrape
        (swapgate/control/swaps/load_progress.py)."""
        self.registry.register(_ProgressCollector(ratios))

    def watch_memory(self, rows: Callable[[], list[MemoryRow]]) -> None:
        """Export each model's measured memory beside its declared size at every scrape, for
        the models measured alone (swapgate/control/state/polls.py): a few series, never
        one per instance × model served."""
        self.registry.register(_MemoryCollector(rows))

    def watch_decay(self, rows: Callable[[], list[EngineRow]], states: Sequence[str]) -> None:
        """Export each warm engine's decay figures at every scrape (swapgate/control/loops/decay.py,
        which counts with these metrics and so is not imported here)."""
        self.registry.written.append(DecayGauges(rows, states))


# One measured model at a scrape: instance, model, measured bytes, declared bytes (None: unsized)
MemoryRow = tuple[str, str, int, int | None]


class _MemoryCollector(Collector):
    def __init__(self, rows: Callable[[], list[MemoryRow]]) -> None:
        self._rows = rows

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        memory = GaugeMetricFamily(
            "swapgate_model_memory_bytes",
            "What a model takes on an instance: measured after its load, and declared (or"
            " computed) by the config; for the models measured",
            labels=["instance", "model", "source"],
        )
        for instance, model, measured, declared in self._rows():
            memory.add_metric([instance, model, "measured"], measured)
            if declared is not None:
                memory.add_metric([instance, model, "declared"], declared)
        yield memory


class _ProgressCollector(Collector):
    def __init__(self, ratios: Callable[[], dict[tuple[str, str], float]]) -> None:
        self._ratios = ratios

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        ratio = GaugeMetricFamily(
            "swapgate_load_progress_ratio",
            "How far each running load has got, 0 to 1: its weights read, else its time share",
            labels=["instance", "model"],
        )
        for (instance, model), value in self._ratios().items():
            ratio.add_metric([instance, model], value)
        yield ratio
