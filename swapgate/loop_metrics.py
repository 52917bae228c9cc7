"""Counters and histograms for what every request counts, exposed as prometheus_client's own.

prometheus_client's ``Counter.inc`` and ``Histogram.observe`` take a lock per value, check that
the metric may be observed, and find a histogram's bucket with a Python loop: ~1.4 µs an
observation, eleven counts a request. These count on the event loop's thread alone, as the
request path does (and ``/metrics`` reads on that thread too): a float added to, a bucket found
by ``bisect``. What a scrape shows is the same families, samples and ``_created`` series
(docs/metrics.md).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

# How prometheus_client writes a bucket's bound as its le label (1.0, 0.005, 1e+06, +Inf).
_le: Callable[[float], str] = floatToGoString
Child = TypeVar("Child", "CounterChild", "HistogramChild")


class CounterChild:
    """One label set's count."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.value += amount


class HistogramChild:
    """One label set's observations: a count per bucket (the last: beyond every bound)."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1  # a bound is its bucket's own
        self.sum += amount


class _Labelled(Collector, Generic[Child]):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        registry: CollectorRegistry,
    ) -> None:
        self._name, self._doc, self._labelnames = name, documentation, tuple(labelnames)
        self._children: dict[tuple[str, ...], Child] = {}
        registry.register(self)

    def labels(self, *values: str) -> Child:
        """The child for one value per label, in the labels' order."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name} has the labels {self._labelnames}, not {values}")
            child = self._children[values] = self._new_child()
        return child

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def _new_child(self) -> Child:
        raise NotImplementedError

    def _family(self) -> Metric:
        raise NotImplementedError


class LoopCounter(_Labelled[CounterChild]):
    """A labelled counter: ``NAME_total`` and ``NAME_created`` per label set."""

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        created = prometheus_metrics._use_created
        for values, child in list(self._children.items()):
            family.add_metric(values, child.value, created=child.created if created else None)
        yield family

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self._name, self._doc, labels=self._labelnames)


class LoopHistogram(_Labelled[HistogramChild]):
    """A labelled histogram with fixed non-negative ``buckets``: ``NAME_bucket`` (cumulative,
    ``le`` as prometheus_client writes it), ``NAME_count``, ``NAME_sum``, ``NAME_created``."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        registry: CollectorRegistry,
        buckets: Sequence[float],
    ) -> None:
        self._bounds = tuple(float(bound) for bound in buckets if bound != float("inf"))
        if list(self._bounds) != sorted(self._bounds) or self._bounds[0] < 0:
            raise ValueError(f"{name}: buckets must be non-negative and in increasing order")
        self._le = [_le(bound) for bound in self._bounds] + ["+Inf"]
        super().__init__(name, documentation, labelnames, registry=registry)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        created = prometheus_metrics._use_created
        for values, child in list(self._children.items()):
            counts, total, buckets = child.counts[:], 0, []
            for le, count in zip(self._le, counts, strict=True):
                total += count
                buckets.append((le, float(total)))
            family.add_metric(values, buckets, child.sum)
            if created:
                labels = dict(zip(self._labelnames, values, strict=True))
                family.samples.append(Sample(self._name + "_created", labels, child.created))
        yield family

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self._bounds)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)
