"""Privacy (redaction at ingest, content withheld from events, secrets out of logs) and the tenant
seams (partition keys, per-tenant expectations without fallback, labels only when tenancy is on)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from stepwatch.evaluator.content import has_content, strip_content
from stepwatch.evaluator.model import Span
from stepwatch.evaluator.results import ScoreResult
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.exporters.base import Capabilities, InMemoryScoreExporter, capabilities_of
from stepwatch.exporters.private_sink import PrivateSink
from stepwatch.exporters.prometheus import PrometheusExporter
from stepwatch.security.config import (
    PrivacyConfig,
    SecurityConfig,
    TenancyConfig,
    TenantConfig,
    TLSServerConfig,
)
from stepwatch.security.redaction import (
    REDACTED,
    Redactor,
    SecretsLogFilter,
    scrub_secrets,
)
from stepwatch.security.tenants import DEFAULT_TENANT, PerTenant, Tenant, TenantPolicy


def test_redaction_replaces_listed_keys_and_prefixes_in_span_and_resource_attributes():
    redactor = Redactor(["user.email", "gen_ai.prompt*"])
    span = Span(
        trace_id="ab" * 16,
        span_id="cd" * 8,
        name="llm",
        attributes={"user.email": "a@b.c", "gen_ai.prompt.0.content": "hi", "gen_ai.system": "openai"},
        resource_attributes={"user.email": "x@y.z"},
    )
    out = redactor.redact_span(span)
    assert out.attributes == {
        "user.email": REDACTED,
        "gen_ai.prompt.0.content": REDACTED,
        "gen_ai.system": "openai",
    }
    assert out.resource_attributes == {"user.email": REDACTED}
    clean = span.model_copy(update={"attributes": {"gen_ai.system": "openai"}, "resource_attributes": {}})
    assert redactor.redact_span(clean) is clean
    assert Redactor([]).redact_spans([span]) == [span]


def test_content_is_stripped_from_score_metadata_unless_allowed():
    metadata = {
        "steps": [{"op": "match", "expected": "search", "input": {"q": "secret"}, "output": "42"}],
        "final_answer": "the answer",
        "edit_distance": 1,
    }
    assert strip_content(metadata, include_content=False) == {
        "steps": [{"op": "match", "expected": "search"}],
        "edit_distance": 1,
    }
    assert strip_content(metadata, include_content=True) is metadata


def test_content_inside_tuples_is_stripped_too():
    """Scorer metadata may hold tuples (e.g. alignment pairs); content there must not leak."""
    metadata = {"pairs": ({"expected": "a", "input": {"card": "4111"}}, ({"output": "secret"},))}
    assert has_content(metadata)
    assert strip_content(metadata, include_content=False) == {"pairs": [{"expected": "a"}, [{}]]}


def test_credentials_are_masked_in_log_records(caplog):
    logger = logging.getLogger("stepwatch.test.secrets")
    logger.addFilter(SecretsLogFilter())
    with caplog.at_level(logging.INFO, logger="stepwatch.test.secrets"):
        logger.info("headers: %s", {"authorization": "Bearer abc.def-123"})
    assert "abc.def-123" not in caplog.text
    assert "Bearer [REDACTED]" in caplog.text
    assert scrub_secrets("Basic dXNlcjpwdw==") == "Basic [REDACTED]"


def test_per_tenant_values_never_fall_back_to_another_tenant():
    stores = PerTenant({"team-a": {"task": "A's expectation"}})
    assert stores.get(Tenant("team-a")) == {"task": "A's expectation"}
    assert stores.get(Tenant("team-b")) is None
    assert stores.get(DEFAULT_TENANT) is None


def test_tenant_policy_labels_privacy_and_expectation_files():
    off = TenantPolicy(SecurityConfig(), default_expectations_file=Path("exp.yaml"))
    assert off.metric_labels(DEFAULT_TENANT) == {}
    assert off.expectations_files() == {"default": Path("exp.yaml")}

    cfg = SecurityConfig(
        privacy=PrivacyConfig(include_content=False),
        tenancy=TenancyConfig(
            enabled=True,
            tenants={
                "team-a": TenantConfig(
                    expectations_file=Path("a.yaml"), privacy=PrivacyConfig(include_content=True)
                ),
                "team-b": TenantConfig(expectations_file=Path("b.yaml")),
            },
        ),
    )
    on = TenantPolicy(cfg, default_expectations_file=Path("exp.yaml"))
    assert on.metric_labels(Tenant("team-a")) == {"tenant": "team-a"}
    assert on.privacy(Tenant("team-a")).include_content is True
    assert on.privacy(Tenant("team-b")).include_content is False
    assert on.expectations_files() == {
        "default": Path("exp.yaml"),
        "team-a": Path("a.yaml"),
        "team-b": Path("b.yaml"),
    }


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"receivers_tls": {"cert_file": "c.pem"}}, "cert_file and key_file must be set together"),
        ({"receivers_tls": {"client_ca_file": "ca.pem"}}, "client_ca_file"),
        ({"receivers_tls": {"cert_file": "c", "key_file": "k", "min_version": "1.1"}}, "min_version"),
        ({"tenancy": {"tenants": {"bad name!": {}}}}, "tenant name"),
        ({"limits": {"max_spans_per_request": 0}}, "max_spans_per_request"),
        ({"auth": {"token_file": "t.yaml"}}, "token_file"),
    ],
)
def test_bad_security_config_names_the_key(data, message):
    with pytest.raises(ValidationError, match=message):
        SecurityConfig.model_validate(data)


def test_defaults_are_valid_and_conservative():
    cfg = SecurityConfig()
    assert not cfg.receivers_tls.enabled and not cfg.tenancy.enabled
    assert cfg.privacy.include_content is False
    assert TLSServerConfig().min_version == "1.2"


def _scores_with_content(tenant: str) -> PartitionScores:
    content = ScoreResult(
        metric="agent.step_accuracy",
        score=1.0,
        metadata={"steps": [{"op": "match", "input": {"q": "secret"}}], "edit_distance": 0},
    )
    clean = ScoreResult(metric="trajectory", score=1.0, metadata={"violations": [{"rule": "must_call"}]})
    return PartitionScores(
        partition_type="trace",
        partition_id=tenant,
        revision=0,
        close_reason="idle",
        task_key="t",
        registered=True,
        session_id=None,
        trace_ids=(),
        span_count=1,
        results=(content, clean),
        attributes={"tenant": tenant},
    )


class _ContentFreeSink(InMemoryScoreExporter):
    capabilities = Capabilities(carries_content=False)


async def test_a_content_free_sink_skips_the_strip_while_a_content_sink_still_strips():
    """Prometheus declares it carries no content, so it gets the events untouched (nothing of the
    metadata reaches /metrics); any other sink still gets content stripped unless its tenant allows it."""
    assert not capabilities_of(PrometheusExporter(10, lambda key: True)).carries_content
    assert capabilities_of(InMemoryScoreExporter()).carries_content  # undeclared: assumed to carry content
    events = [_scores_with_content("a"), _scores_with_content("open")]
    allow = {"open"}.__contains__
    calls: list[str] = []

    def spy(tenant: str) -> bool:
        calls.append(tenant)
        return allow(tenant)

    free, full = PrivateSink(_ContentFreeSink(), spy), PrivateSink(InMemoryScoreExporter(), allow)
    await free.export(events)
    await full.export(events)
    assert not calls and not free.capabilities.carries_content
    assert all(got is sent for got, sent in zip(free.inner.events, events, strict=True))
    stripped, allowed = full.inner.events
    assert stripped.results[0].metadata == {"steps": [{"op": "match"}], "edit_distance": 0}
    assert stripped.results[1] is events[0].results[1]  # nothing to strip: not copied
    assert allowed is events[1]
    assert events[0].results[0].metadata["steps"][0]["input"] == {"q": "secret"}  # the original is intact


def test_strip_content_returns_metadata_without_content_as_is():
    metadata = {"steps": [{"op": "match", "expected": "search"}], "scores": [[1, {"a": 2}]], "n": 1}
    assert strip_content(metadata, include_content=False) is metadata
    nested = {"steps": [[{"op": "x", "outputs": ["o"]}]]}
    assert strip_content(nested, include_content=False) == {"steps": [[{"op": "x"}]]}
    assert has_content(nested) and not has_content(metadata) and not has_content("input")
