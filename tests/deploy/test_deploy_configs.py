"""Compose, Kubernetes, Prometheus, Alertmanager, Grafana provisioning, collector and service configs:
each validated by the real tool for its format, plus the cross-references between them."""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import DEPLOY, RULES, require_tool, run

COMPOSE = DEPLOY / "compose" / "compose.yaml"
K8S = DEPLOY / "k8s"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
ALERTMANAGER_CONFIG = DEPLOY / "alertmanager" / "alertmanager.yml"
K8S_MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _k8s_objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for p in K8S_MANIFESTS for d in _docs(p)}


def _alert_names() -> set[str]:
    rules = yaml.safe_load(RULES.read_text())
    return {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}


# --- Compose -----------------------------------------------------------------------------------


def test_compose_file_validates_against_the_compose_spec() -> None:
    result = run([require_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_has_the_whole_stack_and_every_mounted_file_exists() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert {"otel-collector", "stepwatch", "prometheus", "alertmanager", "grafana", "kafka"} <= set(services)
    assert services["otel-collector"]["image"].startswith("otel/opentelemetry-collector-contrib:")
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert "broker,controller" in services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]  # KRaft
    build = services["stepwatch"]["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"{name}: mounts missing {source}"
            else:
                assert source in compose["volumes"], f"{name}: undeclared named volume {source}"


def test_compose_wires_collector_prometheus_and_grafana_to_stepwatch() -> None:
    collector = yaml.safe_load((DEPLOY / "otelcol" / "compose-collector.yaml").read_text())
    assert collector["exporters"]["otlp/stepwatch"]["endpoint"] == "stepwatch:4317"
    _assert_pipelines_reference_defined_components(collector)
    prometheus = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    targets = {
        t for job in prometheus["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    }
    assert "stepwatch:9464" in targets
    # the score exemplars (trace ids) are kept only with exemplar storage on
    assert (
        "--enable-feature=exemplar-storage"
        in yaml.safe_load(COMPOSE.read_text())["services"]["prometheus"]["command"]
    )
    assert prometheus["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    datasource = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    )
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "stepwatch.yaml").read_text()
    )
    grafana_mounts = yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]["volumes"]
    assert f"../grafana/dashboards:{provider['providers'][0]['options']['path']}:ro" in grafana_mounts


# --- Prometheus / Alertmanager -------------------------------------------------------------------


def test_prometheus_config_passes_promtool_and_loads_the_rules() -> None:
    result = run([require_tool("promtool"), "check", "config", str(PROMETHEUS_CONFIG)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout
    assert "stepwatch.rules.yml" in result.stdout


def test_alertmanager_config_passes_amtool() -> None:
    result = run([require_tool("amtool"), "check-config", str(ALERTMANAGER_CONFIG)])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["alertname=StepwatchTrajectoryRegression", "severity=critical", "task_key=checkout"], "pager"),
        (["alertname=StepwatchDown", "severity=critical"], "pager"),
        (["alertname=StepwatchLateSpanSurge", "severity=warning"], "team"),
        (["alertname=Watchdog"], "team"),
    ],
)
def test_alertmanager_routes_by_severity(labels: list[str], receiver: str) -> None:
    result = run(
        [require_tool("amtool"), "config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}", *labels]
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receiver


def test_alertmanager_inhibitions_name_real_alerts() -> None:
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    known = _alert_names()
    for rule in config["inhibit_rules"]:
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            match = re.fullmatch(r'alertname(=|!=)"(\w+)"', matcher)
            if match:
                assert match.group(2) in known, matcher


# --- Kubernetes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("manifest", K8S_MANIFESTS, ids=[p.name for p in K8S_MANIFESTS])
def test_kubernetes_manifest_passes_kubernetes_validate_strict(manifest: Path) -> None:
    result = run([require_tool("kubernetes-validate"), "--strict", str(manifest)])
    assert result.returncode == 0, result.stdout + result.stderr
    kinds = {d["kind"] for d in _docs(manifest)}
    if "ServiceMonitor" in kinds:
        # kubernetes-validate has no schema for CRDs and only warns; see the next test.
        assert "Couldn't find schema for kind ServiceMonitor" in result.stdout
    else:
        assert "WARN" not in result.stdout and "ERROR" not in result.stdout, result.stdout
        assert result.stdout.count("passed for resource") == len(_docs(manifest))


def _unknown_keys(value: Any, annotation: Any, path: str) -> list[str]:
    """Keys of `value` the pydantic model for `annotation` does not define (strict CRD check)."""
    from pydantic import BaseModel

    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        found = [
            _unknown_keys(value, arg, path) for arg in typing.get_args(annotation) if arg is not type(None)
        ]
        return min(found, key=len) if found else []
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(annotation)
        return [k for i, v in enumerate(value) for k in _unknown_keys(v, item, f"{path}[{i}]")]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) and isinstance(value, dict):
        by_key = {(f.alias or name): f for name, f in annotation.model_fields.items()}
        out = []
        for key, sub in value.items():
            field = by_key.get(key)
            if field is None:
                out.append(f"{path}.{key}")
            else:
                out.extend(_unknown_keys(sub, field.annotation, f"{path}.{key}"))
        return out
    return []


def test_servicemonitor_validates_against_the_prometheus_operator_crd_schema() -> None:
    """Types via the prometheus-operator CRD's generated pydantic models (cloudcoil), unknown keys via
    a strict walk over the same models, as kubernetes-validate --strict does for built-in kinds."""
    try:
        from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor
    except ImportError:
        pytest.fail("install the test extra (cloudcoil-models-prometheus-operator)", pytrace=False)
    (monitor,) = _docs(K8S / "servicemonitor.yaml")
    ServiceMonitor.model_validate(monitor)
    assert _unknown_keys(monitor, ServiceMonitor, "") == []
    # The walk catches a misspelt key (pydantic alone would ignore it).
    broken = json.loads(json.dumps(monitor))
    broken["spec"]["endpoints"][0]["scrape_interval"] = "15s"
    assert _unknown_keys(broken, ServiceMonitor, "") == [".spec.endpoints[0].scrape_interval"]


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in K8S_MANIFESTS)
    assert kustomization["namespace"] == "stepwatch"
    # `kustomize edit set image stepwatch=...` (docs/operations.md) rewrites the image by this name
    (image,) = kustomization["images"]
    (container,) = _k8s_objects()[("StatefulSet", "stepwatch")]["spec"]["template"]["spec"]["containers"]
    assert container["image"].split(":")[0] == image["name"] == "stepwatch"
    assert "kustomize edit set image" in (DEPLOY.parent / "docs" / "operations.md").read_text()


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_statefulset_follows_kubernetes_best_practice() -> None:
    objects = _k8s_objects()
    sts = objects[("StatefulSet", "stepwatch")]
    headless = objects[("Service", sts["spec"]["serviceName"])]
    assert headless["spec"]["clusterIP"] == "None"
    pod = sts["spec"]["template"]
    assert _matches(sts["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    assert _matches(headless["spec"]["selector"], pod["metadata"]["labels"])
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["spec"]["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"otlp-grpc": 4317, "otlp-http": 4318, "metrics": 9464}
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/var/lib/stepwatch"
    pdb = objects[("PodDisruptionBudget", "stepwatch")]
    assert _matches(pdb["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])


def test_pods_get_no_service_link_variables() -> None:
    """Service links for stepwatch-metrics / stepwatch-gateway would put STEPWATCH_METRICS_PORT=tcp://...
    in Stepwatch's environment: off in every pod template (the parser also ignores them)."""
    templates = [
        doc["spec"]["template"]["spec"]
        for doc in _k8s_objects().values()
        if doc["kind"] in {"StatefulSet", "Deployment", "DaemonSet"}
    ]
    assert len(templates) == 2
    assert all(spec.get("enableServiceLinks") is False for spec in templates)


def test_the_statefulset_environment_is_valid_stepwatch_config(tmp_path: Path) -> None:
    from stepwatch.config import load_config

    (container,) = _k8s_objects()[("StatefulSet", "stepwatch")]["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    logging = load_config(environ=env).logging
    assert (logging.level, logging.format) == ("INFO", "json")


def test_servicemonitor_selects_the_metrics_service_port() -> None:
    objects = _k8s_objects()
    monitor = objects[("ServiceMonitor", "stepwatch")]
    metrics = objects[("Service", "stepwatch-metrics")]
    assert _matches(monitor["spec"]["selector"]["matchLabels"], metrics["metadata"]["labels"])
    assert not _matches(
        monitor["spec"]["selector"]["matchLabels"],
        objects[("Service", "stepwatch-headless")]["metadata"]["labels"],
    )
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in metrics["spec"]["ports"]}
    # The StepwatchDown alert matches the job prometheus-operator derives from the Service name.
    assert re.fullmatch("stepwatch.*", metrics["metadata"]["name"])


def _assert_pipelines_reference_defined_components(config: dict[str, Any]) -> None:
    for name, pipeline in config["service"]["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], f"pipeline {name}: {kind[:-1]} {component} is not defined"
    for extension in config["service"].get("extensions", []):
        assert extension in config["extensions"]


def test_collector_load_balances_traces_by_trace_id_and_sessions_by_session_id() -> None:
    """The shape of the shipped routing; tests/e2e/collector/test_loadbalancing_path.py runs it for real."""
    objects = _k8s_objects()
    relay = yaml.safe_load(objects[("ConfigMap", "otelcol-loadbalancing")]["data"]["relay.yaml"])
    _assert_pipelines_reference_defined_components(relay)
    exporters = relay["exporters"]
    by_trace, by_session = exporters["load_balancing/trace"], exporters["load_balancing/session"]
    assert by_trace["routing_key"] == "traceID"
    assert by_session["routing_key"] == "attributes"
    assert by_session["routing_attributes"] == ["session.id", "gen_ai.conversation.id"]
    namespace = yaml.safe_load((K8S / "kustomization.yaml").read_text())["namespace"]
    for exporter in (by_trace, by_session):
        assert exporter["resolver"]["dns"]["hostname"] == f"stepwatch-headless.{namespace}.svc.cluster.local"
        assert exporter["resolver"]["dns"]["port"] == "4317"
    pipelines = relay["service"]["pipelines"]
    routes = {tuple(p["exporters"]): p["processors"] for p in pipelines.values()}
    # Complementary filters: a span takes exactly one of the two pipelines.
    assert "filter/drop-session-spans" in routes[("load_balancing/trace",)]
    assert "filter/keep-session-spans" in routes[("load_balancing/session",)]
    dropped_by_trace = relay["processors"]["filter/drop-session-spans"]["traces"]["span"]
    dropped_by_session = relay["processors"]["filter/keep-session-spans"]["traces"]["span"]
    assert set(dropped_by_trace) == {
        f'{scope}attributes["{key}"] != nil'
        for scope in ("", "resource.")
        for key in ("session.id", "gen_ai.conversation.id")
    }
    assert dropped_by_session == [
        'attributes["session.id"] == nil and resource.attributes["session.id"] == nil and '
        'attributes["gen_ai.conversation.id"] == nil and resource.attributes["gen_ai.conversation.id"] == nil'
    ]
    gateway = objects[("Deployment", "otelcol-gateway")]
    volumes = gateway["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": "otelcol-loadbalancing"}} in volumes


# --- Stepwatch's own configuration ---------------------------------------------------------------


def test_the_configmap_is_generated_from_the_container_config() -> None:
    """deploy/k8s/configmap.yaml is deploy/config/*.yaml verbatim (comments included), by the
    generator: an edit to one without the other fails here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("configmap_generator", K8S / "generate_configmap.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert (K8S / "configmap.yaml").read_text() == generator.render(), "run deploy/k8s/generate_configmap.py"
    data = _k8s_objects()[("ConfigMap", "stepwatch-config")]["data"]
    assert data["config.yaml"] == (DEPLOY / "config" / "stepwatch.yaml").read_text()
    assert data["expectations.yaml"] == (DEPLOY / "config" / "expectations.yaml").read_text()


def test_container_config_and_expectations_validate_with_stepwatch(tmp_path: Path) -> None:
    from stepwatch.config import load_config
    from stepwatch.evaluator.expectations.store import parse_expectations

    objects = _k8s_objects()
    configmap = objects[("ConfigMap", "stepwatch-config")]["data"]
    for config_text, expectations_text in (
        (
            (DEPLOY / "config" / "stepwatch.yaml").read_text(),
            (DEPLOY / "config" / "expectations.yaml").read_text(),
        ),
        (configmap["config.yaml"], configmap["expectations.yaml"]),
    ):
        config = yaml.safe_load(config_text)
        assert config == yaml.safe_load((DEPLOY / "config" / "stepwatch.yaml").read_text())
        path = tmp_path / "config.yaml"
        path.write_text(config_text)
        loaded = load_config(path, environ={})
        assert loaded.receivers.grpc.endpoint == "0.0.0.0:4317"
        assert loaded.receivers.http.endpoint == "0.0.0.0:4318"
        assert loaded.exporters.prometheus.endpoint == "0.0.0.0:9464"
        assert str(loaded.expectations.file) == "/etc/stepwatch/expectations.yaml"
        # The write-ahead log lives in the data volume (Dockerfile VOLUME, StatefulSet volumeClaimTemplate).
        assert str(loaded.durability.data_dir) == "/var/lib/stepwatch"
        kafka = loaded.kafka_exporter()  # score events: off in the image, on in compose (below)
        assert not kafka.enabled and kafka.bootstrap_servers == ["kafka:9092"]
        assert kafka.topic == "stepwatch.scores" and str(kafka.spool.directory).startswith(
            "/var/lib/stepwatch/"
        )
        store = parse_expectations(expectations_text, "expectations.yaml")
        assert set(store.task_keys) == {"refund-order", "support-conversation"}
    compose = yaml.safe_load(COMPOSE.read_text())
    environment = compose["services"]["stepwatch"]["environment"]
    in_compose = load_config(path, environ=environment).kafka_exporter()
    assert in_compose.enabled and in_compose.bootstrap_servers == ["kafka:9092"]
    init = " ".join(compose["services"]["kafka-init"]["command"])
    assert f"--topic={in_compose.topic}" in init  # the topic the stack creates is the one we produce to
