"""Config sections of the score streams (Kafka events, OTel metrics, OTel evaluation events).

Every default is valid; the Kafka and OTel streams are off until enabled. Secrets never live in
the YAML: SASL credentials are read from environment variables named here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from aiokafka.codec import has_gzip, has_lz4, has_snappy, has_zstd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from stepwatch.kafka_client import KafkaClientConfig
from stepwatch.segment_log import FsyncPolicy

_CODECS = {"gzip": has_gzip, "snappy": has_snappy, "lz4": has_lz4, "zstd": has_zstd}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScoreEventConfig(_Section):
    """How ScoreEvents are built (shared by every score stream)."""

    tenant: str | None = Field(
        default=None, description="Tenant name stamped on every event; part of event_id."
    )
    include_payloads: bool = Field(
        default=False,
        description="Keep step `input`/`output` values in event details (they may hold user data).",
    )


class SpoolConfig(_Section):
    """The on-disk spool that holds Kafka events while the broker is down or slow."""

    directory: Path = Field(
        default=Path("stepwatch-data/kafka-spool"),
        description="Spool directory; one exporter process per directory (it is locked).",
    )
    max_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=4096,
        description="Bound on the spool's bytes on disk; when full, new events are rejected and counted "
        "in stepwatch_kafka_events_failed_total.",
    )
    segment_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="A segment file is closed and a new one begun past this size.",
    )
    fsync: FsyncPolicy = Field(
        default="interval",
        description="always: fsync after every append (survives power loss, costs a disk flush per event); "
        "interval: fsync every fsync_interval_seconds; never: leave it to the OS (survives a process crash).",
    )
    fsync_interval_seconds: float = Field(default=1.0, gt=0, description="Period of fsync under `interval`.")

    @model_validator(mode="after")
    def _segment_fits(self) -> SpoolConfig:
        if self.segment_bytes > self.max_bytes:
            raise ValueError("kafka.spool.segment_bytes must not exceed kafka.spool.max_bytes")
        return self


class KafkaExporterConfig(KafkaClientConfig):
    """Kafka score events: one JSON ScoreEvent per record, keyed by partition id. The connection
    fields (bootstrap_servers, client_id, security_protocol, tls, sasl) are the Kafka receiver's too."""

    enabled: bool = Field(default=False, description="Produce score events to Kafka.")
    topic: str = Field(default="stepwatch.scores", min_length=1, description="Topic the events go to.")
    acks: Literal["all", 1] = Field(
        default="all", description="all: a record counts as sent once every in-sync replica has it."
    )
    compression: Literal["gzip", "snappy", "lz4", "zstd", "none"] = Field(
        default="gzip",
        description="Record batch compression. gzip needs nothing extra; snappy, lz4 and zstd need the "
        "`cramjam` package (pip install 'stepwatch[kafka-codecs]').",
    )
    linger_ms: int = Field(default=20, ge=0, description="How long the producer waits to fill a batch.")
    max_batch_size: int = Field(
        default=256 * 1024, ge=1024, description="Bytes per partition batch (aiokafka max_batch_size)."
    )
    max_request_size: int = Field(
        default=1024 * 1024, ge=1024, description="Largest request; a bigger event is counted as failed."
    )
    request_timeout_ms: int = Field(
        default=10_000,
        ge=100,
        description="How long a send may wait for the broker before its events go to the spool.",
    )
    retry_backoff_ms: int = Field(default=200, ge=1, description="aiokafka's pause between internal retries.")
    reconnect_backoff_max_seconds: float = Field(
        default=5.0,
        gt=0,
        description="Upper bound of the exporter's backoff while the broker is unreachable.",
    )
    enable_idempotence: bool = Field(
        default=False,
        description="Kafka idempotent producer (needs broker support for InitProducerId). Off by default: "
        "consumers deduplicate on event_id anyway.",
    )
    queue_size: int = Field(
        default=10_000, ge=1, description="Events held in memory before they overflow into the spool."
    )
    send_batch_events: int = Field(
        default=500, ge=1, description="Events the sender hands aiokafka per round."
    )
    shutdown_timeout_seconds: float = Field(
        default=10.0, ge=0, description="How long shutdown tries to deliver before spooling what is left."
    )
    spool: SpoolConfig = Field(default_factory=SpoolConfig)

    @model_validator(mode="after")
    def _check(self) -> KafkaExporterConfig:
        if self.compression != "none" and not _CODECS[self.compression]():
            raise ValueError(
                f"kafka.compression {self.compression!r} needs the cramjam package "
                "(pip install 'stepwatch[kafka-codecs]'), or use gzip"
            )
        if self.enable_idempotence and self.acks != "all":
            raise ValueError("kafka.enable_idempotence needs kafka.acks all")
        return self


class OtlpConfig(_Section):
    """Where OTLP data goes. Unset endpoint/headers fall back to the standard OTEL_EXPORTER_OTLP_*
    (and signal-specific OTEL_EXPORTER_OTLP_METRICS_* / _LOGS_*) variables, read by the OTel SDK."""

    protocol: Literal["grpc", "http/protobuf"] = Field(
        default="grpc", description="OTLP transport; OTEL_EXPORTER_OTLP_PROTOCOL is not consulted."
    )
    endpoint: str | None = Field(
        default=None,
        description="gRPC: http(s)://host:4317. HTTP: the full signal URL, e.g. http://host:4318/v1/metrics.",
    )
    headers: dict[str, str] = Field(default_factory=dict, description="Extra request headers (e.g. auth).")
    timeout_seconds: float = Field(default=10.0, gt=0, description="Per-export request timeout.")


class OtelMetricsExporterConfig(_Section):
    """Scores as OTel metrics (histogram + outcome counter) through the SDK's MeterProvider."""

    enabled: bool = Field(default=False, description="Export score metrics over OTLP.")
    otlp: OtlpConfig = Field(default_factory=OtlpConfig)
    export_interval_seconds: float = Field(default=15.0, gt=0, description="Period of metric export.")
    max_task_keys: int = Field(
        default=200,
        ge=1,
        description="Distinct task_key attribute values kept; later ones share the value `_other`.",
    )
    max_metrics: int = Field(
        default=64,
        ge=1,
        description="Distinct gen_ai.evaluation.name values kept; later ones share `_other`.",
    )
    cardinality_limit: int = Field(
        default=2000,
        ge=1,
        description="SDK cap on series per instrument; overflow lands in otel.metric.overflow.",
    )


class OtelEventsExporterConfig(_Section):
    """Scores as `gen_ai.evaluation.result` log events, parented to the scored trace."""

    enabled: bool = Field(default=False, description="Export evaluation events over OTLP logs.")
    otlp: OtlpConfig = Field(default_factory=OtlpConfig)
    max_queue_size: int = Field(default=8192, ge=1, description="BatchLogRecordProcessor queue bound.")
    schedule_delay_seconds: float = Field(default=1.0, gt=0, description="Batch export period.")
    max_export_batch_size: int = Field(default=512, ge=1, description="Records per OTLP request.")
    max_explanation_chars: int = Field(
        default=4096, ge=0, description="gen_ai.evaluation.explanation is cut to this length."
    )
