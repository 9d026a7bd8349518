"""Debug pages on the metrics port, in the spirit of the Collector's zpages: what this instance
did lately, for an operator asking "why is my agent's score missing?".

  /debug/partitionz   the most recent scored partition revisions: type, id, revision, close
                      reason, task key, matched expectation (version), spans, every score
  /debug/rejectionz   the most recent refused requests: protocol, reason, spans, the message sent

HTML by default, JSON with `?format=json` (or `Accept: application/json`). They sit behind the
metrics port's authentication (security.metrics_auth) like /metrics; only identifiers, reasons and
numbers are shown, never step content.
"""

from __future__ import annotations

import datetime
import html
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from aiohttp import web

from stepwatch.exporters.recent_partitions import RecentPartition, RecentPartitions
from stepwatch.receiver.rejections import Rejection, RejectionLog

from .config import DebugPagesConfig

Handler = Callable[[web.Request], Any]
PARTITIONZ = "/debug/partitionz"
REJECTIONZ = "/debug/rejectionz"


class DebugPages:
    """The two rings and their pages. The rejection ring always exists (its records are also the
    rejection log lines); the partition ring is a score exporter, added only when pages are on."""

    def __init__(self, config: DebugPagesConfig) -> None:
        self.enabled = config.enabled
        self.partitions = RecentPartitions(config.max_partitions)
        self.rejections = RejectionLog(config.max_rejections if config.enabled else 1)

    @property
    def exporters(self) -> list[RecentPartitions]:
        """Score exporters to add to the service's fan-out (also when pages are off: it logs)."""
        return [self.partitions]

    def routes(self) -> Sequence[tuple[str, Handler]]:
        if not self.enabled:
            return ()
        return ((PARTITIONZ, self._partitionz), (REJECTIONZ, self._rejectionz))

    async def _partitionz(self, request: web.Request) -> web.Response:
        rows = list(reversed(self.partitions.recent()))
        if _wants_json(request):
            return web.json_response({"partitions": [asdict(row) for row in rows]})
        body = [_partition_row(row) for row in rows]
        head = ["scored", "type", "partition", "rev", "closed", "task key", "expectation", "spans", "scores"]
        return _page("Recent partitions", head, body, len(rows))

    async def _rejectionz(self, request: web.Request) -> web.Response:
        rows = list(reversed(self.rejections.recent()))
        if _wants_json(request):
            return web.json_response({"rejections": [asdict(row) for row in rows]})
        body = [_rejection_row(row) for row in rows]
        return _page(
            "Recent rejections", ["when", "protocol", "reason", "spans", "tenant", "message"], body, len(rows)
        )


def _wants_json(request: web.Request) -> bool:
    return request.query.get("format") == "json" or "application/json" in request.headers.get("Accept", "")


def _when(unix_time: float) -> str:
    return (
        datetime.datetime.fromtimestamp(unix_time, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    )


def _scores(row: RecentPartition) -> str:
    parts = []
    for metric, entry in row.scores.items():
        score = entry["score"]
        value = f"{score:.4g}" if score is not None else entry.get("reason", "")
        parts.append(f"{metric}={value} ({entry['outcome']})")
    return "; ".join(parts)


def _partition_row(row: RecentPartition) -> list[str]:
    task = row.task_key or ""
    if row.tenant:
        task = f"{row.tenant}/{task}"
    expectation = row.expectation or "none"
    if row.expectation and not row.registered:
        expectation += " (annotation)"
    return [
        _when(row.unix_time),
        row.partition_type,
        row.partition_id,
        str(row.revision),
        row.close_reason,
        task,
        expectation,
        str(row.span_count),
        _scores(row),
    ]


def _rejection_row(row: Rejection) -> list[str]:
    return [_when(row.unix_time), row.protocol, row.reason, str(row.spans), row.tenant or "", row.message]


def _page(title: str, head: list[str], rows: list[list[str]], count: int) -> web.Response:
    cells = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    links = f'<a href="{PARTITIONZ}">partitions</a> · <a href="{REJECTIONZ}">rejections</a> · <a href="?format=json">json</a>'
    text = (
        f"<!doctype html><html><head><meta charset=utf-8><title>Stepwatch: {title}</title>"
        "<style>body{font-family:sans-serif}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;font-size:13px}</style></head>"
        f"<body><h1>{title}</h1><p>{links} · newest first, {count} kept</p>"
        f"<table><tr>{header}</tr>{cells}</table></body></html>"
    )
    return web.Response(text=text, content_type="text/html")
