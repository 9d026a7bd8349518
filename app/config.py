"""The service configuration: one pydantic model per component, composed into `ServiceConfig`.

Sources, highest precedence first: command-line flags > environment (`STEPWATCH_<SECTION>__<FIELD>`,
nested sections joined by `__`, values read as YAML scalars) > the YAML file > defaults. Every
section forbids unknown keys, so a typo is an error naming the key, where it came from and the
closest allowed key. Kubernetes service-link variables (`STEPWATCH_METRICS_PORT=tcp://...`, see
K8S_SERVICE_LINK) are ignored, never refused.
Later components add their own section model here (e.g. `exporters.kafka`, `receivers.kafka`).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from stepwatch.evaluator.buffer import BufferLimits
from stepwatch.evaluator.judge.settings import JudgeServiceConfig
from stepwatch.evaluator.ledger import LedgerLimits
from stepwatch.evaluator.partitioning import DEFAULT_TASK_KEY_ATTRIBUTES
from stepwatch.evaluator.suggest import did_you_mean
from stepwatch.evaluator.versions import DEFAULT_VERSION_ATTRIBUTES, RECIPES
from stepwatch.event_loop import ENV_EVENT_LOOP
from stepwatch.exporters.config import (
    KafkaExporterConfig,
    OtelEventsExporterConfig,
    OtelMetricsExporterConfig,
    ScoreEventConfig,
)
from stepwatch.receiver.kafka_ingest import KafkaIngestConfig
from stepwatch.receiver.wal import WalConfig, WalPolicy
from stepwatch.security.config import SecurityConfig

ENV_PREFIX = "STEPWATCH_"
ENV_CONFIG_FILE = "STEPWATCH_CONFIG"
"""Environment variable naming the config file (the `--config` flag wins)."""
ENV_NOT_SETTINGS = frozenset(
    {ENV_CONFIG_FILE, "STEPWATCH_AUTH_TOKENS", "STEPWATCH_METRICS_TOKENS", "STEPWATCH_NATIVE", ENV_EVENT_LOOP}
)
"""STEPWATCH_* variables that are not config keys: the config file name, the token sources
(read by the authenticators, never parsed into the config, so tokens cannot leak via check-config)
the native span core switch (receiver/codec/spancore.py, read at import) and serve's event loop
(app/event_loop.py)."""

K8S_SERVICE_LINK = re.compile(
    r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?"
    r"|PORT(?:_[0-9]+_(?:TCP|UDP|SCTP)(?:_(?:ADDR|PORT|PROTO))?)?)$"
)
"""The variables Kubernetes injects for every Service in the pod's namespace (`enableServiceLinks`,
on by default): `<SVC>_SERVICE_HOST`, `<SVC>_SERVICE_PORT[_<NAME>]`, `<SVC>_PORT` and
`<SVC>_PORT_<n>_<PROTO>[_ADDR|_PORT|_PROTO]`. A Service named `stepwatch-metrics` yields
`STEPWATCH_METRICS_PORT=tcp://...`; such a name has no `__`, so it can never be a config key."""

_ENDPOINT = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[^:\[\]\s]*):(?P<port>\d{1,5})$")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_endpoint(value: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 in brackets) -> (host, port); ValueError naming the problem."""
    match = _ENDPOINT.match(value)
    if match is None:
        raise ValueError(f"endpoint {value!r} must be HOST:PORT (IPv6 as [::1]:PORT)")
    port = int(match["port"])
    if port > 65535:
        raise ValueError(f"endpoint {value!r}: port {port} is out of range 0-65535")
    return match["host"].strip("[]") or "0.0.0.0", port


class _Endpoint(Section):
    enabled: bool = Field(default=True, description="Start this listener.")
    endpoint: str = Field(description="HOST:PORT to bind; port 0 picks a free port.")

    @field_validator("endpoint")
    @classmethod
    def _valid_endpoint(cls, value: str) -> str:
        parse_endpoint(value)
        return value


class GrpcReceiverConfig(_Endpoint):
    endpoint: str = Field(default="localhost:4317", description="OTLP/gRPC bind address.")
    max_recv_message_bytes: int = Field(
        default=4 * 2**20,
        ge=1024,
        description="Largest request accepted (after decompression); larger ones get RESOURCE_EXHAUSTED.",
    )
    max_concurrent_rpcs: int | None = Field(
        default=None, ge=1, description="Cap on Export calls in flight; extra calls are refused by gRPC."
    )


