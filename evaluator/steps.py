"""Observed steps of a partition (step-accuracy.txt rules 1-2), in execution order.

Rule 1 - what is a step: a non-root span that is a TOOL or AGENT span:
  - OpenInference: `openinference.span.kind` TOOL / AGENT (any other kind is not a step);
  - OTel GenAI: `gen_ai.operation.name` execute_tool (TOOL) / invoke_agent (AGENT), or a
    `gen_ai.tool.name` attribute (TOOL). `create_agent` creates an agent resource; it executes
    nothing, so it is not a step.
  A root is a span with no parent or whose parent is not in the partition. Steps are ordered by
  start time, then span name (the spec's determinism tiebreak); untimed spans follow in document
  order. A trace (decided per trace, also inside a session) with NO such span instead has every
  tool call embedded in its spans' LLM output (OpenInference
  `llm.output_messages.N.message.tool_calls.M.tool_call.function.name`, GenAI
  `gen_ai.output.messages` parts of type `tool_call`) as its own TOOL step, ordered by the LLM
  span's start, then N, then M, among the other traces' steps by that LLM span's order.
Rule 2 - names: TOOL steps use `gen_ai.tool.name`, `tool.name`, else the span name (without the
  GenAI convention's `execute_tool ` prefix: `execute_tool search_kb` is `search_kb`); AGENT steps
  `aip.agent.name`, `gen_ai.agent.name`, `agent.name`, else the span name.

Each step also carries its input/output (JSON strings unwrapped) and `round_id`: the span id of the
LLM output that issued the call (matched by tool call id when both sides carry one, else the latest
earlier LLM output of the same trace that issued an unclaimed call of that name). Steps sharing a
round_id were issued in parallel.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import lru_cache
from operator import itemgetter
from typing import Any, NamedTuple

from .model import Partition, Span, Step, StepKind, new_step, normalise_tool_name
from .partitioning import root_spans

TOOL_NAME_ATTRIBUTES = ("gen_ai.tool.name", "tool.name")
AGENT_NAME_ATTRIBUTES = ("aip.agent.name", "gen_ai.agent.name", "agent.name")
TOOL_CALL_ID_ATTRIBUTES = ("gen_ai.tool.call.id", "tool.call.id")
TOOL_INPUT_ATTRIBUTES = ("gen_ai.tool.call.arguments", "input.value")
TOOL_OUTPUT_ATTRIBUTES = ("gen_ai.tool.call.result", "output.value")
GENAI_OUTPUT_MESSAGES = "gen_ai.output.messages"
STEP_KIND_ATTRIBUTES = ("openinference.span.kind", "gen_ai.operation.name", "gen_ai.tool.name")
STEP_ATTRIBUTES: tuple[str, ...] = (
    *STEP_KIND_ATTRIBUTES,
    *TOOL_NAME_ATTRIBUTES,
    *AGENT_NAME_ATTRIBUTES,
    *TOOL_CALL_ID_ATTRIBUTES,
    *TOOL_INPUT_ATTRIBUTES,
    *TOOL_OUTPUT_ATTRIBUTES,
    GENAI_OUTPUT_MESSAGES,
)
"""Every attribute this module reads by exact key; plus keys under EMBEDDED_CALL_PREFIXES."""
EMBEDDED_CALL_PREFIXES: tuple[str, ...] = ("llm.output_messages.",)

_OI_TOOL_CALL = re.compile(
    r"^llm\.output_messages\.(\d+)\.message\.tool_calls\.(\d+)\.tool_call\."
    r"(function\.name|function\.arguments|id)$"
)
_JSON_START = frozenset('{["-0123456789tfn')


_JSON_LITERALS = frozenset(("true", "false", "null"))
_JSON_SPACE = " \t\n\r"


def unwrap_json(value: Any) -> Any:
    """A string that parses as JSON becomes the parsed value (trajectory-format.txt); else as is.

    Text starting with t/f/n parses only as a bare literal, checked without json.loads (a failed
    parse raises, and free-text tool outputs often start with those letters).
    """
    if isinstance(value, str) and value:
        head = value.lstrip()[:1]
        if head and head in _JSON_START:
            if head in "tfn" and value.strip(_JSON_SPACE) not in _JSON_LITERALS:
                return value
            try:
                return _loads(value)
            except ValueError:
                return value
    return value


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_not_json)
"""RFC 8259 only: Python's NaN/Infinity extension would turn the text "-Infinity" into a float that
prints as null, losing the output."""


def _loads(text: str) -> Any:
    """`json.loads(text)` for a str not starting with a BOM (unwrap_json's heads never do), without
    json.loads' per-call dispatch: the default decoder's raw_decode after leading JSON whitespace,
    and only JSON whitespace after the document; ValueError otherwise."""
    value, end = _DECODER.raw_decode(text, len(text) - len(text.lstrip(_JSON_SPACE)))
    if end != len(text) and text[end:].strip(_JSON_SPACE):
        raise ValueError(f"extra data at {end}")
    return value


def first_attribute(attributes: dict[str, Any], names: Sequence[str]) -> Any:
    for name in names:
        value = attributes.get(name)
        if value is not None:
            return value
    return None


def step_kind(span: Span) -> StepKind | None:
    """TOOL, AGENT or None (not a step) for one span, by the conventions in the module doc."""
    attributes = span.attributes
    kind = attributes.get("openinference.span.kind")
    if kind is not None:
        kind = str(kind).upper()
        if kind == "TOOL" or kind == "AGENT":
            return kind  # type: ignore[return-value]
        return None
    operation = attributes.get("gen_ai.operation.name")
    if operation == "execute_tool":
        return "TOOL"
    if operation == "invoke_agent":
        return "AGENT"
    if "gen_ai.tool.name" in attributes:
        return "TOOL"
    return None


def step_name(span: Span, kind: StepKind) -> str:
    """An empty name attribute reads as absent: the next convention (then the span name) names it."""
    if kind == "TOOL":
        return tool_step_name(span)
    attributes = span.attributes
    for name in AGENT_NAME_ATTRIBUTES:
        value = attributes.get(name)
        if value is not None and value != "":
            return str(value)
    return span.name


def tool_step_name(span: Span) -> str:
    """`step_name(span, "TOOL")` with TOOL_NAME_ATTRIBUTES read inline: it runs for every tool span
    twice (steps and trajectory), and the generic loop costs more than the two lookups."""
    attributes = span.attributes
    value = attributes.get("gen_ai.tool.name")
    if value is None or value == "":  # empty reads as absent (trajectory-format.txt's fallback)
        value = attributes.get("tool.name")
    return str(value) if value is not None and value != "" else bare_tool_name(span.name)


EXECUTE_TOOL_PREFIX = "execute_tool "
"""The OTel GenAI span-name convention for a tool span: `execute_tool {gen_ai.tool.name}`."""


def bare_tool_name(span_name: str) -> str:
    """The invoked tool's bare name from a span name (step-accuracy.txt rule 2: TOOL steps use the
    bare name): `execute_tool search_kb` -> `search_kb`; any other span name as it is."""
    if span_name.startswith(EXECUTE_TOOL_PREFIX) and len(span_name) > len(EXECUTE_TOOL_PREFIX):
        return span_name[len(EXECUTE_TOOL_PREFIX) :]
    return span_name


class EmbeddedCall(NamedTuple):
    """A tool call found in an LLM span's output messages.

    A NamedTuple: one is built per issued call on every partition, and a frozen dataclass costs
    four times as much to build."""

    name: str
    arguments: Any
    call_id: str | None
    message_index: int
    call_index: int


def embedded_tool_calls(span: Span) -> list[EmbeddedCall]:
    """Tool calls an LLM span's output issued, in (message N, call M) order."""
    attributes = span.attributes
    calls: list[EmbeddedCall] = []
    for n, m, name_key, arguments_key, id_key in _oi_tool_call_keys(tuple(attributes)):
        name = attributes[name_key] if name_key is not None else None
        if name:
            call_id = attributes[id_key] if id_key is not None else None
            arguments = attributes[arguments_key] if arguments_key is not None else None
            calls.append(
                EmbeddedCall(str(name), unwrap_json(arguments), str(call_id) if call_id else None, n, m)
            )
    messages = attributes.get(GENAI_OUTPUT_MESSAGES)
    if messages is not None:
        calls.extend(genai_tool_calls(messages))
    return calls


