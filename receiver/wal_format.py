"""The write-ahead log's record payloads: what one entry holds and which entries replay refuses.

The frames around them, the segment files and the scan that reads them back are the shared segment
log's (stepwatch.segment_log). Pure functions only: no files are opened here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_ENTRY_HEAD = struct.Struct("<BBHI")
"""version | encoding code | u16 tenant length | u32 skip-list length; then the tenant (UTF-8),
4 bytes per skip-list index, and the request body."""
_ENTRY_VERSION = 1
_OTLP_PROTO = 0
_OTLP_JSON = 1
"""Encoding code of an OTLP/JSON body: the layout allows it, no release wrote it; refused on read."""


class UnreadableEntry(ValueError):
    """A record whose frame checks out but that this release does not replay; the message says why."""


def check_entry(payload: bytes) -> tuple[str, int]:
    """The tenant and where the body starts, or UnreadableEntry for a record this release cannot replay.

    Refused rather than misread: an unknown version or encoding, an OTLP/JSON body, and a non-empty
    skip list (spans the client was told were rejected: replaying the whole body would re-ingest
    them). The layout has room for the last two; no release wrote them.
    """
    if len(payload) < _ENTRY_HEAD.size:
        raise UnreadableEntry(f"{len(payload)} bytes, shorter than an entry head ({_ENTRY_HEAD.size})")
    version, encoding, tenant_len, skip_len = _ENTRY_HEAD.unpack_from(payload)
    if version != _ENTRY_VERSION:
        raise UnreadableEntry(f"entry version {version}; this release reads version {_ENTRY_VERSION}")
    if encoding == _OTLP_JSON:
        raise UnreadableEntry("an OTLP/JSON request body; this release replays only otlp_proto bodies")
    if encoding != _OTLP_PROTO:
        raise UnreadableEntry(f"unknown body encoding code {encoding}")
    if skip_len:
        raise UnreadableEntry(
            f"a skip list of {skip_len} span(s) rejected at ingest; this release does not honour skip "
            "lists, and replaying the whole body would re-ingest those spans"
        )
    start = _ENTRY_HEAD.size + tenant_len
    if start > len(payload):
        raise UnreadableEntry(f"tenant of {tenant_len} bytes runs past the end of the record")
    try:
        tenant = payload[_ENTRY_HEAD.size : start].decode()
    except UnicodeDecodeError as exc:
        raise UnreadableEntry("tenant is not UTF-8") from exc
    return tenant, start


@dataclass(frozen=True, slots=True)
class WalEntry:
    """What the service needs to rebuild its buffers: one accepted OTLP request.

    `data` is the ExportTraceServiceRequest as protobuf: the body as received (decompressed), or,
    when some spans were rejected, re-serialized with only the accepted ones, so a replay
    re-ingests exactly the spans that were acknowledged. (The layout's encoding code is always
    otlp_proto; see check_entry.)
    """

    tenant: str
    data: bytes

    def to_bytes(self) -> bytes:
        return b"".join(self.to_parts())

    def to_parts(self) -> tuple[bytes, bytes]:
        """(entry head and tenant, body): the payload `to_bytes` is, as a WAL record's parts, so
        the request body is logged without a copy of it."""
        tenant = self.tenant.encode()
        return _ENTRY_HEAD.pack(_ENTRY_VERSION, _OTLP_PROTO, len(tenant), 0) + tenant, self.data

    @classmethod
    def from_bytes(cls, payload: bytes) -> WalEntry:
        """The entry; UnreadableEntry (a ValueError) for a record `check_entry` refuses."""
        tenant, start = check_entry(payload)
        return cls(tenant, payload[start:])
