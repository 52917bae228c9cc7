"""Every metric of docs/metrics.md with exactly its name, type, labels (and swap buckets)."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from swapgate.config.catalog import Catalog
from swapgate.config.loading import parse_config
from swapgate.control.state.registry import Registry
from swapgate.data.snapshot import Snapshot
from swapgate.data.warm import InstanceReport, WarmState
from swapgate.metrics import SWAP_BUCKETS, Metrics

SPEC = {
    "swapgate_requests": ("counter", {"model", "route", "status"}),
    "swapgate_request_duration_seconds": ("histogram", {"model", "route"}),
    "swapgate_time_to_first_byte_seconds": ("histogram", {"model", "route"}),
    "swapgate_wait_seconds": ("histogram", {"model"}),
    "swapgate_swap_duration_seconds": ("histogram", {"instance", "model", "result", "weights"}),
    "swapgate_swaps": ("counter", {"instance", "model", "result"}),
    "swapgate_swaps_in_progress": ("gauge", {"instance"}),
    "swapgate_model_warm": ("gauge", {"instance", "model"}),
    "swapgate_instance_up": ("gauge", {"instance"}),
    "swapgate_inflight_requests": ("gauge", {"instance"}),
    "swapgate_queue_depth": ("gauge", {"model"}),
    "swapgate_keepalives_sent": ("counter", {"model", "kind"}),
    "swapgate_fallbacks": ("counter", {"model", "relay", "reason"}),
    "swapgate_preload_runs": ("counter", {"job", "result"}),
    "swapgate_upstream_errors": ("counter", {"instance", "kind"}),
    "swapgate_internal_errors": ("counter", {"where"}),
}
# Beyond docs/metrics.md (its metrics keep their labels): what dashboards and alerts may also name.
EXTENDED = {
    "swapgate_placements": ("counter", {"model", "placement"}),
    "swapgate_thrash": ("counter", {"instance", "model"}),
    "swapgate_placement_wait_seconds": ("histogram", {"model", "placement", "le"}),
    "swapgate_swaps_avoided": ("counter", {"model"}),
    "swapgate_engine_diagnosis": ("gauge", {"instance", "model", "state"}),
    "swapgate_ttft_drift_ratio": ("gauge", {"instance", "model"}),
    "swapgate_process_rss_slope_bytes_per_hour": ("gauge", {"instance", "model"}),
    "swapgate_model_failing": ("gauge", {"model"}),
}


def exposed() -> str:
    settings = parse_config({"instances": [{"name": "gpu-a", "url": "http://x", "models": ["a"]}]})
    registry = Registry(settings.instances, Catalog(settings))
    registry.polls.apply_report("gpu-a", InstanceReport({"a": WarmState.WARM}, None), 0)
    registry.queues.enter("a", 0.0)
    metrics = Metrics()
    for instance in ("gpu-a", "gpu-b"):  # a model broken on two instances: failing
        registry.failing.failed("broken", instance, "exit status 1", "model")
    metrics.watch(registry.snapshot, registry.queues.depths, registry.failing.gauge)
    labels = {
        "requests": ("a", "instance/gpu-a", "200"),
        "request_duration": ("a", "instance/gpu-a"),
        "ttfb": ("a", "instance/gpu-a"),
        "wait": ("a",),
        "swap_duration": ("gpu-a", "a", "ok", "cold"),
        "swaps": ("gpu-a", "a", "ok"),
        "keepalives": ("a", "comment"),
        "fallbacks": ("a", "cloud", "swap"),
        "preload_runs": ("morning", "ok"),
        "upstream_errors": ("gpu-a", "connect"),
        "internal_errors": ("request",),
    }
    for attribute, values in labels.items():
        metric = getattr(metrics, attribute).labels(*values)
        if hasattr(metric, "observe"):
            metric.observe(1.0)
        else:
            metric.inc()
    return generate_latest(metrics.registry).decode()


def test_every_spec_metric_has_its_type_and_labels() -> None:
    families = {f.name: f for f in text_string_to_metric_families(exposed())}
    for name, (kind, labels) in SPEC.items():
        assert name in families, name
        family = families[name]
        assert family.type == kind, name
        samples = [s for s in family.samples if not s.name.endswith(("_created", "_bucket"))]
        assert samples, name
        assert {key for s in samples for key in s.labels} == labels, name


def test_live_state_gauges_read_the_registry() -> None:
    text = exposed()
    assert 'swapgate_model_warm{instance="gpu-a",model="a"} 1.0' in text
    assert 'swapgate_instance_up{instance="gpu-a"} 1.0' in text
    assert 'swapgate_queue_depth{model="a"} 1.0' in text
    assert 'swapgate_model_failing{model="broken"} 1.0' in text


def test_swap_buckets_are_the_specs() -> None:
    assert SWAP_BUCKETS == (0.5, 1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600)
    text = exposed()
    bounds = [
        line.split('le="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("swapgate_swap_duration_seconds_bucket")
    ]
    assert bounds == [str(float(b)) for b in SWAP_BUCKETS] + ["+Inf"]


def test_each_app_has_its_own_registry() -> None:
    one, two = Metrics(), Metrics()
    one.swaps.labels("gpu-a", "a", "ok").inc()
    assert (
        two.registry.get_sample_value(
            "swapgate_swaps_total", {"instance": "gpu-a", "model": "a", "result": "ok"}
        )
        is None
    )


def test_the_extended_metrics_dashboards_name_exist_with_their_labels() -> None:
    metrics = Metrics()
    metrics.placements.labels("a", "warm").inc()
    metrics.thrash.labels("gpu-a", "a").inc()
    metrics.placement_wait.labels("a", "swap").observe(1.0)
    metrics.swaps_avoided.labels("a").inc()
    metrics.watch_decay(lambda: [("gpu-a", "a", 1.1, 5.0e6, "healthy")], ["healthy"])
    metrics.watch(lambda: Snapshot(0.0, ()), dict, lambda: {"broken": 1.0})
    families = {f.name: f for f in metrics.registry.collect()}
    for name, (kind, labels) in EXTENDED.items():
        family = families[name]
        assert family.type == kind
        assert {k for s in family.samples for k in s.labels} == labels


def test_the_decay_and_key_metrics_have_their_names_and_labels() -> None:
    from swapgate.policy.diagnosis import STATES

    metrics = Metrics()
    rows = [("gpu-a", "a", 2.5, 3.0e9, "kv-growth"), ("gpu-b", "a", None, None, "healthy")]
    metrics.watch_decay(lambda: rows, STATES)
    metrics.probe_ttft.labels("relay/cloud").observe(0.035)
    metrics.probes.labels("relay/cloud", "ok").inc()
    metrics.key_done("chat-ui", 429)
    text = generate_latest(metrics.registry).decode()
    expected = [
        'swapgate_ttft_drift_ratio{instance="gpu-a",model="a"} 2.5',
        'swapgate_process_rss_slope_bytes_per_hour{instance="gpu-a",model="a"} 3e+09',
        'swapgate_engine_diagnosis{instance="gpu-a",model="a",state="kv-growth"} 1.0',
        'swapgate_engine_diagnosis{instance="gpu-a",model="a",state="healthy"} 0.0',
        'swapgate_engine_diagnosis{instance="gpu-b",model="a",state="healthy"} 1.0',
        'swapgate_probe_ttft_seconds_count{target="relay/cloud"} 1.0',
        'swapgate_probe_requests_total{result="ok",target="relay/cloud"} 1.0',
        'swapgate_key_requests_total{key="chat-ui",status="429"} 1.0',
    ]
    for line in expected:
        assert line in text, line
    assert 'swapgate_ttft_drift_ratio{instance="gpu-b"' not in text, "no figure yet: no sample"


def test_internal_errors_are_exposed_at_zero_for_every_place_they_may_arise() -> None:
    text = generate_latest(Metrics().registry).decode()
    for where in ("request", "keepalive", "swap"):
        assert f'swapgate_internal_errors_total{{where="{where}"}} 0.0' in text
