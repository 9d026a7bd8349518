"""Bearer and basic authentication: token files and env, constant-time lookup, no token in logs."""

from __future__ import annotations

import base64
import hashlib
import logging

import pytest

from stepwatch.security import auth
from stepwatch.security.auth import (
    AdminAuthenticator,
    AuthConfigError,
    BasicAuthenticator,
    BearerAuthenticator,
    TokenTable,
    bearer_token,
    parse_tokens_document,
    parse_tokens_env,
)
from stepwatch.security.config import AdminAuthConfig, BasicAuthConfig
from stepwatch.security.tenants import DEFAULT_TENANT, Tenant

SECRET_A = "tok-a-9f8e7d6c5b4a39281706"
SECRET_B = "tok-b-0a1b2c3d4e5f60718293"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_mapping_file_maps_each_token_to_its_tenant(tmp_path):
    path = tmp_path / "tokens.yaml"
    path.write_text(f"team-a: [{SECRET_A}]\nteam-b:\n  - {SECRET_B}\n")
    authn = BearerAuthenticator(path, "UNSET_ENV", environ={})
    assert authn.authenticate(f"Bearer {SECRET_A}") == Tenant("team-a")
    assert authn.authenticate(f"bearer {SECRET_B}") == Tenant("team-b")
    assert authn.authenticate(None) is None
    assert authn.authenticate("Bearer nope") is None
    assert authn.authenticate(f"Basic {SECRET_A}") is None
    assert authn.authenticate(f"Bearer {SECRET_A}x") is None


def test_bare_list_is_one_default_tenant():
    assert parse_tokens_document([SECRET_A, SECRET_B], "f") == {"default": [SECRET_A, SECRET_B]}


def test_env_forms_comma_list_and_inline_mapping():
    assert parse_tokens_env(f" {SECRET_A} , {SECRET_B} ", "E") == {"default": [SECRET_A, SECRET_B]}
    assert parse_tokens_env(f'{{"team-a": ["{SECRET_A}"]}}', "E") == {"team-a": [SECRET_A]}
    authn = BearerAuthenticator(None, "STEPWATCH_AUTH_TOKENS", environ={"STEPWATCH_AUTH_TOKENS": SECRET_A})
    assert authn.enabled
    assert authn.authenticate(f"Bearer {SECRET_A}") == DEFAULT_TENANT
    assert authn.authenticate("Bearer other") is None


def test_no_token_source_means_auth_off_and_the_default_tenant():
    authn = BearerAuthenticator(None, "STEPWATCH_AUTH_TOKENS", environ={})
    assert not authn.enabled
    assert authn.authenticate(None) == DEFAULT_TENANT


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"team-a": [SECRET_A, SECRET_A]}, "listed twice"),
        ({"team-a": [SECRET_A], "team-b": [SECRET_A]}, "listed twice"),
        ({"team-a": []}, "non-empty list"),
        ({"team-a": [f"{SECRET_A} x"]}, "whitespace"),
        ({"team-a": [42]}, "non-empty string"),
        ("just-a-string", "expected a mapping"),
    ],
)
def test_bad_token_files_are_refused_without_echoing_secrets(document, message):
    with pytest.raises(AuthConfigError, match=message) as info:
        parse_tokens_document(document, "tokens.yaml")
    assert SECRET_A not in str(info.value)


def test_invalid_yaml_error_does_not_quote_the_line(tmp_path):
    path = tmp_path / "tokens.yaml"
    path.write_text(f"team-a: [{SECRET_A}\n")
    with pytest.raises(AuthConfigError, match="not valid YAML") as info:
        BearerAuthenticator(path, "E", environ={})
    assert SECRET_A not in str(info.value)


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("BEARER   abc  ", "abc"),
        ("Bearer", None),
        ("Bearer a b", None),
        ("Token abc", None),
        ("", None),
        (None, None),
        ("Bearer " + "a" * 10_000, None),
    ],
)
def test_bearer_header_parsing(header, token):
    assert bearer_token(header) == token