_OiCallKeys = tuple[int, int, str | None, str | None, str | None]
"""(N, M, function.name key, function.arguments key, id key) of one OpenInference tool call."""


@lru_cache(maxsize=1024)
def _oi_tool_call_keys(keys: tuple[str, ...]) -> tuple[_OiCallKeys, ...]:
    """The OpenInference tool calls a span's attribute keys hold, in (N, M) order.

    Cached by the whole key tuple: spans of one instrumentation repeat a handful of key sets, so
    most spans cost one lookup instead of a prefix test (and a regex) per attribute. Two keys for
    the same field (`...0...` and `...00...`): the later one wins, as a scan in key order would.
    """
    found: dict[tuple[int, int], dict[str, str]] = {}
    for key in keys:
        if key.startswith("llm.output_messages.") and "tool_calls" in key:
            match = _OI_TOOL_CALL.match(key)
            if match:
                found.setdefault((int(match[1]), int(match[2])), {})[match[3]] = key
    return tuple(
        (n, m, fields.get("function.name"), fields.get("function.arguments"), fields.get("id"))
        for (n, m), fields in sorted(found.items())
    )


def genai_tool_calls(messages: Any) -> list[EmbeddedCall]:
    """The tool calls of a GenAI `gen_ai.output.messages` value (a JSON string or its parsed list)."""
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except ValueError:
            return []
    if not isinstance(messages, list):
        return []
    calls: list[EmbeddedCall] = []
    for n, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        m = 0
        for part in message.get("parts") or ():
            if isinstance(part, dict) and part.get("type") == "tool_call" and part.get("name"):
                call_id = part.get("id")
                calls.append(
                    EmbeddedCall(
                        str(part["name"]),
                        unwrap_json(part.get("arguments")),
                        str(call_id) if call_id else None,
                        n,
                        m,
                    )
                )
                m += 1
    return calls


