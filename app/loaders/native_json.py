"""Native trajectory JSON (`{"steps": [...], "final_output": "..."}`) -> canonical Spans.

A native trajectory is represented as spans so that ONE code path (partition -> steps ->
trajectory -> scorers) scores every input format:

- a synthetic root span named `trajectory` (OpenInference kind AGENT) carrying
  `output.value = final_output` when the trajectory has one, so it becomes the final answer;
- one child span per step, in order: openinference.span.kind TOOL, `tool.name`, and
  `input.value` / `output.value` holding the step's input/output JSON-encoded. Encoding always
  (even a plain string) makes the trajectory builder's JSON-string unwrapping give back exactly the
  value that was written.

A native file carries no times, so the spans carry none either: order is document order (`seq`),
which the step and trajectory builders honour for spans without timestamps, and latency is
unknown (None) rather than made up. Ids are derived from a hash of the document, so the same file
always yields the same trace id.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from stepwatch.evaluator.model import Span
from stepwatch.receiver.codec.decoded import DecodeError

ROOT_SPAN_NAME = "trajectory"


def decode_native(document: Any, source: str = "") -> list[Span]:
    """Spans for a parsed native trajectory; DecodeError names the offending field."""
    if not isinstance(document, dict) or "steps" not in document:
        raise DecodeError("a native trajectory must be an object with a `steps` array")
    steps = document["steps"]
    if not isinstance(steps, list):
        raise DecodeError(f"`steps` must be an array, got {type(steps).__name__}")
    final_output = document.get("final_output")
    if "final_output" in document and not isinstance(final_output, str):  # null included: when present
        kind = "null" if final_output is None else type(final_output).__name__  # it MUST be a string
        raise DecodeError(f"`final_output` must be a string, got {kind}")
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            raise DecodeError(f"steps[{i}] must be an object, got {type(step).__name__}")
        tool = step.get("tool")
        if not isinstance(tool, str) or not tool:
            raise DecodeError(f"steps[{i}].tool must be a non-empty string")

    digest = hashlib.sha256(
        (source + "\0" + json.dumps(document, sort_keys=True, default=str)).encode()
    ).hexdigest()
    trace_id = digest[:32]
    root_id = digest[32:48]
    root_attributes: dict[str, Any] = {"openinference.span.kind": "AGENT"}
    if final_output is not None:
        root_attributes["output.value"] = final_output
    spans = [Span(trace_id=trace_id, span_id=root_id, name=ROOT_SPAN_NAME, attributes=root_attributes, seq=0)]
    for i, step in enumerate(steps, start=1):
        attributes: dict[str, Any] = {"openinference.span.kind": "TOOL", "tool.name": step["tool"]}
        if "input" in step:
            attributes["input.value"] = json.dumps(step["input"])
        if "output" in step:
            attributes["output.value"] = json.dumps(step["output"])
        spans.append(
            Span(
                trace_id=trace_id,
                span_id=_child_id(root_id, i),
                parent_span_id=root_id,
                name=step["tool"],
                attributes=attributes,
                seq=i,
            )
        )
    return spans


def _child_id(root_id: str, i: int) -> str:
    return hashlib.sha256(f"{root_id}:{i}".encode()).hexdigest()[:16]
