"""The gauges read from live state at every scrape, so that the request path never pays for
them: each instance's models warm or not, up, in-flight and swapping, each model's queue
(``LiveGauges``), each warm engine's decay figures (``DecayGauges``); and the registry that
writes them.

``swapgate_model_warm`` holds a series per instance × model it serves (16,384 at 256 instances
× 64 models, 870 kB of text), ``swapgate_engine_diagnosis`` four per warm engine: through
prometheus_client's samples and formatting (about 7 µs a series) they took most of a scrape of
120 to 250 ms.
``MetricsRegistry.exposition`` writes them as text made here instead, each instance's warm lines
kept from one scrape to the next while its models are the same (docs/architecture.md, "A fleet
of any size"); ``collect()`` reads them as any other metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from swapgate.data.snapshot import InstanceView, Snapshot
from swapgate.data.warm import WarmState

# How prometheus_client writes a sample's value (1.0, 3.0, +Inf), typed
_number: Callable[[float], str] = floatToGoString
Family = tuple[str, str, tuple[str, ...]]  # a gauge's name, help and labels (in sorted order)
Sample = tuple[tuple[str, ...], float]  # its labels' values, in that order, and its value
# One engine's decay figures at a scrape: instance, model, TTFT drift (None: too few samples),
# memory slope in bytes per hour (None: not a process, or too short), its diagnosis.
EngineRow = tuple[str, str, float | None, float | None, str]


class Written(Protocol):
    """Gauges read by ``collect()`` as prometheus_client's families, or as their text."""

    def collect(self) -> Iterator[Metric]: ...
    def text(self) -> str: ...


class MetricsRegistry(CollectorRegistry):
    """Every metric, the ``written`` gauges last: read by ``collect()`` as any other, written
    by ``exposition()`` as text of their own."""

    def __init__(self) -> None:
        super().__init__(auto_describe=True)
        self.written: list[Written] = []

    def collect(self) -> Iterable[Metric]:
        yield from super().collect()
        for gauges in self.written:
            yield from gauges.collect()

    def exposition(self) -> bytes:
        """The same text as ``generate_latest(self)``, the written gauges last."""
        text = "".join(gauges.text() for gauges in self.written)
        return generate_latest(_Registered(self)) + text.encode()


