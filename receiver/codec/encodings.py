"""OTLP trace payload encodings by name: the Collector's Kafka `encoding` values."""

from __future__ import annotations

from typing import Literal

Encoding = Literal["otlp_proto", "otlp_json"]
