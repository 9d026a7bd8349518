"""Input and scoring limits: each one trips at its configured value, is counted, and keeps the
valid remainder (trimmed spans, the first N spans, a not_scored reason instead of a stall)."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from stepwatch.config import ConfigError, load_config
from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.model import Span, Step
from stepwatch.evaluator.scorers.step_accuracy import step_accuracy
from stepwatch.security.config import LimitsConfig
from stepwatch.security.limits import (
    LIMIT_NAMES,
    TRUNCATION_MARK,
    LimitCounters,
    LimitExceeded,
    PrometheusLimitMeter,
    apply_span_limits,
    check_expectation,
    json_depth_exceeds,
    read_bounded,
    scoring_guard,
)


def span(i: int, attributes: dict | None = None) -> Span:
    return Span(trace_id="ab" * 16, span_id=f"{i + 1:016x}", name=f"s{i}", attributes=attributes or {}, seq=i)


def test_spans_over_the_request_cap_are_rejected_and_the_first_ones_kept():
    meter = LimitCounters()
    result = apply_span_limits([span(i) for i in range(7)], LimitsConfig(max_spans_per_request=5), meter)
    assert [s.name for s in result.spans] == ["s0", "s1", "s2", "s3", "s4"]
    assert result.rejected == 2
    assert meter.counts == {"spans_per_request": 2}
    assert "2 spans over the per-request limit" in result.message


def test_excess_attributes_are_dropped_and_long_values_truncated_not_rejected():
    meter = LimitCounters()
    limits = LimitsConfig(max_attributes_per_span=3, max_attribute_value_length=10)
    attrs = {"a": "x" * 25, "b": ["short", "y" * 11], "c": {"nested": "z" * 12}, "d": 1, "e": 2}
    result = apply_span_limits([span(0, attrs), span(1, {"ok": "fine"})], limits, meter)
    trimmed = result.spans[0].attributes
    assert list(trimmed) == ["a", "b", "c"]
    assert trimmed["a"] == "x" * 10 + TRUNCATION_MARK
    assert trimmed["b"] == ["short", "y" * 10 + TRUNCATION_MARK]
    assert trimmed["c"] == {"nested": "z" * 10 + TRUNCATION_MARK}
    assert result.rejected == 0
    assert (result.dropped_attributes, result.truncated_values) == (2, 3)
    assert meter.counts == {"attributes_per_span": 2, "attribute_value_length": 3}
    assert result.spans[1] is not None and result.spans[1].attributes == {"ok": "fine"}


def test_untouched_spans_are_passed_through_unchanged():
    spans = [span(i, {"k": "v"}) for i in range(3)]
    result = apply_span_limits(spans, LimitsConfig(), LimitCounters())
    assert all(a is b for a, b in zip(result.spans, spans, strict=True))
    assert result.message == ""


def test_json_depth_is_scanned_not_parsed():
    hostile = "[" * 100_000 + "]" * 100_000  # json.loads would raise RecursionError
    assert json_depth_exceeds(hostile, 32)
    assert not json_depth_exceeds('{"a": [1, {"b": "[[[[["}]}', 3)  # brackets inside strings do not count
    assert not json_depth_exceeds('"[[[[\\"[["', 1)
    assert json_depth_exceeds("[[[]]]", 2) and not json_depth_exceeds("[[[]]]", 3)


def test_expectations_file_size_is_checked_on_the_bytes_read(tmp_path):
    path = tmp_path / "expectations.yaml"
    path.write_bytes(b"x" * 1000)
    meter = LimitCounters()
    assert read_bounded(path, 1000, meter) == b"x" * 1000
    with pytest.raises(LimitExceeded, match="expectations_file_size"):
        read_bounded(path, 999, meter)
    assert meter.counts == {"expectations_file_size": 1}


def test_expectation_group_and_step_caps():
    meter = LimitCounters()
    limits = LimitsConfig(max_group_size=3, max_expected_steps=6)
    check_expectation("ok", Expectation(expected_steps=["a", ["b", "c", "d"], "e"]), limits, meter)
    with pytest.raises(LimitExceeded, match=r"expected_steps\[1\] has 4 members"):
        check_expectation("t", Expectation(expected_steps=["a", ["b", "c", "d", "e"]]), limits, meter)
    with pytest.raises(LimitExceeded, match="7 expected steps"):
        check_expectation("t", Expectation(expected_steps=list("abcdefg")), limits, meter)
    assert meter.counts == {"group_size": 1, "expected_steps": 1}


def test_scoring_guard_bounds_the_alignment_before_it_starts():
    meter = LimitCounters()
    limits = LimitsConfig(max_steps_per_partition=100, max_dp_cells=1_000)
    assert scoring_guard(50, ["a"] * 10, limits, meter) is None
    assert "steps_per_partition" in (scoring_guard(101, ["a"], limits, meter) or "")
    assert "dp_cells" in (scoring_guard(99, ["a"] * 10, limits, meter) or "")
    assert meter.counts == {"steps_per_partition": 1, "dp_cells": 1}


def test_default_guard_keeps_a_pathological_partition_fast():
    """At the default caps the worst admitted alignment (all groups, max steps) finishes quickly."""
    limits = LimitsConfig()
    expected = [
        [f"t{i}", f"u{i}"] for i in range(limits.max_dp_cells // (limits.max_steps_per_partition + 1) - 1)
    ]
    observed = [Step(name=f"t{i % 7}", kind="TOOL") for i in range(limits.max_steps_per_partition)]
    assert scoring_guard(len(observed), expected, limits, LimitCounters()) is None
    started = time.perf_counter()
    score, _ = step_accuracy(observed, expected)
    assert 0.0 <= score <= 1.0
    assert time.perf_counter() - started < 10.0


def test_prometheus_meter_exposes_every_limit_label():
    registry = CollectorRegistry()
    meter = PrometheusLimitMeter(registry)
    meter.exceeded("json_depth", 2)
    text = generate_latest(registry).decode()
    assert 'stepwatch_limits_exceeded_total{limit="json_depth"} 2.0' in text
    for name in LIMIT_NAMES:
        assert f'limit="{name}"' in text


@pytest.mark.parametrize("key", ["max_spans_per_trace", "max_traces_per_session"])
def test_partition_size_limits_live_under_buffer_and_the_old_key_names_the_new_one(tmp_path, key):
    """One key per limit: an earlier release's security.limits copy is refused with where it went."""
    path = tmp_path / "stepwatch.yaml"
    path.write_text(f"security:\n  limits:\n    {key}: 5\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert f"security.limits.{key} (from {path}): moved to buffer.{key}" in str(info.value)
    variable = f"STEPWATCH_SECURITY__LIMITS__{key.upper()}"
    with pytest.raises(ConfigError, match=f"from {variable}\\): moved to buffer.{key}"):
        load_config(None, environ={variable: "5"})
    config = load_config(None, environ={f"STEPWATCH_BUFFER__{key.upper()}": "5"})
    assert getattr(config.buffer, key) == 5
    assert key not in config.security.limits.model_dump()


@pytest.mark.parametrize(
    ("key", "new"),
    [
        ("max_message_bytes", "receivers.grpc.max_recv_message_bytes"),
        ("max_http_body_bytes", "receivers.http.max_body_bytes"),
    ],
)
def test_request_size_limits_live_under_the_receivers_and_the_old_key_names_the_new_one(tmp_path, key, new):
    """One key per limit: the security.limits copy of a receiver's size cap is refused."""
    path = tmp_path / "stepwatch.yaml"
    path.write_text(f"security:\n  limits:\n    {key}: 65536\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert f"security.limits.{key} (from {path}): moved to {new}" in str(info.value)
    variable = f"STEPWATCH_SECURITY__LIMITS__{key.upper()}"
    with pytest.raises(ConfigError, match=f"from {variable}\\): moved to {new}"):
        load_config(None, environ={variable: "65536"})
    section, receiver, field = new.split(".")
    config = load_config(
        None, environ={f"STEPWATCH_{section.upper()}__{receiver.upper()}__{field.upper()}": "65536"}
    )
    assert getattr(getattr(config.receivers, receiver), field) == 65536


# -- limits must not silently change what a trace means ------------------------------------------


def _scored(spans: list[Span], expectation: Expectation) -> tuple[object, dict[str, object]]:
    """The spans limited as serve limits them at close time, then scored by the default scorers."""
    from stepwatch.evaluator.partitioning import build_partition
    from stepwatch.evaluator.pipeline import build_scoring_input, run_sync_scorers
    from stepwatch.evaluator.scorers.registry import ScorerRegistry
    from stepwatch.receiver.codec.records import limit_spans

    limited = limit_spans(spans, LimitsConfig(), LimitCounters())
    inp = build_scoring_input(build_partition("trace", "ab" * 16, limited), expectation)
    results = run_sync_scorers(inp, ScorerRegistry.builtin().scorers_for(expectation))
    return inp, {r.metric: r for r in results}


ROOT = Span(
    trace_id="ab" * 16, span_id="1" * 16, name="agent", attributes={"openinference.span.kind": "AGENT"}
)


def _child(span_id: str, name: str, attributes: dict) -> Span:
    return Span(
        trace_id="ab" * 16, span_id=span_id * 16, parent_span_id="1" * 16, name=name, attributes=attributes
    )


def test_limits_must_not_silently_change_what_a_trace_means_attributes_per_span():
    """An LLM span with more than max_attributes_per_span (128) attributes (a long conversation)
    keeps its token counts and embedded tool calls: the scoring attributes are read before the cap
    applies to the rest. Nothing scoring reads was cut, so no result is marked `limited`."""
    import json

    attributes: dict[str, object] = {
        f"llm.input_messages.{i}.message.content": f"turn {i}" for i in range(200)
    }
    attributes |= {
        "openinference.span.kind": "LLM",
        "llm.token_count.prompt": 1200,
        "llm.token_count.completion": 40,
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "issue_refund",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": json.dumps({"amount": 42}),
    }
    meter = LimitCounters()
    [_, llm] = apply_span_limits([ROOT, _child("2", "llm", attributes)], LimitsConfig(), meter).spans
    assert len(llm.attributes) == 128 and meter.counts["attributes_per_span"] == 205 - 128
    inp, results = _scored(
        [ROOT, _child("2", "llm", attributes)], Expectation(expected_steps=["issue_refund"])
    )
    assert (inp.trajectory.token_usage.input_tokens, inp.trajectory.token_usage.output_tokens) == (1200, 40)
    assert [(s.name, s.input) for s in inp.steps] == [("issue_refund", {"amount": 42})]
    assert results["agent.step_accuracy"].score == 1.0
    assert all("limited" not in r.metadata for r in results.values())


def test_limits_must_not_silently_change_what_a_trace_means_value_length():
    """A JSON tool input over max_attribute_value_length keeps its fields: the strings inside it are
    truncated, not the text, so a rule on `amount` still holds. The field that was cut marks every
    result `limited`, and a rule reading it says the value was truncated."""
    import json

    notes = "n" * 9000 + " refund approved"
    tool = _child(
        "2",
        "execute_tool issue_refund",
        {
            "gen_ai.tool.name": "issue_refund",
            "gen_ai.tool.call.arguments": json.dumps({"notes": notes, "amount": 42}),
        },
    )
    rules = [
        {"must_call": "issue_refund", "with": {"amount": {"equals": 42}}},
        {"must_call": "issue_refund", "with": {"notes": {"contains": "approved"}}},
    ]
    inp, results = _scored([ROOT, tool], Expectation(rules=rules))
    [step] = inp.trajectory.steps
    assert step.input["amount"] == 42 and step.input["notes"] == "n" * 8192 + TRUNCATION_MARK
    outcomes = results["trajectory"].metadata["rules"]
    assert outcomes[0]["passed"] is True  # was: "input has no field 'amount'"
    assert outcomes[1]["passed"] is False
    assert outcomes[1]["reason"].endswith(
        "'notes' does not contain 'approved' (the value was truncated at security.limits.max_attribute_value_length)"
    )
    assert {tuple(r.metadata.get("limited", ())) for r in results.values()} == {("attribute_value_length",)}

    # not JSON: truncated whole, and the rule says the input was cut before it could be read
    text = _child("2", "pay", {"gen_ai.tool.name": "pay", "gen_ai.tool.call.arguments": "x" * 9000})
    _, results = _scored(
        [ROOT, text], Expectation(rules=[{"must_call": "pay", "with": {"amount": {"equals": 1}}}])
    )
    assert (
        results["trajectory"]
        .metadata["rules"][0]["reason"]
        .endswith(
            "input has no field 'amount' (the input was truncated at security.limits.max_attribute_value_length)"
        )
    )
    assert results["trajectory"].metadata["limited"] == ["attribute_value_length"]


def test_limits_on_values_scoring_does_not_read_mark_nothing():
    """An LLM span's long prompt and response (input.value / output.value on a span that is no step
    and no root) are cut as before, without marking the partition: scoring never reads them."""
    llm = _child(
        "2", "llm", {"openinference.span.kind": "LLM", "input.value": "p" * 9000, "output.value": "o" * 9000}
    )
    inp, results = _scored([ROOT, llm], Expectation())
    assert inp.partition.spans[1].attributes["input.value"].endswith(TRUNCATION_MARK)
    assert "limited" not in inp.extras and all("limited" not in r.metadata for r in results.values())


def test_a_json_value_nested_too_deep_for_scoring_marks_json_depth():
    deep = "[" * 40 + "]" * 40
    tool = _child(
        "2", "lookup", {"tool.name": "lookup", "openinference.span.kind": "TOOL", "input.value": deep}
    )
    inp, results = _scored([ROOT, tool], Expectation())
    assert inp.steps[0].input == "(json_depth limit: value nested too deeply, not unwrapped)"
    assert results["trajectory.step_count"].metadata["limited"] == ["json_depth"]