def test_lookup_compares_against_every_entry_without_early_exit(monkeypatch):
    table = TokenTable.from_tenants({"a": [f"t{i}" for i in range(5)], "b": ["u1", "u2"]})
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def counting(x, y):
        calls.append((x, y))
        return real(x, y)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    assert table.lookup("t0") == Tenant("a")  # a hit on the first entry
    assert len(calls) == 7
    calls.clear()
    assert table.lookup("missing") is None
    assert len(calls) == 7
    # Only digests are held and compared, never the tokens themselves.
    assert all(len(x) == 32 and len(y) == 32 for x, y in calls)
    assert hashlib.sha256(b"t0").digest() in {stored for stored, _ in table.entries}


def test_token_file_reloads_on_change_and_keeps_old_tokens_on_a_bad_edit(tmp_path, caplog):
    path = tmp_path / "tokens.yaml"
    path.write_text(f"team-a: [{SECRET_A}]\n")
    clock = Clock()
    authn = BearerAuthenticator(path, "E", environ={}, clock=clock)
    assert authn.authenticate(f"Bearer {SECRET_A}") == Tenant("team-a")

    path.write_text(f"team-b: [{SECRET_B}]\n")
    clock.now += 2
    assert authn.authenticate(f"Bearer {SECRET_A}") is None
    assert authn.authenticate(f"Bearer {SECRET_B}") == Tenant("team-b")

    with caplog.at_level(logging.DEBUG):
        path.write_text(f"team-b: [{SECRET_B}, {SECRET_B}]\n")  # duplicate: refused
        clock.now += 2
        assert authn.authenticate(f"Bearer {SECRET_B}") == Tenant("team-b")
    assert "reload failed" in caplog.text
    assert SECRET_B not in caplog.text


def test_reload_checks_are_throttled(tmp_path):
    path = tmp_path / "tokens.yaml"
    path.write_text(f"[{SECRET_A}]\n")
    clock = Clock()
    authn = BearerAuthenticator(path, "E", environ={}, clock=clock)
    authn.authenticate("Bearer x")
    path.write_text(f"[{SECRET_B}]\n")
    clock.now += 0.5
    assert authn.authenticate(f"Bearer {SECRET_A}") == DEFAULT_TENANT  # not re-read yet
    clock.now += 1
    assert authn.authenticate(f"Bearer {SECRET_B}") == DEFAULT_TENANT


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_basic_auth_with_plain_and_hashed_passwords(tmp_path):
    users = tmp_path / "users.yaml"
    hashed = hashlib.sha256(b"s3cret-two").hexdigest()
    users.write_text(f"prom: s3cret-one\ngrafana: 'sha256:{hashed}'\n")
    basic = BasicAuthenticator(users)
    assert basic.check(_basic("prom", "s3cret-one"))
    assert basic.check(_basic("grafana", "s3cret-two"))
    assert not basic.check(_basic("prom", "s3cret-two"))
    assert not basic.check(_basic("nobody", "s3cret-one"))
    assert not basic.check("Basic !!!not-base64")
    assert not basic.check(None)


def test_admin_auth_accepts_its_own_tokens_or_basic_and_not_receiver_tokens(tmp_path):
    users = tmp_path / "users.yaml"
    users.write_text("prom: pw-123\n")
    cfg = AdminAuthConfig(basic=BasicAuthConfig(users_file=users))
    admin = AdminAuthenticator(
        cfg, environ={"STEPWATCH_METRICS_TOKENS": "metrics-tok", "STEPWATCH_AUTH_TOKENS": "x"}
    )
    assert admin.check("Bearer metrics-tok")
    assert admin.check(_basic("prom", "pw-123"))
    assert not admin.check("Bearer x")
    assert not admin.check(None)
    assert AdminAuthenticator(AdminAuthConfig(), environ={}).check(None)  # off unless configured


def test_rejected_spans_are_counted_from_parsed_or_raw_requests():
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

    request = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[Span(name="a"), Span(name="b")])])] * 2
    )
    assert auth.count_request_spans(request) == 4
    assert auth.count_request_spans(request.SerializeToString()) == 4  # H4's raw-bytes generic handler
    assert auth.count_request_spans(b"\xff\xff") == 0
    assert auth.count_request_spans(object()) == 0
