"""Security configuration: TLS, authentication, tenancy, limits and privacy, validated at the edge.

Every model forbids unknown keys and has valid defaults, so `SecurityConfig()` is the secure-enough
zero-configuration default: no TLS (plaintext on localhost), no auth, one tenant, all limits on,
content never exported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

TLSVersion = Literal["1.2", "1.3"]
DEFAULT_TENANT_NAME = "default"
"""The implicit tenant (tenancy off, no auth, Kafka): its buffer keys are the bare trace ids."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TLSServerConfig(_Model):
    """Server-side TLS for a listening port (OTLP gRPC, OTLP HTTP, metrics/admin).

    Certificate, key and client CA files are re-read when they change on disk, so a rotated
    certificate (cert-manager, a Kubernetes secret update) is served without a restart.
    """

    cert_file: Path | None = Field(default=None, description="PEM certificate chain served to clients.")
    key_file: Path | None = Field(default=None, description="PEM private key for `cert_file`.")
    client_ca_file: Path | None = Field(
        default=None,
        description="PEM CA bundle; when set, clients must present a certificate signed by it (mTLS).",
    )
    min_version: TLSVersion = Field(default="1.2", description="Lowest TLS version accepted.")

    @model_validator(mode="after")
    def _check_pair(self) -> TLSServerConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls: cert_file and key_file must be set together")
        if self.client_ca_file is not None and self.cert_file is None:
            raise ValueError("tls: client_ca_file (mTLS) needs cert_file and key_file")
        return self

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None


class TLSClientConfig(_Model):
    """Client-side TLS for outgoing connections (Kafka, the OTLP metrics endpoint)."""

    enabled: bool = Field(default=False, description="Use TLS for this connection.")
    ca_file: Path | None = Field(default=None, description="PEM CA bundle; default: the system trust store.")
    cert_file: Path | None = Field(default=None, description="Client certificate for mTLS.")
    key_file: Path | None = Field(default=None, description="Client private key for mTLS.")
    min_version: TLSVersion = "1.2"

    @model_validator(mode="after")
    def _check_pair(self) -> TLSClientConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls: client cert_file and key_file must be set together")
        return self


class BasicAuthConfig(_Model):
    """HTTP basic auth for /metrics and admin endpoints (like the collector's basicauth extension)."""

    users_file: Path | None = Field(
        default=None,
        description="YAML mapping user -> password, or user -> 'sha256:<hex digest of the password>'.",
    )


class AuthConfig(_Model):
    """Bearer-token authentication of OTLP senders; each token belongs to one tenant."""

    tokens_file: Path | None = Field(
        default=None,
        description="YAML: a mapping tenant -> list of tokens, or a bare list of tokens (one tenant).",
    )
    tokens_env: str = Field(
        default="STEPWATCH_AUTH_TOKENS",
        description="Environment variable read when set: comma-separated tokens (one tenant), or the "
        "file's YAML/JSON mapping inline.",
    )


class AdminAuthConfig(_Model):
    """Optional protection of the metrics/admin port: a separate bearer-token list and/or basic auth."""

    tokens_file: Path | None = Field(default=None, description="Same format as auth.tokens_file.")
    tokens_env: str = "STEPWATCH_METRICS_TOKENS"
    basic: BasicAuthConfig = Field(default_factory=BasicAuthConfig)


class PrivacyConfig(_Model):
    """What may leave the process: step inputs, outputs and prompts are withheld unless turned on."""

    include_content: bool = Field(
        default=False,
        description="Let score events and logs carry step inputs/outputs and prompts.",
    )
    redact_attributes: list[str] = Field(
        default_factory=list,
        description="Attribute keys whose values are replaced by '[REDACTED]' at ingest; "
        "a trailing '*' matches a prefix (e.g. 'gen_ai.prompt*').",
    )


class TenantConfig(_Model):
    """One tenant's own settings; unset fields fall back to the top-level ones."""

    expectations_file: Path | None = Field(default=None, description="This tenant's expectations file.")
    privacy: PrivacyConfig | None = Field(default=None, description="Overrides `privacy` for this tenant.")


