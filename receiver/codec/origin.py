"""Decoded resources and scopes of buffered spans, cached by their encoded bytes.

A record keeps its origin as a plain (resource bytes, scope bytes) tuple: a tuple of bytes, and so
the record holding it, is untracked by the garbage collector, which then never walks the
hundreds of thousands of buffered records. Close-time decoding asks this cache for the resource's
attributes and the scope's name, so each distinct resource is decoded once, not once per span
or partition.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from .attributes import proto_attributes


class OriginCache:
    """Resource attributes and scope names by encoded bytes; bounded (cleared when full).

    The attribute dicts are shared by every span of that resource: read-only."""

    def __init__(self, max_entries: int = 1024) -> None:
        self._max = max_entries
        self._resources: dict[bytes, dict[str, Any]] = {}
        self._scopes: dict[bytes, str] = {}

    def resource_attributes(self, resource: bytes) -> dict[str, Any]:
        attributes = self._resources.get(resource)
        if attributes is None:
            if len(self._resources) >= self._max:
                self._resources.clear()
            attributes = self._resources[resource] = proto_attributes(
                Resource.FromString(resource).attributes
            )
        return attributes

    def scope_name(self, scope: bytes) -> str:
        name = self._scopes.get(scope)
        if name is None:
            if len(self._scopes) >= self._max:
                self._scopes.clear()
            name = self._scopes[scope] = InstrumentationScope.FromString(scope).name
        return name
