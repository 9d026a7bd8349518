"""Collector configs for the tests, generated from the ones deploy/ ships: only what cannot work on
a test machine is replaced (listen addresses become free loopback ports, `stepwatch:4317` and the
Kubernetes DNS resolver become the test's replicas, `debug` becomes a file exporter), and each
replacement first checks the shipped key it replaces, so a drift in deploy/ fails here instead of
testing something else."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from shared_paths import REPO

DEPLOY = REPO / "deploy"
GATEWAY = DEPLOY / "otelcol" / "compose-collector.yaml"
KAFKA = DEPLOY / "otelcol" / "kafka-collector.yaml"
TELEMETRY = DEPLOY / "otelcol" / "stepwatch-telemetry.yaml"
LOADBALANCING = DEPLOY / "k8s" / "otelcol-loadbalancing.yaml"

Config = dict[str, Any]


def load(path: Path) -> Config:
    return yaml.safe_load(path.read_text())


def loadbalancing_relay() -> Config:
    """The `relay.yaml` the k8s ConfigMap mounts into the gateway collectors."""
    configmap = load(LOADBALANCING)
    assert configmap["kind"] == "ConfigMap"
    return yaml.safe_load(configmap["data"]["relay.yaml"])


def _replace(mapping: dict[str, Any], key: str, value: Any, *, shipped: Any = None) -> None:
    assert key in mapping, f"shipped config lost {key!r}"
    if shipped is not None:
        assert mapping[key] == shipped, f"shipped {key!r} is {mapping[key]!r}, expected {shipped!r}"
    mapping[key] = value


def _local(config: Config, *, grpc: int, http: int, telemetry: int, health: int | None = None) -> Config:
    """Bind the otlp receiver, the Collector's own metrics and the health check to loopback ports."""
    out = copy.deepcopy(config)
    protocols = out["receivers"]["otlp"]["protocols"]
    _replace(protocols["grpc"], "endpoint", f"127.0.0.1:{grpc}", shipped="0.0.0.0:4317")
    _replace(protocols["http"], "endpoint", f"127.0.0.1:{http}", shipped="0.0.0.0:4318")
    (reader,) = out["service"]["telemetry"]["metrics"]["readers"]
    prometheus = reader["pull"]["exporter"]["prometheus"]
    _replace(prometheus, "host", "127.0.0.1", shipped="0.0.0.0")
    _replace(prometheus, "port", telemetry, shipped=8888)
    if "health_check" in out.get("extensions", {}):
        assert health is not None, "the shipped config has a health check: give it a port"
        _replace(
            out["extensions"]["health_check"], "endpoint", f"127.0.0.1:{health}", shipped="0.0.0.0:13133"
        )
    out["service"]["telemetry"]["logs"] = {"level": "info"}
    return out


def gateway(*, stepwatch_grpc: int, grpc: int, http: int, telemetry: int) -> Config:
    """deploy/otelcol/compose-collector.yaml forwarding to one Stepwatch on loopback."""
    out = _local(load(GATEWAY), grpc=grpc, http=http, telemetry=telemetry)
    exporter = out["exporters"]["otlp/stepwatch"]
    _replace(exporter, "endpoint", f"127.0.0.1:{stepwatch_grpc}", shipped="stepwatch:4317")
    return out


def loadbalancing(*, replicas: list[int], grpc: int, http: int, telemetry: int, health: int) -> Config:
    """The k8s gateway's relay.yaml with its DNS resolver swapped for a static list of replicas."""
    out = _local(loadbalancing_relay(), grpc=grpc, http=http, telemetry=telemetry, health=health)
    hostnames = [f"127.0.0.1:{port}" for port in replicas]
    lb_exporters = [v for k, v in out["exporters"].items() if k.split("/")[0] == "load_balancing"]
    assert len(lb_exporters) == 2, "the relay routes traces and sessions through two exporters"
    for exporter in lb_exporters:
        resolver = exporter["resolver"]
        assert set(resolver) == {"dns"}, resolver
        exporter["resolver"] = {"static": {"hostnames": hostnames}}
    return out


def kafka(*, brokers: str, topic: str, encoding: str, grpc: int, http: int, telemetry: int) -> Config:
    """deploy/otelcol/kafka-collector.yaml producing to the test's broker and topic."""
    out = _local(load(KAFKA), grpc=grpc, http=http, telemetry=telemetry)
    exporter = out["exporters"]["kafka"]
    _replace(exporter, "brokers", [brokers], shipped=["kafka:9092"])
    _replace(exporter["traces"], "topic", topic, shipped="otlp_spans")
    _replace(exporter["traces"], "encoding", encoding, shipped="otlp_proto")
    return out


def telemetry(*, path: Path, grpc: int, http: int, telemetry: int) -> Config:
    """deploy/otelcol/stepwatch-telemetry.yaml writing what it receives to a JSON-lines file."""
    out = _local(load(TELEMETRY), grpc=grpc, http=http, telemetry=telemetry)
    out["exporters"] = {"file": {"path": str(path), "format": "json", "flush_interval": "100ms"}}
    for name in ("metrics", "logs"):
        pipeline = out["service"]["pipelines"][name]
        _replace(pipeline, "exporters", ["file"], shipped=["debug"])
    return out
