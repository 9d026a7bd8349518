"""Tenants: who a request belongs to, and the seams that keep tenants' data apart.

Tenancy is off by default: every request belongs to the implicit `default` tenant and metrics carry
no `tenant` label. When it is on, the token decides the tenant, buffers are keyed by
(tenant, trace id), and expectations are looked up only in the tenant's own set, never another's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from .config import DEFAULT_TENANT_NAME, PrivacyConfig, SecurityConfig


@dataclass(frozen=True, slots=True)
class Tenant:
    """An authenticated sender's tenant. Only the name; tokens never leave the auth module."""

    name: str


DEFAULT_TENANT = Tenant(DEFAULT_TENANT_NAME)


T = TypeVar("T")


class PerTenant(Generic[T]):
    """A value per tenant (an expectations store, a buffer, a scorer budget) with no cross-tenant
    fallback: a tenant without its own value gets None, not the default tenant's."""

    def __init__(self, values: Mapping[str, T]) -> None:
        self._values = dict(values)

    def get(self, tenant: Tenant) -> T | None:
        return self._values.get(tenant.name)

    def tenants(self) -> list[str]:
        return sorted(self._values)


class TenantPolicy:
    """Answers the per-tenant questions the service asks: labels, privacy, expectations file."""

    def __init__(self, cfg: SecurityConfig, default_expectations_file: Path | None = None) -> None:
        self._cfg = cfg
        self._default_expectations = default_expectations_file

    @property
    def enabled(self) -> bool:
        return self._cfg.tenancy.enabled

    def metric_labels(self, tenant: Tenant) -> dict[str, str]:
        """`{"tenant": name}` when tenancy is on, else `{}` (no label, as the metrics contract says)."""
        return {"tenant": tenant.name} if self.enabled else {}

    def privacy(self, tenant: Tenant) -> PrivacyConfig:
        own = self._cfg.tenancy.tenants.get(tenant.name) if self.enabled else None
        return own.privacy if own is not None and own.privacy is not None else self._cfg.privacy

    def expectations_files(self) -> dict[str, Path]:
        """Tenant -> expectations file. Tenancy off: the default tenant gets the service's file.

        Tenancy on: each tenant gets only its own `expectations_file`; the service-wide file (if
        any) belongs to the `default` tenant alone, so no tenant can read another's expectations.
        """
        files: dict[str, Path] = {}
        if self._default_expectations is not None:
            files[DEFAULT_TENANT_NAME] = self._default_expectations
        if self.enabled:
            for name, tenant_cfg in self._cfg.tenancy.tenants.items():
                if tenant_cfg.expectations_file is not None:
                    files[name] = tenant_cfg.expectations_file
        return files


def tenant_of(attributes: Mapping[str, object]) -> str:
    """The tenant a score event belongs to (its `tenant` attribute), default when it has none."""
    return str(attributes.get("tenant", DEFAULT_TENANT_NAME))
