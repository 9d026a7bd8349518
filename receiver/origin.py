"""Where a run of buffered spans came from: their request's resource and instrumentation scope.

Every record of one ScopeSpans shares one Origin, so the resource's attributes and the scope's
name are decoded once per arrival rather than once per span or partition. The buffer never looks
inside it; unpacking gives (resource bytes, scope bytes) for re-assembling a request.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from .attributes import proto_attributes


class Origin:
    __slots__ = ("_resource_attributes", "_scope_name", "resource", "scope")

    def __init__(self, resource: bytes, scope: bytes) -> None:
        self.resource = resource
        self.scope = scope
        self._resource_attributes: dict[str, Any] | None = None
        self._scope_name: str | None = None

    def __iter__(self) -> Iterator[bytes]:
        yield self.resource
        yield self.scope

    @property
    def resource_attributes(self) -> dict[str, Any]:
        """Decoded once and shared by every span of this origin: read-only."""
        if self._resource_attributes is None:
            self._resource_attributes = proto_attributes(Resource.FromString(self.resource).attributes)
        return self._resource_attributes

    @property
    def scope_name(self) -> str:
        if self._scope_name is None:
            self._scope_name = InstrumentationScope.FromString(self.scope).name
        return self._scope_name
