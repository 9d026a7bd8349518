"""Tenant-scoped keys and stores: the same trace or session id from two tenants is two partitions,
and each tenant's partitions are scored against its own expectations, never another's."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from stepwatch.evaluator.expectations.store import ExpectationsStore

from .auth import AuthConfigError
from .config import DEFAULT_TENANT_NAME, SecurityConfig
from .tenants import PerTenant, Tenant

_TRACE_ID_BYTES = 16
_SEP = "\x1f"
EMPTY_STORE = ExpectationsStore()


class TenantScope:
    """How a tenant separates buffer keys: the same trace or session id from two tenants is two
    partitions, without the buffer knowing about tenants.

    Trace keys are the 16-byte trace id for the default tenant (so the WAL and Kafka offsets keep
    their keys) and `tenant \\x1f trace id` otherwise: the length tells them apart. Session keys
    carry the tenant whenever tenancy is on.
    """

    def __init__(self, cfg: SecurityConfig) -> None:
        self.enabled = cfg.tenancy.enabled

    def name(self, tenant: Tenant | None) -> str:
        """The tenant a request is filed under: the token's tenant when tenancy is on, else default."""
        return tenant.name if self.enabled and tenant is not None else DEFAULT_TENANT_NAME

    @staticmethod
    def trace_key(tenant: str, trace_id: bytes) -> bytes:
        if tenant == DEFAULT_TENANT_NAME:
            return trace_id
        return tenant.encode() + _SEP.encode() + trace_id

    @staticmethod
    def split_trace(partition_id: str) -> tuple[str, str]:
        """(tenant, trace id hex) of a trace partition's buffer id (the key's hex)."""
        if len(partition_id) <= 2 * _TRACE_ID_BYTES:
            return DEFAULT_TENANT_NAME, partition_id
        raw = bytes.fromhex(partition_id)
        return raw[: -_TRACE_ID_BYTES - 1].decode(), raw[-_TRACE_ID_BYTES:].hex()

    def session_key(self, tenant: str, session_id: str) -> str:
        return f"{tenant}{_SEP}{session_id}" if self.enabled else session_id

    def split_session(self, key: str) -> tuple[str, str]:
        if not self.enabled:
            return DEFAULT_TENANT_NAME, key
        tenant, _, session_id = key.partition(_SEP)
        return tenant, session_id

    def check_names(self, names: Iterable[str]) -> None:
        """Tenant names from the tokens file must be label- and key-safe when tenancy is on."""
        if not self.enabled:
            return
        for name in names:
            if not name or len(name) > 64 or not all(c.isalnum() or c in "-_." for c in name):
                raise AuthConfigError(
                    f"auth tokens: tenant name {name!r} must be 1-64 characters of letters, digits, '-_.' "
                    "when security.tenancy is enabled"
                )


class TenantExpectations:
    """Each tenant's own expectations store; a lookup never falls back to another tenant's."""

    def __init__(self, files: dict[str, Path], load: Callable[[Path], ExpectationsStore]) -> None:
        self.files = dict(files)
        self._set({n: load(p) for n, p in files.items()})

    def get(self, tenant: str) -> ExpectationsStore:
        return self._stores.get(Tenant(tenant)) or EMPTY_STORE

    def replace(self, tenant: str, store: ExpectationsStore) -> None:
        stores = {name: self.get(name) for name in self._stores.tenants()}
        stores[tenant] = store
        self._set(stores)

    def registered_anywhere(self, task_key: str) -> bool:
        """Whether any tenant registers `task_key`: asked for every score event (the task-key cap),
        so answered from one set kept with the stores, not by asking each tenant's store."""
        return task_key in self._registered

    def _set(self, stores: dict[str, ExpectationsStore]) -> None:
        self._stores: PerTenant[ExpectationsStore] = PerTenant(stores)
        self._registered = frozenset(key for store in stores.values() for key in store.task_keys)