class HttpReceiverConfig(_Endpoint):
    endpoint: str = Field(default="localhost:4318", description="OTLP/HTTP bind address.")
    max_body_bytes: int = Field(
        default=20 * 2**20,
        ge=1024,
        description="Largest body accepted, also after gzip decompression; larger ones get 413.",
    )


class KafkaReceiverConfig(KafkaIngestConfig):
    """OTLP traces from a Kafka topic as a consumer group (docs/durability.md); off by default."""

    enabled: bool = Field(default=False, description="Consume `topic` (set by --kafka-ingest-topic).")


class ReceiversConfig(Section):
    grpc: GrpcReceiverConfig = GrpcReceiverConfig()
    http: HttpReceiverConfig = HttpReceiverConfig()
    kafka: KafkaReceiverConfig = KafkaReceiverConfig()


class BufferConfig(BufferLimits):
    """The buffer's limits (evaluator/buffer.py) and how the service drives it."""

    retry_after: float = Field(
        default=1.0,
        gt=0,
        description="Seconds clients are asked to wait (RetryInfo / Retry-After) when full.",
    )
    sweep_interval: float = Field(
        default=0.05, gt=0, le=5, description="Seconds between close-detection sweeps."
    )


class LedgerConfig(LedgerLimits):
    """The decision ledger of closed traces (docs/serve.md, "Retries, duplicates and the ledger")."""


class PartitioningConfig(Section):
    task_key_attributes: list[str] = Field(
        default=list(DEFAULT_TASK_KEY_ATTRIBUTES),
        min_length=1,
        description="Attributes naming the task key, first present wins (root span, any span, resource); "
        "the root span's name is the last resort.",
    )
    version_attributes: list[str] = Field(
        default=list(DEFAULT_VERSION_ATTRIBUTES),
        description="Attributes naming the agent version of a partition (the `version` label of the score "
        "metrics), first present wins, each looked up on the root span, then its resource; "
        f"`{min(RECIPES)}`: the partition's most frequent request model. Empty: no version "
        "(every partition `unknown`).",
    )

    @field_validator("version_attributes")
    @classmethod
    def _known_recipes(cls, value: list[str]) -> list[str]:
        unknown = [name for name in value if name.startswith("@") and name not in RECIPES]
        if unknown:
            raise ValueError(f"unknown version recipe {unknown[0]!r}; known: {', '.join(sorted(RECIPES))}")
        if any(not name for name in value):
            raise ValueError("version_attributes entries must not be empty")
        return value


class ExpectationsConfig(Section):
    file: Path | None = Field(
        default=None, description="Expectations file (YAML or JSON); none: no expectations."
    )
    watch: bool = Field(default=True, description="Reload the file when it changes.")
    poll_interval: float = Field(
        default=1.0, gt=0, description="Seconds between checks of the file when watching."
    )


class ScoringConfig(Section):
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Scoring worker threads (decode, partition, score off the event loop).",
    )
    max_backlog_spans: int = Field(
        default=10_000,
        ge=0,
        description="Spans of closed partitions waiting to be scored above which receivers hold new "
        "requests (answer them later, so clients slow to the scoring rate) until scoring catches up; "
        "keeps score latency near trace_idle_timeout under overload. 0: never hold.",
    )
    max_backlog_wait: float = Field(
        default=0.5,
        ge=0,
        le=30,
        description="Longest a request is held for the scoring backlog, in seconds, and never more than "
        "a quarter of buffer.trace_idle_timeout (a request held longer could arrive after its trace "
        "closed, making its spans late); then it is taken anyway (buffer.max_buffered_spans still applies).",
    )


class PrometheusConfig(_Endpoint):
    endpoint: str = Field(
        default="localhost:9464", description="Bind address of /metrics, /healthz, /readyz."
    )
    max_task_keys: int = Field(
        default=100,
        ge=1,
        description="Distinct task_key label values; registered keys beyond it, and every unregistered key, "
        "share `unregistered`.",
    )
    max_steps_per_task: int = Field(
        default=50,
        ge=1,
        description="Distinct step (and rule) label values per task key in stepwatch_expected_step_outcomes_total "
        "and stepwatch_rule_failures_total; later ones share `other` (counted in "
        "stepwatch_step_series_overflow_total).",
    )
    max_versions_per_task: int = Field(
        default=5,
        ge=1,
        description="Distinct `version` label values per task key in the score families (and the OTel score "
        "metrics); a new version takes the slot of the least recently seen one, whose later partitions "
        "count under `other` (stepwatch_version_label_overflow_total).",
    )


