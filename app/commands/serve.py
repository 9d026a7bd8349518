"""`stepwatch serve`: run the streaming evaluator (OTLP/gRPC, OTLP/HTTP, Prometheus) until SIGTERM."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stepwatch.service import Service

HELP = "Run the streaming evaluator: OTLP receivers in, scores out (Prometheus /metrics)."


GC_THRESHOLDS = (20_000, 20, 50)
"""Scoring allocates many short-lived objects while the buffer holds many long-lived ones; with
CPython's default gen0 threshold (700) collections cost ~30% of close time (docs/serve.md). These
are the thresholds every published figure was measured with (Service.start used to override the
(100_000, 50, 100) this command set; gc.freeze() after start-up was ~2 us/span faster still, but a
restarted `serve` with a Kafka spool then never scored)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="YAML config file (default: $STEPWATCH_CONFIG, else built-in defaults)",
    )
    parser.add_argument(
        "--grpc-endpoint", metavar="HOST:PORT", help="OTLP/gRPC bind address (default localhost:4317)"
    )
    parser.add_argument(
        "--http-endpoint", metavar="HOST:PORT", help="OTLP/HTTP bind address (default localhost:4318)"
    )
    parser.add_argument(
        "--metrics-endpoint",
        metavar="HOST:PORT",
        help="/metrics, /healthz, /readyz bind address (default localhost:9464)",
    )
    parser.add_argument(
        "--expectations",
        metavar="FILE",
        help="expectations file (YAML or JSON), watched for changes (default: none; every partition "
        "gets only the expectation-free scorers)",
    )
    parser.add_argument(
        "--trace-idle-timeout",
        type=float,
        metavar="SECONDS",
        help="close a trace this long after its last span, once its root span ended (default 2.0)",
    )
    parser.add_argument(
        "--session-idle-timeout",
        type=float,
        metavar="SECONDS",
        help="close a session this long after the last span of any of its traces (default 30.0)",
    )
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        help=f"state directory: write-ahead log of accepted spans in DIR/wal, Kafka spool in "
        f"DIR/kafka-spool (default ./{EMBEDDED_DATA_DIR}, created in the working directory)",
    )
    parser.add_argument(
        "--no-wal",
        dest="wal",
        action="store_const",
        const=False,
        help="do not log spans (even with --data-dir)",
    )
    parser.add_argument(
        "--kafka-bootstrap",
        metavar="HOST:PORT[,...]",
        help="Kafka bootstrap servers: turns on Kafka score events, and serves --kafka-ingest-topic too (default: off)",
    )
    parser.add_argument(
        "--kafka-topic", metavar="NAME", help="topic of the score events (default stepwatch.scores)"
    )
    parser.add_argument(
        "--spool-dir",
        metavar="DIR",
        help="on-disk spool of score events while Kafka is away (default DATA_DIR/kafka-spool)",
    )
    parser.add_argument(
        "--otlp-metrics-endpoint",
        metavar="URL",
        help="OTLP/gRPC endpoint (http://host:4317): turns on OTel score metrics and evaluation events (default: off)",
    )
    parser.add_argument(
        "--kafka-ingest-topic",
        metavar="TOPIC",
        help="consume OTLP traces from this topic (enables the receiver; default: off)",
    )
    parser.add_argument("--kafka-ingest-group", metavar="GROUP", help="consumer group (default stepwatch)")
    parser.add_argument(
        "--kafka-ingest-encoding",
        choices=("otlp_proto", "otlp_json"),
        help="message encoding (default otlp_proto)",
    )
    parser.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="PEM certificate for the OTLP receivers (TLS; reloaded on change; default: plaintext)",
    )
    parser.add_argument("--tls-key", metavar="FILE", help="PEM private key for --tls-cert")
    parser.add_argument(
        "--tls-client-ca", metavar="FILE", help="PEM CA: require client certificates signed by it (mTLS)"
    )
    parser.add_argument(
        "--auth-tokens",
        metavar="FILE",
        help="YAML bearer tokens, tenant -> [tokens] (a bare list: one tenant); requests without one get 401 "
        "(default: $STEPWATCH_AUTH_TOKENS, else no auth)",
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="logging level, any case (default INFO)",
    )
    parser.add_argument(
        "--log-format",
        type=str.lower,
        choices=("text", "json"),
        help="text lines, or one JSON object a line for log pipelines (default text)",
    )


EMBEDDED_DATA_DIR = "stepwatch-data"
"""Where `stepwatch serve` keeps state when no data directory is configured (relative to the cwd)."""


