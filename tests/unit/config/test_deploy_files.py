"""The operator's files in deploy/ parse, fit together, and name only metrics swapgate exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from swapgate.config.loading import parse_config
from tests.unit.test_metrics import EXTENDED
from tests.unit.test_metrics import SPEC as SPEC_METRICS

SPEC = {**SPEC_METRICS, **EXTENDED}

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
METRIC = re.compile(r"\bswapgate_[a-z_]+")
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def _base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def _assert_known(expr: str) -> list[str]:
    names = METRIC.findall(expr)
    unknown = [n for n in names if _base(n) not in SPEC]
    assert not unknown, f"{unknown} in {expr}"
    for name in names:
        kind = SPEC[_base(name)][0]
        if name.endswith(("_bucket", "_sum", "_count")):
            assert kind == "histogram", name
        if name.endswith("_total"):
            assert kind == "counter", name
    return names


def test_every_dashboard_query_names_an_existing_metric() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "swapgate-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert exprs
    named = {_base(n) for expr in exprs for n in _assert_known(expr)}
    assert "swapgate_swap_duration_seconds" in named
    assert "swapgate_model_warm" in named


def test_every_alert_names_an_existing_metric() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    alerts = {r["alert"]: r["expr"] for group in rules["groups"] for r in group["rules"]}
    for expr in alerts.values():
        _assert_known(expr)
    covered = " ".join(alerts.values())
    needed = [
        "swapgate_swap_duration_seconds_bucket",
        "swapgate_swaps_total",
        "swapgate_instance_up",
        "swapgate_fallbacks_total",
        "swapgate_queue_depth",
    ]
    assert all(name in covered for name in needed)


def test_the_scrape_config_keeps_swapgates_own_labels() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["honor_labels"] is True
    assert job["metrics_path"] == "/metrics"
    assert "alerts.yml" in config["rule_files"]


def _yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yml", ".yaml"))


def test_every_yaml_file_in_deploy_parses() -> None:
    files = _yaml_files()
    assert len(files) >= 10
    for path in files:
        documents = list(yaml.safe_load_all(path.read_text()))
        assert documents, path
        assert all(isinstance(doc, dict) for doc in documents), path


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())
    return loaded


def test_compose_mounts_files_that_exist_and_wires_its_ports() -> None:
    compose = _compose()
    services = compose["services"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = (DEPLOY / "compose" / volume.split(":")[0]).resolve()
            assert source.exists(), f"{name} mounts {source}"
        assert service["restart"] == "unless-stopped", name
        assert "start_period" in service["healthcheck"], name
    gateway = parse_config(yaml.safe_load((DEPLOY / "compose" / "swapgate.yaml").read_text()))
    assert services["swapgate"]["expose"] == [str(gateway.server.port)]
    for inst in gateway.instances:
        host, port = inst.url.removeprefix("http://").split(":")
        assert host in services
        assert services[host]["expose"] == [port]
    nginx = (DEPLOY / "compose" / "nginx.conf").read_text()
    assert f"server swapgate:{gateway.server.port};" in nginx
    assert "proxy_buffering off;" in nginx
    timeout = float(nginx.split("proxy_read_timeout ")[1].split("s;")[0])
    assert gateway.keepalive.interval < timeout, "keep-alives must beat nginx's read timeout"
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (replicas,) = scrape["scrape_configs"][0]["dns_sd_configs"]
    assert (replicas["names"], replicas["port"]) == (["swapgate"], gateway.server.port)
    swapgate = services["swapgate"]
    assert swapgate["deploy"]["replicas"] == 2
    redis_url = swapgate["environment"][gateway.cluster.redis_url_env]
    assert redis_url.startswith("redis://redis:")
    assert services["redis"]["expose"] == [redis_url.split(":")[2].split("/")[0]]
    assert swapgate["depends_on"]["redis"] == {"condition": "service_healthy"}


def test_grafana_provisioning_points_at_the_dashboard_and_prometheus() -> None:
    grafana = _compose()["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    assert mounts["../grafana/swapgate-dashboard.json"].startswith("/var/lib/grafana/dashboards")
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/swapgate.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    source = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    assert source["datasources"][0]["url"] == "http://prometheus:9090"


def _k8s(kind: str, name: str = "swapgate") -> dict[str, Any]:
    for path in (DEPLOY / "k8s").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                found: dict[str, Any] = doc
                return found
    raise AssertionError(f"no {kind} {name} in deploy/k8s")


def test_kubernetes_manifests_fit_together() -> None:
    config_map = _k8s("ConfigMap", "swapgate-config")
    settings = parse_config(yaml.safe_load(config_map["data"]["config.yaml"]))
    deployment = _k8s("Deployment")
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    port = container["ports"][0]["containerPort"]
    assert port == settings.server.port
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert deployment["spec"]["replicas"] == 2
    env = {e["name"]: e for e in container["env"]}
    redis_url = env[settings.cluster.redis_url_env]["value"]
    redis_host, redis_port = redis_url.removeprefix("redis://").split("/")[0].split(":")
    redis_service = _k8s("Service", redis_host)
    assert redis_service["metadata"]["name"] == redis_host
    assert redis_service["spec"]["ports"][0]["port"] == int(redis_port)
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == settings.metrics.path
    mount = container["volumeMounts"][0]
    assert mount["mountPath"] == "/etc/swapgate"
    assert container["args"][-1] == "/etc/swapgate/config.yaml"
    secret = _k8s("Secret", "swapgate-secrets")["stringData"]
    needed = {settings.server.admin_token_env, settings.server.api_keys_env}
    needed |= {i.api_key_env for i in settings.instances if i.api_key_env}
    assert needed <= set(secret)
    service = _k8s("Service")
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_the_configmap_passes_check_config(tmp_path: Path) -> None:
    from swapgate.tools.cli import main

    path = tmp_path / "config.yaml"
    path.write_text(_k8s("ConfigMap", "swapgate-config")["data"]["config.yaml"])
    assert main(["check-config", str(path)]) == 0


def test_the_dockerfile_runs_non_root_with_a_health_check() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert dockerfile.count("FROM ") >= 2, "multi-stage"
    assert "USER swapgate" in dockerfile
    assert "HEALTHCHECK" in dockerfile
    assert "/healthz" in dockerfile
    assert "SWAPGATE_CONFIG=/etc/swapgate/config.yaml" in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)