class _Registered(Collector):
    """The registry's own collectors alone: ``MetricsRegistry`` without its written gauges."""

    def __init__(self, registry: MetricsRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        return CollectorRegistry.collect(self._registry)


class LiveGauges(Collector):
    """The live-state gauges, read from the registry's snapshot at every scrape."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        queue_depths: Callable[[], dict[str, int]],
        failing: Callable[[], dict[str, float]] = dict,
    ) -> None:
        self._snapshot, self._queue_depths, self._failing = snapshot, queue_depths, failing
        # Per instance, its swapgate_model_warm lines and what they were written from
        self._warm: dict[str, tuple[tuple[object, ...], str]] = {}

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        warm: list[Sample] = [
            ((inst.name, model), float(inst.state_of(model) is WarmState.WARM))
            for inst in snap.instances
            for model in _models(inst)
        ]
        for family, samples in zip(_LIVE, [warm, *self._others(snap)], strict=True):
            yield gauge_family(family, samples)

    def text(self) -> str:
        """The same as ``collect``, as generate_latest writes it; an instance's warm lines
        are written again only when what they say changed (most scrapes: none)."""
        snap = self._snapshot()
        written: dict[str, tuple[tuple[object, ...], str]] = {}
        warm = "".join(self._warm_lines(inst, written) for inst in snap.instances)
        self._warm = written  # instances gone since the last scrape are forgotten
        others = zip(_LIVE[1:], self._others(snap), strict=True)
        return _header(_LIVE[0]) + warm + "".join(family_text(f, s) for f, s in others)

    def _others(self, snap: Snapshot) -> list[list[Sample]]:
        """The samples of every family but the warm one, in ``_LIVE``'s order."""
        each: list[list[Sample]] = [
            [((i.name,), value(i)) for i in snap.instances] for value in _PER_INSTANCE
        ]
        queue: list[Sample] = [((m,), float(d)) for m, d in sorted(self._queue_depths().items())]
        failing: list[Sample] = [((m,), v) for m, v in self._failing().items()]
        return [*each, queue, failing]

    def _warm_lines(
        self, inst: InstanceView, written: dict[str, tuple[tuple[object, ...], str]]
    ) -> str:
        """``inst``'s swapgate_model_warm lines: those of the last scrape while the models it
        serves and has warm are the same."""
        warm = frozenset(m for m, v in inst.models.items() if v.state is WarmState.WARM)
        key = (inst.serves, inst.models.keys() - inst.serves, warm)
        kept = self._warm.get(inst.name)
        if kept is None or kept[0] != key:
            prefix = f'swapgate_model_warm{{instance="{_escape(inst.name)}",model="'
            lines = [
                f'{prefix}{_escape(m)}"}} {"1.0" if m in warm else "0.0"}\n' for m in _models(inst)
            ]
            kept = (key, "".join(lines))
        written[inst.name] = kept
        return kept[1]


class DecayGauges(Collector):
    """Each warm engine's decay figures and diagnosis (swapgate/control/loops/decay.py)."""

    def __init__(self, rows: Callable[[], list[EngineRow]], states: Sequence[str]) -> None:
        self._rows, self._states = rows, states

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        for family, samples in zip(_DECAY, self._samples(), strict=True):
            yield gauge_family(family, samples)

    def text(self) -> str:
        return "".join(family_text(f, s) for f, s in zip(_DECAY, self._samples(), strict=True))

    def _samples(self) -> tuple[list[Sample], list[Sample], list[Sample]]:
        drift: list[Sample] = []
        slope: list[Sample] = []
        diagnosis: list[Sample] = []
        for instance, model, ratio, rss_slope, state in self._rows():
            if ratio is not None:
                drift.append(((instance, model), ratio))
            if rss_slope is not None:
                slope.append(((instance, model), rss_slope))
            diagnosis += [((instance, model, s), float(s == state)) for s in self._states]
        return drift, slope, diagnosis


def gauge_family(family: Family, samples: Iterable[Sample]) -> GaugeMetricFamily:
    name, doc, labels = family
    gauge = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, value in samples:
        gauge.add_metric(list(values), value)
    return gauge


def family_text(family: Family, samples: Iterable[Sample]) -> str:
    """One gauge family as generate_latest writes it (its labels are in sorted order, as it
    writes them)."""
    name, _, labels = family
    lines = (f"{name}{{{_labels(labels, values)}}} {_number(value)}\n" for values, value in samples)
    return _header(family) + "".join(lines)


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    return ",".join(f'{name}="{_escape(value)}"' for name, value in zip(names, values, strict=True))


def _header(family: Family) -> str:
    name, doc, _ = family
    doc = doc.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} gauge\n"


def _models(inst: InstanceView) -> list[str]:
    """The models with a swapgate_model_warm series on ``inst``: those it serves or has had."""
    return sorted(inst.serves.union(inst.models))


def _escape(value: str) -> str:
    """A label's value as the text format writes it (prometheus_client's escaping)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


# The live-state gauges (docs/metrics.md), and each per-instance one's value
_LIVE: tuple[Family, ...] = (
    ("swapgate_model_warm", "1 if the model is warm on the instance", ("instance", "model")),
    ("swapgate_instance_up", "1 if the instance is up", ("instance",)),
    ("swapgate_inflight_requests", "Requests in flight to the instance", ("instance",)),
    ("swapgate_swaps_in_progress", "Swaps running on the instance", ("instance",)),
    ("swapgate_queue_depth", "Requests waiting for the model", ("model",)),
    ("swapgate_model_failing", "1 while the model's loads fail fleet-wide", ("model",)),
)
_PER_INSTANCE: tuple[Callable[[InstanceView], float], ...] = (
    lambda inst: float(inst.up),
    lambda inst: float(inst.inflight),
    lambda inst: float(inst.swapping is not None),
)
_DECAY: tuple[Family, ...] = (
    (
        "swapgate_ttft_drift_ratio",
        "Rolling TTFT p95 over its baseline after the model's load, same prompt band",
        ("instance", "model"),
    ),
    (
        "swapgate_process_rss_slope_bytes_per_hour",
        "How fast a model's process group grows, over the diagnosis window",
        ("instance", "model"),
    ),
    (
        "swapgate_engine_diagnosis",
        "1 for the engine's current diagnosis: healthy, kv-growth, placement-or-preemption, global",
        ("instance", "model", "state"),
    ),
)