class TenancyConfig(_Model):
    """Multi-tenancy: off by default (one implicit tenant, no `tenant` metric label)."""

    enabled: bool = Field(default=False, description="Partition data by the tenant of the sender's token.")
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_names(self) -> TenancyConfig:
        for name in self.tenants:
            if not name or len(name) > 64 or not all(c.isalnum() or c in "-_." for c in name):
                raise ValueError(
                    f"tenancy.tenants: tenant name {name!r} must be 1-64 characters of letters, digits, '-_.'"
                )
        return self


MOVED_TO_BUFFER = ("max_spans_per_trace", "max_traces_per_session")
"""Keys an earlier release also took under security.limits (the smaller of the two applied)."""
MOVED_TO_RECEIVERS = {
    "max_message_bytes": "receivers.grpc.max_recv_message_bytes",
    "max_http_body_bytes": "receivers.http.max_body_bytes",
}
"""Request size caps an earlier release took both here and under receivers (the smaller applied)."""


class LimitsConfig(_Model):
    """Caps against hostile or runaway input; each is metered (stepwatch_limits_exceeded_total{limit})."""

    max_spans_per_request: int = Field(default=10_000, gt=0)
    max_attributes_per_span: int = Field(default=128, gt=0, description="Extra attributes are dropped.")
    max_attribute_value_length: int = Field(
        default=8192, gt=0, description="Longer string values are truncated (counted, not rejected)."
    )
    max_json_depth: int = Field(
        default=32, gt=0, description="Nesting depth when JSON strings are unwrapped."
    )
    max_expectations_file_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    max_expected_steps: int = Field(default=1_000, gt=0, description="Steps in one expectation.")
    max_group_size: int = Field(default=16, gt=0, description="Names in one unordered group.")
    max_steps_per_partition: int = Field(
        default=2_000, gt=0, description="Observed steps scored per partition; more are not scored."
    )
    max_dp_cells: int = Field(
        default=4_000_000,
        gt=0,
        description="Cap on observed x expected steps for the edit-distance table, bounding scoring time.",
    )

    max_spans_per_trace: None = Field(default=None, exclude=True, repr=False, description="Moved to buffer.")
    max_traces_per_session: None = Field(
        default=None, exclude=True, repr=False, description="Moved to buffer."
    )
    max_message_bytes: None = Field(default=None, exclude=True, repr=False, description="Moved to receivers.")
    max_http_body_bytes: None = Field(
        default=None, exclude=True, repr=False, description="Moved to receivers."
    )

    @field_validator(*MOVED_TO_RECEIVERS, mode="before")
    @classmethod
    def _moved_to_receivers(cls, value: object, info: ValidationInfo) -> None:
        """A request's size has one limit, on its receiver."""
        raise ValueError(
            f"moved to {MOVED_TO_RECEIVERS[str(info.field_name)]} (the one limit on a request's size); "
            "set it there and remove it here"
        )

    @field_validator(*MOVED_TO_BUFFER, mode="before")
    @classmethod
    def _moved(cls, value: object, info: ValidationInfo) -> None:
        """Spans per trace and traces per session are buffer limits: one key each, under `buffer`."""
        raise ValueError(
            f"moved to buffer.{info.field_name} (the one limit on it: a partition reaching it is "
            "closed early and scored, reason `limit`); set it there and remove it here"
        )


class SecurityConfig(_Model):
    """Everything this package configures; composed into the service config under `security:`."""

    receivers_tls: TLSServerConfig = Field(
        default_factory=TLSServerConfig, description="TLS for the OTLP gRPC and HTTP receivers."
    )
    metrics_tls: TLSServerConfig = Field(
        default_factory=TLSServerConfig, description="TLS for the metrics/admin port."
    )
    auth: AuthConfig = Field(default_factory=AuthConfig)
    metrics_auth: AdminAuthConfig = Field(default_factory=AdminAuthConfig)
    tenancy: TenancyConfig = Field(default_factory=TenancyConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
