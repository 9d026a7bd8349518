"""How a Kafka client reaches the brokers: one model for the Kafka receiver and the Kafka exporter.

Both sections spell the connection the same way (`bootstrap_servers` a list, a `tls:` block as in
the Collector's kafka components and in `security.*_tls`, a `sasl:` block whose secrets come from
the environment), and both build their aiokafka arguments here. A leaf module: it imports nothing
of receiver/, evaluator/ or exporters/, so both sides may import it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from aiokafka.helpers import create_ssl_context
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]

MOVED = {
    "ssl_cafile": "tls.ca_file",
    "ssl_certfile": "tls.cert_file",
    "ssl_keyfile": "tls.key_file",
    "ssl_check_hostname": "tls.check_hostname",
    "tls_ca_file": "tls.ca_file",
    "tls_cert_file": "tls.cert_file",
    "tls_key_file": "tls.key_file",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_username_env": "sasl.username_env",
    "sasl_password_env": "sasl.password_env",
    "sasl_username": "sasl.username_env (the name of an environment variable holding it)",
    "sasl_password": "sasl.password_env (the name of an environment variable holding it)",
}
"""Keys of earlier releases (the receiver and the exporter spelt them differently): refused with
the key that replaced them, never silently ignored."""


class KafkaTls(BaseModel):
    """TLS to the brokers (used with security_protocol SSL or SASL_SSL)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_file: Path | None = Field(default=None, description="CA bundle that signs the brokers' certificates.")
    cert_file: Path | None = Field(default=None, description="Client certificate (mutual TLS).")
    key_file: Path | None = Field(default=None, description="Client private key (mutual TLS).")
    check_hostname: bool = Field(default=True, description="Verify the broker's hostname.")

    @model_validator(mode="after")
    def _pair(self) -> KafkaTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls.cert_file and tls.key_file go together (mutual TLS needs both)")
        return self


class KafkaSasl(BaseModel):
    """SASL authentication; the credentials are read from the environment at each connect, so
    secrets never live in a config file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        default=None, description="Required with security_protocol SASL_PLAINTEXT or SASL_SSL."
    )
    username_env: str = Field(
        default="STEPWATCH_KAFKA_SASL_USERNAME", description="Environment variable holding the username."
    )
    password_env: str = Field(
        default="STEPWATCH_KAFKA_SASL_PASSWORD", description="Environment variable holding the password."
    )

    def credentials(self) -> tuple[str, str]:
        """(username, password) from the environment; ValueError naming the variable when unset."""
        missing = [name for name in (self.username_env, self.password_env) if not os.environ.get(name)]
        if missing:
            raise ValueError(f"SASL {self.mechanism} needs the environment variable(s) {', '.join(missing)}")
        return os.environ[self.username_env], os.environ[self.password_env]


class KafkaClientConfig(BaseModel):
    """The connection fields shared by `receivers.kafka` and `exporters.kafka`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap_servers: list[str] = Field(
        default=["localhost:9092"],
        min_length=1,
        description="host:port of brokers (a comma-separated string is accepted too).",
    )
    client_id: str = Field(default="stepwatch", description="Kafka client id.")
    security_protocol: SecurityProtocol = "PLAINTEXT"
    tls: KafkaTls = Field(default_factory=KafkaTls)
    sasl: KafkaSasl = Field(default_factory=KafkaSasl)

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            moved = [f"{key} moved to {MOVED[key]}" for key in data if key in MOVED]
            if moved:
                raise ValueError("; ".join(moved))
        return data

    @field_validator("bootstrap_servers", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [server.strip() for server in value.split(",") if server.strip()]
        return value

    @model_validator(mode="after")
    def _sasl_needs_mechanism(self) -> KafkaClientConfig:
        sasl = self.security_protocol.startswith("SASL")
        if sasl and self.sasl.mechanism is None:
            raise ValueError(f"sasl.mechanism is required with security_protocol {self.security_protocol}")
        if not sasl and self.sasl.mechanism is not None:
            raise ValueError("sasl.mechanism needs security_protocol SASL_PLAINTEXT or SASL_SSL")
        return self

    def client_options(self) -> dict[str, Any]:
        """aiokafka's connection arguments (consumer and producer alike); reads SASL secrets now."""
        options: dict[str, Any] = {
            "bootstrap_servers": list(self.bootstrap_servers),
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
        }
        if self.security_protocol in ("SSL", "SASL_SSL"):
            tls = self.tls
            context = create_ssl_context(
                cafile=str(tls.ca_file) if tls.ca_file else None,
                certfile=str(tls.cert_file) if tls.cert_file else None,
                keyfile=str(tls.key_file) if tls.key_file else None,
            )
            context.check_hostname = tls.check_hostname
            options["ssl_context"] = context
        if self.security_protocol.startswith("SASL"):
            user, password = self.sasl.credentials()
            options |= {
                "sasl_mechanism": self.sasl.mechanism,
                "sasl_plain_username": user,
                "sasl_plain_password": password,
            }
        return options
