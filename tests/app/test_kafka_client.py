"""One spelling of a Kafka connection for the receiver and the exporter (app/kafka_client.py)."""

from __future__ import annotations

import pytest

from stepwatch.config import ConfigError, load_config
from stepwatch.exporters.config import KafkaExporterConfig
from stepwatch.receiver.kafka_ingest import KafkaIngestConfig


@pytest.mark.parametrize("section", [KafkaIngestConfig, KafkaExporterConfig])
def test_both_sections_take_the_same_connection_fields(section: type) -> None:
    config = section.model_validate(
        {
            "bootstrap_servers": "a:9092, b:9092",
            "security_protocol": "SASL_SSL",
            "tls": {"ca_file": "/etc/ca.pem", "check_hostname": False},
            "sasl": {"mechanism": "SCRAM-SHA-512", "username_env": "U", "password_env": "P"},
        }
    )
    assert config.bootstrap_servers == ["a:9092", "b:9092"]
    assert (config.tls.check_hostname, config.sasl.mechanism) == (False, "SCRAM-SHA-512")


def test_consumer_and_producer_get_the_same_connection_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("U", "svc")
    monkeypatch.setenv("P", "s3cret")
    connection = {
        "bootstrap_servers": ["a:9092"],
        "security_protocol": "SASL_PLAINTEXT",
        "sasl": {"mechanism": "PLAIN", "username_env": "U", "password_env": "P"},
    }
    consumer = KafkaIngestConfig.model_validate(connection).consumer_kwargs()
    producer = KafkaExporterConfig.model_validate(connection).client_options()
    shared = ("bootstrap_servers", "security_protocol", "sasl_mechanism", "sasl_plain_username")
    assert {k: consumer[k] for k in shared} == {k: producer[k] for k in shared}
    assert consumer["sasl_plain_password"] == "s3cret" and consumer["enable_auto_commit"] is False


@pytest.mark.parametrize(
    ("section", "old", "new"),
    [
        ("receivers", "tls_ca_file", "tls.ca_file"),
        ("receivers", "sasl_password", "sasl.password_env"),
        ("exporters", "ssl_cafile", "tls.ca_file"),
        ("exporters", "sasl_username_env", "sasl.username_env"),
    ],
)
def test_an_old_key_is_refused_naming_its_new_key(section: str, old: str, new: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, environ={f"STEPWATCH_{section.upper()}__KAFKA__{old.upper()}": "x"})
    assert f"{old} moved to {new}" in str(caught.value)
