"""Each tenant's expectations stay its own, and the service can ask whether any tenant registers a
task key (the Prometheus task-key cap does, for every score event)."""

from __future__ import annotations

from pathlib import Path

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.expectations.store import ExpectationsStore
from stepwatch.security.tenant_scope import TenantExpectations


def _store(*keys: str) -> ExpectationsStore:
    return ExpectationsStore({key: Expectation(expected_steps=["search"]) for key in keys})


def _tenants() -> TenantExpectations:
    stores = {"default": _store("shared", "mine"), "acme": _store("shared", "acme-only")}
    return TenantExpectations({name: Path(f"{name}.yaml") for name in stores}, lambda p: stores[p.stem])


def test_a_tenant_gets_its_own_store_and_never_another_tenants():
    tenants = _tenants()
    assert "acme-only" in tenants.get("acme") and "acme-only" not in tenants.get("default")
    assert len(tenants.get("nobody")) == 0


def test_registered_anywhere_is_any_tenants_key_and_follows_a_replaced_store():
    tenants = _tenants()
    assert all(tenants.registered_anywhere(key) for key in ("shared", "mine", "acme-only"))
    assert not tenants.registered_anywhere("unknown")

    tenants.replace("acme", _store("renamed"))  # a reload of acme's file
    assert tenants.registered_anywhere("renamed")
    assert not tenants.registered_anywhere("acme-only")
    assert tenants.registered_anywhere("mine")  # the other tenant's keys stay

    tenants.replace("newcomer", _store("fresh"))
    assert tenants.registered_anywhere("fresh") and "fresh" in tenants.get("newcomer")
