"""Every Collector config deploy/ ships, verbatim, passes the real Collector's own `validate`
(component names, fields and pipelines as the built release parses them)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import shipped_configs
import yaml

SHIPPED = {
    "compose-collector": shipped_configs.GATEWAY,
    "kafka-collector": shipped_configs.KAFKA,
    "stepwatch-telemetry": shipped_configs.TELEMETRY,
}


def _validate(binary: Path, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), "validate", "--config", str(config)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_collector_config_validates(otelcol_binary: Path, name: str) -> None:
    done = _validate(otelcol_binary, SHIPPED[name])
    assert done.returncode == 0, done.stderr


def test_k8s_relay_config_validates(otelcol_binary: Path, tmp_path: Path) -> None:
    relay = tmp_path / "relay.yaml"
    relay.write_text(yaml.safe_load(shipped_configs.LOADBALANCING.read_text())["data"]["relay.yaml"])
    done = _validate(otelcol_binary, relay)
    assert done.returncode == 0, done.stderr


def test_validate_rejects_a_broken_config(otelcol_binary: Path, tmp_path: Path) -> None:
    """The check above can fail: a misspelt field is refused."""
    config = yaml.safe_load(shipped_configs.GATEWAY.read_text())
    config["exporters"]["otlp/stepwatch"]["compresion"] = "gzip"
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(config))
    done = _validate(otelcol_binary, broken)
    assert done.returncode != 0 and "compresion" in done.stderr