class ExportersConfig(Section):
    prometheus: PrometheusConfig = PrometheusConfig()
    score_events: ScoreEventConfig = ScoreEventConfig()
    kafka: KafkaExporterConfig = KafkaExporterConfig()
    otel_metrics: OtelMetricsExporterConfig = OtelMetricsExporterConfig()
    otel_events: OtelEventsExporterConfig = OtelEventsExporterConfig()
    queue_size: int = Field(
        default=10_000, ge=1, description="Score events queued per exporter; overflow is counted and dropped."
    )


class DurabilityConfig(WalPolicy):
    """Write-ahead log for OTLP gRPC/HTTP spans (docs/durability.md); on when `data_dir` is set.
    Its sync and size fields are the log's own policy (receiver/wal.py)."""

    data_dir: Path | None = Field(
        default=None, description="State directory; the write-ahead log lives in DATA_DIR/wal. Unset: no log."
    )
    wal: bool = Field(default=True, description="Log accepted spans when data_dir is set (--no-wal: off).")
    replay_grace: float = Field(
        default=30.0,
        ge=0,
        description="Seconds traces rebuilt from the log after a restart stay open before their idle "
        "timers start: the rest of such a trace is often a batch refused while Stepwatch was down, "
        "which the client re-sends after its retry backoff (the Collector's retry_on_failure waits up "
        "to max_interval, 30 s). Closing earlier would score a fragment and revise it. 0: no wait.",
    )

    def wal_config(self) -> WalConfig | None:
        if self.data_dir is None or not self.wal:
            return None
        policy = self.model_dump(include=set(WalPolicy.model_fields))
        return WalConfig(directory=self.data_dir / "wal", **policy)


class LogSamplingConfig(Section):
    """The OpenTelemetry Collector's log sampling (zap): per message and tick, the first `initial`
    records are logged, then every `thereafter`-th; applied to the per-partition and per-rejection
    lines only, which can come thousands a second."""

    enabled: bool = Field(default=True, description="Sample the per-partition and per-rejection lines.")
    tick: float = Field(default=10.0, gt=0, description="Seconds of one sampling window.")
    initial: int = Field(
        default=10, ge=0, description="Records of one message logged per tick before sampling."
    )
    thereafter: int = Field(
        default=100, ge=1, description="After `initial`, one record in this many is logged per tick."
    )
    failures_per_second: float = Field(
        default=20.0,
        gt=0,
        description="Per-partition lines of a failing partition (a metric failed or errored) are never "
        "sampled away: at most this many a second are logged (bursts up to one second's worth), the "
        "rest counted in stepwatch_partition_log_suppressed_total.",
    )


