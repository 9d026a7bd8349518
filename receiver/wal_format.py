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

from stepwatch.evaluator.model import Span

from .encodings import decode

MAGIC = b"SWL1"
_HEADER = struct.Struct("<4sIQI")
HEADER_SIZE = _HEADER.size
_CRC_FIELDS = struct.Struct("<IQ")
MAX_PAYLOAD_BYTES = 256 * 1024 * 1024
"""Frames claiming more are treated as damage (a real record is bounded by the receivers' limits)."""


def frame_header(seq: int, payload: bytes) -> bytes:
    """The header that goes before `payload` in its frame (written together with writev)."""
    length = len(payload)
    crc = zlib.crc32(payload, zlib.crc32(_CRC_FIELDS.pack(length, seq)))
    return _HEADER.pack(MAGIC, length, seq, crc)


def encode_frame(seq: int, payload: bytes) -> bytes:
    """One frame, ready to append to a segment file."""
    return frame_header(seq, payload) + payload


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

ENCODINGS: tuple[str, ...] = ("otlp_proto", "otlp_json")
"""Wire codes of WalEntry.encoding: append only, the index is what is stored."""
_ENTRY_HEAD = struct.Struct("<BBHI")
_ENTRY_VERSION = 1


@dataclass(frozen=True, slots=True)
class WalEntry:
    """What the service needs to rebuild its buffers: one accepted OTLP request.

    `data` is the request body as received (decompressed), `encoding` one of ENCODINGS, and
    `skip` the document-order indices (`Span.seq`) of spans that were not accepted (rejected by
    validation or by the buffer), so a replay re-ingests exactly the spans that were acknowledged.
    Storing the original bytes costs no re-encoding on the hot path.
    """

    tenant: str
    encoding: str
    data: bytes
    skip: tuple[int, ...] = ()

    def to_bytes(self) -> bytes:
        tenant = self.tenant.encode()
        head = _ENTRY_HEAD.pack(_ENTRY_VERSION, ENCODINGS.index(self.encoding), len(tenant), len(self.skip))
        skip = struct.pack(f"<{len(self.skip)}I", *self.skip) if self.skip else b""
        return b"".join((head, tenant, skip, self.data))

    def spans(self) -> list[Span]:
        """The spans this entry acknowledged, decoded again (decoding is deterministic)."""
        spans = decode(self.encoding, self.data).spans
        if not self.skip:
            return spans
        skip = set(self.skip)
        return [span for span in spans if span.seq not in skip]

    @classmethod
    def from_bytes(cls, payload: bytes) -> WalEntry:
        version, encoding, tenant_len, skip_len = _ENTRY_HEAD.unpack_from(payload)
        if version != _ENTRY_VERSION or encoding >= len(ENCODINGS):
            raise ValueError(f"unknown WAL entry version {version} or encoding {encoding}")
        offset = _ENTRY_HEAD.size
        tenant = payload[offset : offset + tenant_len].decode()
        offset += tenant_len
        skip = struct.unpack_from(f"<{skip_len}I", payload, offset) if skip_len else ()
        offset += 4 * skip_len
        return cls(tenant, ENCODINGS[encoding], payload[offset:], tuple(skip))