def _order(span: Span) -> tuple[int, int, str, int]:
    start = span.start_time_unix_nano
    if start is None:
        return (1, span.seq, span.name, 0)
    return (0, start, span.name, span.seq)


ToolIO = dict[int, tuple[Any, Any]]
"""id(span) -> its unwrapped tool (input, output): filled by `tool_io`, shared by step extraction
and the trajectory so each tool span's JSON is parsed once (the spans must outlive the dict)."""


def tool_io(span: Span, cache: ToolIO | None = None) -> tuple[Any, Any]:
    """A tool span's input and output (TOOL_INPUT/OUTPUT_ATTRIBUTES), JSON strings unwrapped."""
    if cache is not None:
        found = cache.get(id(span))
        if found is not None:
            return found
    attributes = span.attributes  # TOOL_INPUT/OUTPUT_ATTRIBUTES read inline (tool_step_name's reason)
    step_input = attributes.get("gen_ai.tool.call.arguments")
    if step_input is None:
        step_input = attributes.get("input.value")
    step_output = attributes.get("gen_ai.tool.call.result")
    if step_output is None:
        step_output = attributes.get("output.value")
    io = (unwrap_json(step_input), unwrap_json(step_output))
    if cache is not None:
        cache[id(span)] = io
    return io


def extract_steps(partition: Partition, cache: ToolIO | None = None) -> list[Step]:
    """The partition's observed steps (rules 1-2), in execution order."""
    return extract_steps_from_spans(partition.spans, cache)


_Order = tuple[int, int, str, int]


