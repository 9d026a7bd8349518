"""The HTML of the debug pages: one page shell, tables and a small stylesheet; no JavaScript.

Every value is escaped here (step names, task keys and rule reasons come from agents' spans and
expectations files); callers pass plain text, or `Markup` for HTML they built from escaped parts.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from aiohttp import web


class Markup(str):
    """HTML already escaped (built by this module's helpers): inserted as is."""


Cell = str | Markup | int | float | None


class Td(NamedTuple):
    """A table cell with its own class (the alignment table colours cells, not whole rows)."""

    content: Cell
    css: str


STYLE = """
body{font-family:system-ui,sans-serif;margin:1em 2em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.4em}
nav a{margin-right:.8em}
table{border-collapse:collapse;margin:.4em 0}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:left;font-size:13px;vertical-align:top}
th{background:#f3f3f3}
code,.id{font-family:ui-monospace,monospace;font-size:12px}
.muted{color:#777}.error{color:#a00;font-weight:bold}
form.filters label{margin-right:.8em;font-size:13px}
tr.op-match td.step{background:#e6f4ea}
tr.op-substitute td.step{background:#fff1d6}
tr.op-insert td.observed{background:#e3ecfa}
tr.op-delete td.expected{background:#fbe3e3}
tr.moved td.step{background:#efe4fb}
td.none{background:#fafafa;color:#999;font-style:italic}
tr.group td.expected{border-left:4px solid #6a5acd}
.tag{display:inline-block;border-radius:3px;padding:0 4px;font-size:11px;margin-left:4px;color:#fff}
.tag.match{background:#2e7d32}.tag.substitute{background:#b26a00}.tag.insert{background:#1a56b0}
.tag.delete{background:#b00020}.tag.moved{background:#6a1b9a}.tag.group{background:#6a5acd}
.outcome-pass{color:#2e7d32}.outcome-fail,.outcome-error{color:#b00020;font-weight:bold}
.outcome-not_scored{color:#777}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:2px 12px;font-size:14px}
dl.facts dt{font-weight:bold}dl.facts dd{margin:0}
"""

NAV = (("/debug/", "index"), ("/debug/partitionz", "partitions"), ("/debug/rejectionz", "rejections"))


def esc(value: Cell) -> str:
    """A cell's HTML: Markup as is, None as empty, anything else escaped."""
    if isinstance(value, Markup):
        return value
    if value is None:
        return ""
    return html.escape(str(value))


def link(href: str, text: Cell, css: str = "") -> Markup:
    cls = f' class="{css}"' if css else ""
    return Markup(f'<a href="{html.escape(href)}"{cls}>{esc(text)}</a>')


def tag(text: str, css: str) -> Markup:
    return Markup(f'<span class="tag {html.escape(css)}">{html.escape(text)}</span>')


def span(text: Cell, css: str) -> Markup:
    return Markup(f'<span class="{html.escape(css)}">{esc(text)}</span>')


def _td(cell: Cell | Td) -> str:
    if isinstance(cell, Td):
        return f'<td class="{html.escape(cell.css)}">{esc(cell.content)}</td>'
    return f"<td>{esc(cell)}</td>"


def table(
    head: Sequence[str], rows: Iterable[Sequence[Cell | Td]], row_class: Sequence[str] | None = None
) -> Markup:
    """A table; `row_class[i]`: row i's class attribute."""
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = []
    for i, row in enumerate(rows):
        css = f' class="{html.escape(row_class[i])}"' if row_class is not None and row_class[i] else ""
        body.append(f"<tr{css}>{''.join(_td(cell) for cell in row)}</tr>")
    return Markup(f"<table><tr>{header}</tr>{''.join(body)}</table>")


def facts(pairs: Iterable[tuple[str, Cell]]) -> Markup:
    """A definition list of (label, value)."""
    items = "".join(f"<dt>{html.escape(k)}</dt><dd>{esc(v)}</dd>" for k, v in pairs)
    return Markup(f'<dl class="facts">{items}</dl>')


def page(title: str, body: Iterable[Cell], status: int = 200) -> web.Response:
    """The shell every debug page shares: title, navigation, the stylesheet, the body parts."""
    nav = " ".join(f'<a href="{href}">{text}</a>' for href, text in NAV)
    parts = "".join(esc(part) for part in body)
    text = (
        f"<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<meta name=viewport content='width=device-width,initial-scale=1'>"
        f"<title>Stepwatch: {html.escape(title)}</title><style>{STYLE}</style></head>"
        f"<body><nav>{nav}</nav><h1>{html.escape(title)}</h1>{parts}</body></html>"
    )
    return web.Response(text=text, content_type="text/html", status=status)