class LoggingConfig(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="DEBUG, INFO, WARNING or ERROR (any case)."
    )
    format: Literal["text", "json"] = Field(
        default="text", description="text: one human-readable line; json: one JSON object a line."
    )
    sampling: LogSamplingConfig = LogSamplingConfig()

    @field_validator("level", "format", mode="before")
    @classmethod
    def _any_case(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        return value.upper() if value.upper() in ("DEBUG", "INFO", "WARNING", "ERROR") else value.lower()


class DebugPagesConfig(Section):
    """zpages-like pages on the metrics port, behind its auth (docs/operations.md, Debug pages)."""

    enabled: bool = Field(
        default=True, description="Serve /debug/ (partitionz with each partition's detail, rejectionz)."
    )
    max_partitions: int = Field(
        default=200,
        ge=1,
        le=100_000,
        description="Most recent scored partition revisions kept, with their details.",
    )
    max_failures_per_task_key: int = Field(
        default=20,
        ge=0,
        le=10_000,
        description="Most recent failing revisions (a metric failed or errored) kept per task key, "
        "besides max_partitions, so passes never push them out. 0: none kept apart.",
    )
    admit_per_second: float = Field(
        default=20.0,
        ge=0,
        description="Revisions the recent set takes a second at most (a token bucket); past it a sample "
        "spread over time is kept and the rest counted in stepwatch_debug_partitions_skipped_total. "
        "0: every revision (costs ~5% CPU at 10,000 spans/s).",
    )
    admit_failures_per_second: float = Field(
        default=1.0,
        ge=0,
        description="Failing revisions each task key's failure set takes a second at most; 0: every one.",
    )
    max_failure_task_keys: int = Field(
        default=100,
        ge=1,
        le=10_000,
        description="Task keys whose failures are kept, over all tenants (each tenant's key counts "
        "apart); beyond it, the key that failed least recently is dropped first.",
    )
    max_rejections: int = Field(default=200, ge=1, le=100_000, description="Most recent rejections kept.")
    trace_url_template: str | None = Field(
        default=None,
        description="Link from a partition's detail page to its trace: an http(s) URL in which every "
        "`{trace_id}` is replaced by the trace id (Grafana Explore, Tempo, Jaeger). Unset: no link.",
    )

    @field_validator("trace_url_template")
    @classmethod
    def _one_trace_id_field(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if "{trace_id}" not in value:
            raise ValueError("trace_url_template must contain {trace_id}")
        if not value.startswith(("http://", "https://")):
            raise ValueError("trace_url_template must be an http:// or https:// URL")
        return value


class ServiceConfig(Section):
    receivers: ReceiversConfig = ReceiversConfig()
    buffer: BufferConfig = BufferConfig()
    ledger: LedgerConfig = LedgerConfig()
    partitioning: PartitioningConfig = PartitioningConfig()
    expectations: ExpectationsConfig = ExpectationsConfig()
    scoring: ScoringConfig = ScoringConfig()
    exporters: ExportersConfig = ExportersConfig()
    durability: DurabilityConfig = DurabilityConfig()
    judge: JudgeServiceConfig = JudgeServiceConfig()
    security: SecurityConfig = SecurityConfig()
    logging: LoggingConfig = LoggingConfig()
    debug_pages: DebugPagesConfig = DebugPagesConfig()

    @model_validator(mode="after")
    def _ledger_covers_the_late_window(self) -> ServiceConfig:
        if self.ledger.retention < self.buffer.late_span_window:
            raise ValueError(
                f"ledger.retention ({self.ledger.retention}) must be >= buffer.late_span_window "
                f"({self.buffer.late_span_window}): a retry within the window must be a duplicate"
            )
        return self

    def locked_data_dir(self) -> Path | None:
        """The data dir when a log lives in it (the WAL and decision log, or the default Kafka spool):
        one process at a time may open it (stepwatch.data_dir). None when nothing does."""
        data_dir = self.durability.data_dir
        if data_dir is None:
            return None
        kafka = self.kafka_exporter()
        spool_inside = kafka.enabled and data_dir.resolve() in kafka.spool.directory.resolve().parents
        return data_dir if self.durability.wal_config() is not None or spool_inside else None

    def kafka_exporter(self) -> KafkaExporterConfig:
        """exporters.kafka, with the spool in DATA_DIR/kafka-spool when durability.data_dir is set and
        the spool directory was not given explicitly (so all state lives in one volume)."""
        kafka = self.exporters.kafka
        if self.durability.data_dir is None or "directory" in kafka.spool.model_fields_set:
            return kafka
        spool = kafka.spool.model_copy(update={"directory": self.durability.data_dir / "kafka-spool"})
        return kafka.model_copy(update={"spool": spool})


class ConfigError(ValueError):
    """The configuration is invalid; the message has one line per problem, naming key and source."""


def env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """`STEPWATCH_A__B=v` -> {"a": {"b": v}} (v parsed as a YAML scalar), and key -> variable name."""
    tree: dict[str, Any] = {}
    origin: dict[tuple[str, ...], str] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_SETTINGS:
            continue
        if "__" not in name and K8S_SERVICE_LINK.match(name):
            continue  # Kubernetes' service links for a Service named stepwatch-*: not ours
        path = tuple(part.lower() for part in name[len(ENV_PREFIX) :].split("__"))
        if not all(path):
            raise ConfigError(f"{name}: empty section name (use STEPWATCH_SECTION__FIELD)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError:
            value = raw
        _set(tree, path, value, name)
        origin[path] = name
    return tree, origin


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any, source: str) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: {'.'.join(path)} conflicts with another setting")
        node = child
    node[path[-1]] = value


def merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else in `override` replaces."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def load_config(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> ServiceConfig:
    """Defaults < file < environment < flags, validated once; ConfigError names key and source."""
    environ = os.environ if environ is None else environ
    if path is None and environ.get(ENV_CONFIG_FILE):
        path = Path(environ[ENV_CONFIG_FILE])
    file_data = read_config_file(path) if path is not None else {}
    if path is not None:
        _check_is_config(path, file_data)
    data = file_data
    env_tree, env_origin = env_overrides(environ)
    data = merge(data, env_tree)
    flag_origin: dict[tuple[str, ...], str] = {}
    for dotted, (value, flag) in _flag_tree(flags or {}).items():
        path_tuple = tuple(dotted.split("."))
        nested: dict[str, Any] = {}
        _set(nested, path_tuple, value, flag)
        data = merge(data, nested)
        flag_origin[path_tuple] = flag
    try:
        return ServiceConfig.model_validate(data)
    except ValidationError as exc:
        origins = {**{k: str(path) for k in _leaves(file_data)}, **env_origin, **flag_origin}
        lines = []
        for error in exc.errors():
            loc = tuple(str(part) for part in error["loc"])
            key = ".".join(loc) or "(top level)"
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                allowed = _allowed(loc[:-1])
                hint = _env_hint(origins.get(loc, "")) or did_you_mean(loc[-1], allowed)
                message = f"unknown key{hint} (allowed here: {', '.join(allowed)})"
            lines.append(f"{key} (from {_source(loc, origins)}): {message}")
        raise ConfigError("\n".join(lines)) from None


def _check_is_config(path: Path, data: Mapping[str, Any]) -> None:
    """A file with no config section at all is named for what it is (an expectations file, task
    keys without `tasks:`, neither) in one line, rather than an `unknown key` line per key."""
    from stepwatch.expectations_file import looks_like_config, not_an_expectations_file

    if not data or looks_like_config(data):
        return
    if "tasks" in data:
        raise ConfigError(
            f"{path}: an expectations file (top-level `tasks:`), not a service config: give it with "
            "--expectations FILE (or `expectations.file` in the config)"
        )
    raise ConfigError(not_an_expectations_file(str(path), data))


def _env_hint(name: str) -> str:
    """`STEPWATCH_LOGGING_LEVEL` -> `; did you mean STEPWATCH_LOGGING__LEVEL?` (sections are joined
    by a double underscore); '' when no such spelling names a key."""
    if not name.startswith(ENV_PREFIX) or "__" in name:
        return ""
    parts = name[len(ENV_PREFIX) :].lower().split("_")
    if len(parts) > 8:
        return ""
    for joins in itertools.product(("_", "__"), repeat=len(parts) - 1):
        path = parts[0] + "".join(j + p for j, p in zip(joins, parts[1:], strict=True))
        keys = tuple(path.split("__"))
        if len(keys) > 1 and keys[-1] in _allowed(keys[:-1]):
            return f"; did you mean {ENV_PREFIX}{path.upper()}?"
    return ""


def _leaves(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The key path of every value set in a (file) tree (mappings are walked, not listed)."""
    out = []
    for key, value in tree.items():
        path = (*prefix, str(key))
        out.extend(_leaves(value, path) if isinstance(value, Mapping) and value else [path])
    return out


def _source(loc: tuple[str, ...], origins: Mapping[tuple[str, ...], str]) -> str:
    """Where the value at `loc` came from: its own source, else (a cross-field rule on a section) the
    sources of the keys set inside it, flags first; `defaults` only when nothing set any of them."""
    if loc in origins:
        return origins[loc]
    inside = [source for key, source in origins.items() if key[: len(loc)] == loc and len(key) > len(loc)]
    flags = [s for s in inside if s.startswith("--")]
    env = [s for s in inside if s.startswith(ENV_PREFIX)]
    files = [s for s in inside if s not in flags and s not in env]
    found = list(dict.fromkeys([*flags, *env, *files]))
    return ", ".join(found) if found else "defaults"


def _flag_tree(flags: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """Flags arrive as {"buffer.trace_idle_timeout": (value, "--trace-idle-timeout")}; None = not given."""
    return {key: item for key, item in flags.items() if item[0] is not None}


def _allowed(loc: tuple[str, ...]) -> list[str]:
    model: type[BaseModel] = ServiceConfig
    for part in loc:
        field = model.model_fields.get(part)
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return sorted(model.model_fields)


def effective_yaml(config: ServiceConfig) -> str:
    """The validated configuration as YAML (what `check-config` prints)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