def extract_steps_from_spans(
    spans: Sequence[Span], cache: ToolIO | None = None, roots: Sequence[Span] | None = None
) -> list[Step]:
    """`roots`: `root_spans(spans)` when the caller already has it (it is not computed again).

    One pass over the spans classifies each once: its step kind (non-roots only), the tool calls
    its output issued, and its order key when it is either.
    """
    root_ids = {id(span) for span in (root_spans(spans) if roots is None else roots)}
    step_spans: list[tuple[_Order, Span, StepKind]] = []
    llm_calls: list[tuple[_Order, Span, list[EmbeddedCall]]] = []
    for span in spans:
        kind = None if id(span) in root_ids else step_kind(span)
        calls = embedded_tool_calls(span)
        if kind is None and not calls:
            continue
        order = _order(span)
        if kind is not None:
            step_spans.append((order, span, kind))
        if calls:
            llm_calls.append((order, span, calls))
    llm_calls.sort(key=_first)
    if not step_spans:
        return [step for _, step in _embedded_steps(llm_calls)]
    embedded_only: list[tuple[_Order, Span, list[EmbeddedCall]]] = []
    if llm_calls:  # rule 1 per trace: a session's trace without TOOL/AGENT spans has its calls
        step_traces = {span.trace_id for _, span, _ in step_spans}
        embedded_only = [item for item in llm_calls if item[1].trace_id not in step_traces]
        if embedded_only:
            llm_calls = [item for item in llm_calls if item[1].trace_id in step_traces]
    step_spans.sort(key=_first)
    rounds = _RoundMatcher(llm_calls)
    steps: list[Step] = []
    for order, span, kind in step_spans:
        if kind == "TOOL":
            name = tool_step_name(span)
            step_input, step_output = tool_io(span, cache)
            round_id = rounds.claim(span, name, order)
        else:
            name = step_name(span, kind)
            attributes = span.attributes
            step_input = unwrap_json(attributes.get("input.value"))
            step_output = unwrap_json(attributes.get("output.value"))
            round_id = None
        steps.append(
            new_step(
                name,
                kind,
                span.trace_id,
                span.span_id,
                span.start_time_unix_nano,
                step_input,
                step_output,
                round_id,
            )
        )
    if not embedded_only:
        return steps
    ordered = [(order, step) for (order, _, _), step in zip(step_spans, steps, strict=True)]
    ordered.extend(_embedded_steps(embedded_only))
    ordered.sort(key=_first)  # stable: a span's calls keep their (N, M) order
    return [step for _, step in ordered]


def _embedded_steps(llm_calls: list[tuple[_Order, Span, list[EmbeddedCall]]]) -> list[tuple[_Order, Step]]:
    """Each embedded call as a TOOL step (its round: the LLM span that issued it), with the issuing
    span's order key; `llm_calls` in order."""
    return [
        (
            order,
            new_step(
                call.name,
                "TOOL",
                span.trace_id,
                span.span_id,
                span.start_time_unix_nano,
                call.arguments,
                None,
                span.span_id,
            ),
        )
        for order, span, calls in llm_calls
        for call in calls
    ]


_first = itemgetter(0)
"""The order key of a (order, span, ...) item: itemgetter, no Python call per item sorted."""


class _RoundMatcher:
    """Pairs each TOOL span with the LLM output call that issued it; each call is claimed once."""

    def __init__(self, llm_calls: list[tuple[tuple[int, int, str, int], Span, list[EmbeddedCall]]]):
        self._by_id: dict[str, str] = {}
        self._open: list[tuple[tuple[int, int, str, int], str, str, list[str]]] = []
        for order, span, calls in llm_calls:
            for call in calls:
                if call.call_id:
                    self._by_id[call.call_id] = span.span_id
            names = [normalise_tool_name(call.name) for call in calls]
            self._open.append((order, span.trace_id, span.span_id, names))

    def claim(self, span: Span, name: str, order: tuple[int, int, str, int]) -> str | None:
        """The issuing LLM span's id, or None. Runs once per TOOL step: TOOL_CALL_ID_ATTRIBUTES are
        read inline and the scan tests the name first (most entries fail there, cheapest test)."""
        if self._by_id:
            attributes = span.attributes
            call_id = attributes.get("gen_ai.tool.call.id")
            if call_id is None:
                call_id = attributes.get("tool.call.id")
            if call_id is not None:
                llm_span_id = self._by_id.get(str(call_id))
                if llm_span_id is not None:
                    self._take(llm_span_id, normalise_tool_name(name))
                    return llm_span_id
        wanted = normalise_tool_name(name)
        trace_id = span.trace_id
        for llm_order, llm_trace_id, llm_span_id, names in reversed(self._open):
            if wanted in names and llm_order < order and llm_trace_id == trace_id:
                names.remove(wanted)
                return llm_span_id
        return None

    def _take(self, llm_span_id: str, wanted: str) -> None:
        for _, _, span_id, names in self._open:
            if span_id == llm_span_id and wanted in names:
                names.remove(wanted)
                return
