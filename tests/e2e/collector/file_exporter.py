"""What a Collector's file exporter (format `json`) wrote: OTLP/JSON lines read back as the protobuf
messages, so tests check metrics and log records with the same types Stepwatch sent."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.logs.v1.logs_pb2 import LogsData
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from sdk_agent import decode_attributes

_HEX_IDS = frozenset({"traceId", "spanId", "parentSpanId"})


def _otlp_json_ids(value: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex; protobuf's JSON parser expects base64 bytes."""
    if isinstance(value, dict):
        return {
            k: base64.b64encode(bytes.fromhex(v)).decode() if k in _HEX_IDS and v else _otlp_json_ids(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_otlp_json_ids(v) for v in value]
    return value


def read_output(path: Path) -> tuple[list[MetricsData], list[LogsData]]:
    """(metric export requests, log export requests) the file exporter wrote, in order."""
    metrics: list[MetricsData] = []
    logs: list[LogsData] = []
    if not path.exists():
        return metrics, logs
    for line in path.read_text().splitlines():
        doc = _otlp_json_ids(json.loads(line))
        if "resourceMetrics" in doc:
            metrics.append(json_format.ParseDict(doc, MetricsData()))
        elif "resourceLogs" in doc:
            logs.append(json_format.ParseDict(doc, LogsData()))
    return metrics, logs


def log_records(logs: list[LogsData]) -> list[tuple[Any, dict[str, Any], dict[str, Any]]]:
    """(log record, its attributes, its resource attributes) of every record received."""
    return [
        (rec, decode_attributes(rec.attributes), decode_attributes(rl.resource.attributes))
        for data in logs
        for rl in data.resource_logs
        for sl in rl.scope_logs
        for rec in sl.log_records
    ]
