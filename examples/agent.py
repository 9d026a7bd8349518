#!/usr/bin/env python3
"""A toy agent instrumented with the real OpenTelemetry SDK, exporting OTLP to `stepwatch serve`.

It sends three kinds of traffic for the tasks in examples/expectations.yaml:
  1. refund-order on plan   (lookup_order, check_fraud, check_policy, issue_refund)  -> score 1.0
  2. refund-order off plan  (issue_refund before lookup_order, checks skipped)     -> low score
  3. support-chat session   (two traces, one per user turn, sharing session.id)     -> one session score

    python examples/agent.py --endpoint localhost:4317            # OTLP/gRPC
    python examples/agent.py --protocol http --endpoint localhost:4318
    OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf \
        python examples/agent.py                                  # the standard SDK variables

Flags win over the SDK's variables (`OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT` and `..._PROTOCOL`,
resolved as the OpenTelemetry specification says), which win over the defaults.

Spans follow OpenInference: the root is an AGENT span carrying `aip.task.key`; each step is a
TOOL span with `tool.name`.
"""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import Mapping, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Tracer

Step = str | list[str]


PROTOCOLS = {"grpc": "grpc", "http/protobuf": "http"}
"""OTEL_EXPORTER_OTLP_PROTOCOL values this agent can send, by its `--protocol` name (the Python
SDK has no http/json trace exporter)."""
DEFAULT_ENDPOINTS = {"grpc": "localhost:4317", "http": "localhost:4318"}


def resolve_target(protocol: str | None, endpoint: str | None, environ: Mapping[str, str]) -> tuple[str, str]:
    """(protocol, endpoint) from the flags, else the SDK's variables, else the defaults.

    The README tells users to set OTEL_EXPORTER_OTLP_ENDPOINT: an agent that ignored it would send
    to the default port while the user's Stepwatch listens elsewhere. As the specification says, the
    signal-specific variables win, and a base OTEL_EXPORTER_OTLP_ENDPOINT gets `/v1/traces`
    appended for OTLP/HTTP (a TRACES one is used as is). Raises ValueError for a protocol the agent
    cannot send."""
    if protocol is None:
        name = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
        if not environ.get(name):
            name = "OTEL_EXPORTER_OTLP_PROTOCOL"
        value = environ.get(name, "").strip()
        if value and value not in PROTOCOLS:
            raise ValueError(f"{name}={value!r}: expected one of {', '.join(PROTOCOLS)}")
        protocol = PROTOCOLS[value] if value else "grpc"
    if endpoint is not None:
        return protocol, endpoint
    traces = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return protocol, traces
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base and protocol == "http":
        return protocol, base.rstrip("/") + "/v1/traces"
    return protocol, base or DEFAULT_ENDPOINTS[protocol]


def make_exporter(protocol: str, endpoint: str) -> SpanExporter:
    """`endpoint`: HOST:PORT (plain text), or a URL (`https://` for TLS; for OTLP/HTTP the
    full URL of the traces path, `http://host:4318/v1/traces`)."""
    url = endpoint if "://" in endpoint else None
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        insecure = url is None or url.startswith("http://")
        return GrpcExporter(endpoint=endpoint, insecure=insecure, timeout=10)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=url or f"http://{endpoint}/v1/traces", timeout=10)


def run_task(
    tracer: Tracer,
    task_key: str,
    steps: Sequence[Step],
    *,
    session_id: str | None = None,
    expected_steps_annotation: str | None = None,
    agent: str = "support-agent",
) -> str:
    """One agent run: a root AGENT span and one TOOL span per step (a group runs 'in parallel').

    Returns the trace id (hex).
    """
    common = {"session.id": session_id} if session_id else {}
    root_attributes = {"openinference.span.kind": "AGENT", "aip.task.key": task_key, **common}
    if expected_steps_annotation is not None:
        root_attributes["aip.eval.expected_steps"] = expected_steps_annotation
    with tracer.start_as_current_span(agent, attributes=root_attributes) as root:
        for step in steps:
            for tool in [step] if isinstance(step, str) else step:
                with tracer.start_as_current_span(
                    tool,
                    attributes={
                        "openinference.span.kind": "TOOL",
                        "tool.name": tool,
                        "input.value": '{"order_id": "A-1"}',
                        "output.value": "ok",
                        **common,
                    },
                ):
                    pass
        return format(root.get_span_context().trace_id, "032x")


def send(
    protocol: str, endpoint: str, runs: Sequence[dict[str, object]], service: str = "example-agent"
) -> list[str]:
    """Send each run (kwargs of `run_task`) as its own trace; flush before returning."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(make_exporter(protocol, endpoint)))
    tracer = provider.get_tracer("stepwatch.examples.agent")
    try:
        return [run_task(tracer, **run) for run in runs]  # type: ignore[arg-type]
    finally:
        provider.force_flush()
        provider.shutdown()


def demo_runs() -> list[dict[str, object]]:
    session = f"chat-{uuid.uuid4().hex[:8]}"
    return [
        {
            "task_key": "refund-order",
            "steps": ["lookup_order", ["check_fraud", "check_policy"], "issue_refund"],
        },
        {"task_key": "refund-order", "steps": ["issue_refund", "lookup_order"]},
        {"task_key": "support-chat", "steps": ["greet", "lookup_order"], "session_id": session},
        {"task_key": "support-chat", "steps": ["issue_refund", "close_ticket"], "session_id": session},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--protocol",
        choices=("grpc", "http"),
        help="default: from OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL (grpc, http/protobuf), else grpc",
    )
    parser.add_argument(
        "--endpoint",
        help="HOST:PORT or URL (default: OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, else localhost:4317 "
        "for grpc, localhost:4318 for http)",
    )
    args = parser.parse_args()
    try:
        protocol, endpoint = resolve_target(args.protocol, args.endpoint, os.environ)
    except ValueError as exc:
        parser.error(str(exc))  # one line, exit 2
    trace_ids = send(protocol, endpoint, demo_runs())
    print(f"sent {len(trace_ids)} traces over OTLP/{protocol} to {endpoint}: {', '.join(trace_ids)}")


if __name__ == "__main__":
    main()
