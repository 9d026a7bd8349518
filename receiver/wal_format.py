"""On-disk format of the write-ahead log: checksummed record frames, segment scanning, entry payloads.

A frame is a 20-byte header followed by the payload::

    magic b"SWL1" | u32 payload length | u64 sequence number | u32 CRC32 | payload

The CRC covers the length, the sequence number and the payload, so a torn write, a flipped bit or
a damaged length are all caught. The magic lets a reader resynchronise after a damaged frame in
the middle of a segment: it scans forward for the next offset where a whole frame checks out.
Pure functions only: no files are opened here.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from .spancore import crc32

MAGIC = b"SWL1"
_HEADER = struct.Struct("<4sIQI")
HEADER_SIZE = _HEADER.size
_CRC_FIELDS = struct.Struct("<IQ")
MAX_PAYLOAD_BYTES = 256 * 1024 * 1024
"""Frames claiming more are treated as damage (a real record is bounded by the receivers' limits)."""


Payload = bytes | tuple[bytes, ...]
"""A record's payload: its bytes, or parts whose concatenation it is (written one after the other
with the same writev, so a large body is never copied to put a small head before it)."""


def payload_size(payload: Payload) -> int:
    return len(payload) if isinstance(payload, bytes) else sum(map(len, payload))


def frame_header(seq: int, payload: Payload) -> bytes:
    """The header that goes before `payload` in its frame (written together with writev)."""
    length = payload_size(payload)
    crc = zlib.crc32(_CRC_FIELDS.pack(length, seq))
    for part in (payload,) if isinstance(payload, bytes) else payload:
        crc = crc32(part, crc)  # zlib's CRC, natively where the span core loaded
    return _HEADER.pack(MAGIC, length, seq, crc)


@dataclass(frozen=True, slots=True)
class Frame:
    seq: int
    offset: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Damage:
    """A stretch of a segment that holds no valid frame: `torn` when it runs to the end of the file."""

    offset: int
    length: int
    torn: bool


def _frame_at(data: bytes | memoryview, offset: int) -> Frame | None:
    end = len(data)
    if offset + HEADER_SIZE > end:
        return None
    magic, length, seq, crc = _HEADER.unpack_from(data, offset)
    if magic != MAGIC or length > MAX_PAYLOAD_BYTES:
        return None
    start = offset + HEADER_SIZE
    if start + length > end:
        return None
    payload = data[start : start + length]
    if zlib.crc32(payload, zlib.crc32(_CRC_FIELDS.pack(length, seq))) != crc:
        return None
    return Frame(seq, offset, bytes(payload))


def scan(data: bytes) -> Iterator[Frame | Damage]:
    """Every valid frame of a segment in file order, with a Damage item for each unreadable stretch.

    After damage the scan resumes at the next offset where the magic starts a frame whose CRC
    checks out; if none follows, the damage is reported as a torn tail.
    """
    view = memoryview(data)
    offset = 0
    end = len(data)
    while offset < end:
        frame = _frame_at(view, offset)
        if frame is not None:
            yield frame
            offset += HEADER_SIZE + len(frame.payload)
            continue
        resume = _resync(data, view, offset + 1)
        if resume is None:
            yield Damage(offset, end - offset, torn=True)
            return
        yield Damage(offset, resume - offset, torn=False)
        offset = resume


def _resync(data: bytes, view: memoryview, start: int) -> int | None:
    position = data.find(MAGIC, start)
    while position != -1:
        if _frame_at(view, position) is not None:
            return position
        position = data.find(MAGIC, position + 1)
    return None


# -- entry payloads ---------------------------------------------------------------------------

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
