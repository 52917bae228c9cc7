"""The request path's counters and histograms (swapgate/loop_metrics.py) expose exactly what
prometheus_client's own would, for the same counts: a scrape cannot tell them apart."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from swapgate.loop_metrics import LoopCounter, LoopHistogram
from swapgate.metrics import LATENCY_BUCKETS

CREATED = re.compile(rb"^(\w+_created\{[^}]*\}) \S+$", re.M)


def scraped(registry: CollectorRegistry) -> bytes:
    """The exposition, each ``_created`` timestamp blanked (the two were made apart)."""
    return CREATED.sub(rb"\1 T", generate_latest(registry))


observations = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.one_of(
            st.sampled_from([0.0, *LATENCY_BUCKETS, 301.0]),  # on a bound, and past the last
            st.floats(min_value=0, max_value=400, allow_nan=False),
        ),
    ),
    max_size=30,
)


@given(observations)
def test_a_histogram_scrapes_as_prometheus_clients_own(seen: list[tuple[str, float]]) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    for registry, kind in ((theirs, Histogram), (ours, LoopHistogram)):
        metric = kind("t_seconds", "Time", ["model"], registry=registry, buckets=LATENCY_BUCKETS)
        for model, value in seen:
            metric.labels(model).observe(value)
    assert scraped(ours) == scraped(theirs)


@given(st.lists(st.tuples(st.sampled_from(["200", "503"]), st.integers(0, 9)), max_size=20))
def test_a_counter_scrapes_as_prometheus_clients_own(counts: list[tuple[str, int]]) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    for registry, kind in ((theirs, Counter), (ours, LoopCounter)):
        metric = kind("t_requests", "Requests", ["model", "status"], registry=registry)
        for status, amount in counts:
            metric.labels("m", status).inc(amount)
    assert scraped(ours) == scraped(theirs)


def test_the_default_buckets_and_their_infinity_are_prometheus_clients() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    Histogram("w", "Wait", ["pool"], registry=theirs).labels("p").observe(20.0)
    LoopHistogram("w", "Wait", ["pool"], registry=ours, buckets=Histogram.DEFAULT_BUCKETS).labels(
        "p"
    ).observe(20.0)
    assert scraped(ours) == scraped(theirs)
    assert b'w_bucket{le="+Inf",pool="p"} 1.0' in scraped(ours)


def test_what_prometheus_client_refuses_is_refused() -> None:
    registry = CollectorRegistry()
    counter = LoopCounter("r", "Requests", ["model", "status"], registry=registry)
    with pytest.raises(ValueError, match="non-negative"):
        counter.labels("m", "200").inc(-1)
    with pytest.raises(ValueError, match="labels"):
        counter.labels("m")
    with pytest.raises(ValueError, match="Duplicated"):
        LoopCounter("r", "Again", ["model"], registry=registry)
    with pytest.raises(ValueError, match="increasing"):
        LoopHistogram("h", "Time", [], registry=registry, buckets=(1, 0.5))