def flag_overrides(args: argparse.Namespace) -> dict[str, tuple[object, str]]:
    """Flags as config keys (with the flag name, for error messages); unset flags are None."""
    return {
        "receivers.grpc.endpoint": (args.grpc_endpoint, "--grpc-endpoint"),
        "receivers.http.endpoint": (args.http_endpoint, "--http-endpoint"),
        "exporters.prometheus.endpoint": (args.metrics_endpoint, "--metrics-endpoint"),
        "expectations.file": (args.expectations, "--expectations"),
        "buffer.trace_idle_timeout": (args.trace_idle_timeout, "--trace-idle-timeout"),
        "buffer.session_idle_timeout": (args.session_idle_timeout, "--session-idle-timeout"),
        "durability.data_dir": (getattr(args, "data_dir", None), "--data-dir"),
        "durability.wal": (getattr(args, "wal", None), "--no-wal"),
        "receivers.kafka.bootstrap_servers": (getattr(args, "kafka_bootstrap", None), "--kafka-bootstrap"),
        "exporters.kafka.bootstrap_servers": (getattr(args, "kafka_bootstrap", None), "--kafka-bootstrap"),
        "exporters.kafka.enabled": (
            True if getattr(args, "kafka_bootstrap", None) else None,
            "--kafka-bootstrap",
        ),
        "exporters.kafka.topic": (getattr(args, "kafka_topic", None), "--kafka-topic"),
        "exporters.kafka.spool.directory": (getattr(args, "spool_dir", None), "--spool-dir"),
        "exporters.otel_metrics.otlp.endpoint": (
            getattr(args, "otlp_metrics_endpoint", None),
            "--otlp-metrics-endpoint",
        ),
        "exporters.otel_metrics.enabled": (
            True if getattr(args, "otlp_metrics_endpoint", None) else None,
            "--otlp-metrics-endpoint",
        ),
        "exporters.otel_events.otlp.endpoint": (
            getattr(args, "otlp_metrics_endpoint", None),
            "--otlp-metrics-endpoint",
        ),
        "exporters.otel_events.enabled": (
            True if getattr(args, "otlp_metrics_endpoint", None) else None,
            "--otlp-metrics-endpoint",
        ),
        "receivers.kafka.topic": (getattr(args, "kafka_ingest_topic", None), "--kafka-ingest-topic"),
        "receivers.kafka.enabled": (
            True if getattr(args, "kafka_ingest_topic", None) else None,
            "--kafka-ingest-topic",
        ),
        "receivers.kafka.group_id": (getattr(args, "kafka_ingest_group", None), "--kafka-ingest-group"),
        "receivers.kafka.encoding": (getattr(args, "kafka_ingest_encoding", None), "--kafka-ingest-encoding"),
        "logging.level": (getattr(args, "log_level", None), "--log-level"),
        "logging.format": (getattr(args, "log_format", None), "--log-format"),
        "security.receivers_tls.cert_file": (getattr(args, "tls_cert", None), "--tls-cert"),
        "security.receivers_tls.key_file": (getattr(args, "tls_key", None), "--tls-key"),
        "security.receivers_tls.client_ca_file": (getattr(args, "tls_client_ca", None), "--tls-client-ca"),
        "security.auth.tokens_file": (getattr(args, "auth_tokens", None), "--auth-tokens"),
    }


async def run_until_signalled(service: Service, ready: Callable[[], None] = lambda: None) -> None:
    """The lifespan of a serving process: start `service` (`ready` once it listens), serve until
    SIGTERM or SIGINT, then drain it. A start-up failure (the data dir held by another process, a
    port in use) is a UsageError; `start` has stopped what it started, so nothing is drained."""
    import asyncio
    import logging
    import signal

    from stepwatch.cli import UsageError
    from stepwatch.data_dir import DataDirInUse
    from stepwatch.exporters.spool import SpoolLockedError

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await service.start()
    except (DataDirInUse, SpoolLockedError) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot start: {exc.strerror or exc}") from None
    ready()
    await stop.wait()
    logging.getLogger("stepwatch").info("signal received: draining")
    await service.shutdown()


def run(args: argparse.Namespace) -> int:
    import asyncio
    import gc
    import logging
    import os
    from pathlib import Path

    from stepwatch.cli import UsageError
    from stepwatch.config import ConfigError, load_config
    from stepwatch.evaluator.expectations.store import ExpectationsError
    from stepwatch.event_loop import EventLoopError, loop_factory
    from stepwatch.heap import keep_freed_heap
    from stepwatch.logs import configure as configure_logging
    from stepwatch.security import AuthConfigError, TLSConfigError

    try:
        config = load_config(Path(args.config) if args.config else None, flags=flag_overrides(args))
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if config.durability.data_dir is None:
        # The embedded default keeps its state (write-ahead log, Kafka spool) in a local directory,
        # so a restart of a zero-config `stepwatch serve` loses no accepted span either.
        durability = config.durability.model_copy(update={"data_dir": Path(EMBEDDED_DATA_DIR)})
        config = config.model_copy(update={"durability": durability})
    configure_logging(config.logging)
    try:
        new_loop, loop_name = loop_factory(os.environ)
    except EventLoopError as exc:
        raise UsageError(str(exc)) from None
    logging.getLogger("stepwatch").info("event loop: %s", loop_name)
    gc.set_threshold(*GC_THRESHOLDS)  # the process's, so set by its owner: an embedded Service leaves it
    keep_freed_heap(os.environ)  # likewise

    async def main() -> int:
        from stepwatch.service import Service

        try:
            service = Service(config)
        except (ExpectationsError, TLSConfigError, AuthConfigError) as exc:
            raise UsageError(str(exc)) from None
        await run_until_signalled(service)
        return 0

    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(main())
