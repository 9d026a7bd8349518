"""A JSON text holding several documents one after another: NDJSON (one document per line), or the
OTel SDK's ConsoleSpanExporter output (one indented object per span, written back to back), which
`json.loads` refuses with "Extra data". Split here so every document is decoded on its own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_WHITESPACE = re.compile(r"[ \t\n\r]*")
"""What JSON allows between tokens, so between documents too."""
_DECODER = json.JSONDecoder()


class JsonStreamError(ValueError):
    """The text is not a sequence of JSON documents; the message names the line, column and document."""


@dataclass(frozen=True, slots=True)
class Document:
    value: Any
    line: int
    """1-based line of the document's first character, for errors that name the document."""


def json_documents(text: str) -> list[Document]:
    """Every JSON document in `text`, in order; documents may be separated by whitespace or nothing.

    JsonStreamError on the first one that does not parse ("invalid JSON at line L column C
    (document N): ..."); RecursionError, as from `json.loads`, for one nested too deeply."""
    documents: list[Document] = []
    position = _WHITESPACE.match(text).end()  # type: ignore[union-attr]  # `*` always matches
    line, counted = 1, 0
    while position < len(text):
        line += text.count("\n", counted, position)
        counted = position
        try:
            value, end = _DECODER.raw_decode(text, position)
        except json.JSONDecodeError as exc:
            raise JsonStreamError(
                f"invalid JSON at line {exc.lineno} column {exc.colno} (document {len(documents) + 1}): {exc.msg}"
            ) from None
        documents.append(Document(value, line))
        position = _WHITESPACE.match(text, end).end()  # type: ignore[union-attr]
    return documents
