"""Debug pages on the metrics port, in the spirit of the Collector's zpages: what this instance
did lately, for an operator asking "why did this run score low?" or "why is my score missing?".

  /debug/                      an index of these pages
  /debug/partitionz            the partition revisions held, newest first: filters task_key, metric,
                               outcome, partition_type, tenant (tenancy on), paging (limit, offset)
  /debug/partitionz/{type}/{id}  one revision (latest held, or ?revision=N): expected and observed
                               steps side by side, failed rules, judge verdicts, the step spans,
                               the expectation and a trace link (debug_pages.trace_url_template)
  /debug/rejectionz            the most recent refused requests: protocol, reason, spans, message

HTML by default (no JavaScript), JSON with `?format=json` (or `Accept: application/json`). They sit
behind the metrics port's authentication (security.metrics_auth) like /metrics. What is held is
bounded (exporters/recent_partitions.py) and metered. Bad parameters are a 400 naming the
parameter, a partition or revision not held a 404; never a traceback.
"""

from __future__ import annotations

import datetime
import html
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stepwatch.evaluator.explanation import reason_of
from stepwatch.evaluator.scores import PartitionScores
from stepwatch.exporters.recent_partitions import RINGS, RecentPartitions, summary
from stepwatch.receiver.rejections import RejectionLog

from .config import DebugPagesConfig
from .debug_detail import detail, detail_path, render
from .debug_html import Cell, Markup, esc, link, page, span, table
from .security.tenants import tenant_of

Handler = Callable[[web.Request], Any]
INDEX = "/debug/"
PARTITIONZ = "/debug/partitionz"
DETAIL = "/debug/partitionz/{partition_type}/{partition_id:.+}"
"""`.+`: a session id may hold a slash (links quote it; either form reaches the page)."""
REJECTIONZ = "/debug/rejectionz"
OUTCOMES = ("pass", "fail", "error", "not_scored")
TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
SESSION_ID_MAX = 512
TENANT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

PAGES = (
    (PARTITIONZ, "partitions", "scored partition revisions held: filter by task key, metric, outcome, type"),
    (REJECTIONZ, "rejections", "the most recent refused requests and the message each sender got"),
    ("/metrics", "metrics", "Prometheus metrics (OpenMetrics when asked for)"),
    ("/healthz", "healthz", "alive"),
    ("/readyz", "readyz", "ready to take traffic"),
)


QueryT = TypeVar("QueryT", bound=BaseModel)
log = logging.getLogger(__name__)


class BadRequest(ValueError):
    """A parameter the page cannot use: answered 400 with this one-line message."""


class NotHeld(LookupError):
    """A partition or revision the pages do not hold (never scored here, or evicted): 404."""


class PartitionzQuery(BaseModel):
    """/debug/partitionz's query parameters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_key: str | None = Field(default=None, min_length=1, max_length=1024)
    metric: str | None = Field(default=None, min_length=1, max_length=256)
    outcome: Literal["pass", "fail", "error", "not_scored"] | None = None
    partition_type: Literal["trace", "session"] | None = None
    tenant: str | None = Field(default=None, pattern=TENANT_NAME.pattern)
    limit: int = Field(default=50, ge=1, le=1000)
    offset: int = Field(default=0, ge=0)
    format: Literal["json", "html"] | None = None


class DetailQuery(BaseModel):
    """/debug/partitionz/{type}/{id}'s query parameters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    revision: int | None = Field(default=None, ge=0)
    tenant: str | None = Field(default=None, pattern=TENANT_NAME.pattern)
    format: Literal["json", "html"] | None = None


class DebugPages:
    """The rings and their pages. The rejection ring always exists (its records are also the
    rejection log lines); the partitions are a score exporter, added also when pages are off (it logs).

    `include_content(tenant)`: that tenant's privacy.include_content; `tenancy`: whether tenants
    exist (the tenant filter and column); `metrics()`: the metric names a filter may name;
    `expectations_source(tenant)`: where that tenant's registered expectations come from."""

    def __init__(
        self,
        config: DebugPagesConfig,
        *,
        include_content: Callable[[str], bool] = lambda tenant: False,
        tenancy: bool = False,
        metrics: Callable[[], Iterable[str]] = tuple,
        expectations_source: Callable[[str], str | None] = lambda tenant: None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = config.enabled
        self.config = config
        self.partitions = RecentPartitions(
            config.max_partitions if config.enabled else 1,
            config.max_failures_per_task_key if config.enabled else 0,
            config.max_failure_task_keys,
            recent_per_second=config.admit_per_second or None,
            failures_per_second=config.admit_failures_per_second or None,
            clock=clock,
        )
        self.rejections = RejectionLog(config.max_rejections if config.enabled else 1)
        self._include_content = include_content
        self._tenancy = tenancy
        self._metrics = metrics
        self._source = expectations_source
        if registry is not None and config.enabled:
            registry.register(_HeldCollector(self.partitions))

    @property
    def exporters(self) -> list[RecentPartitions]:
        """Score exporters to add to the service's fan-out (also when pages are off: it logs)."""
        return [self.partitions]

    def routes(self) -> Sequence[tuple[str, Handler]]:
        if not self.enabled:
            return ()
        return (
            ("/debug", _answered(self._index)),
            (INDEX, _answered(self._index)),
            (PARTITIONZ, _answered(self._partitionz)),
            (DETAIL, _answered(self._detail)),
            (REJECTIONZ, _answered(self._rejectionz)),
        )

    async def _index(self, request: web.Request) -> web.Response:
        if _wants_json(request):
            return web.json_response(
                {"pages": [{"path": path, "name": name, "description": text} for path, name, text in PAGES]}
            )
        rows: list[list[Cell]] = [[link(path, path), text] for path, _, text in PAGES]
        return page("Debug pages", [table(["page", "what it shows"], rows), _json_link(request)])

    async def _partitionz(self, request: web.Request) -> web.Response:
        try:
            query = _parse(PartitionzQuery, request)
            held = self.partitions.held()  # unpickled once per page (recent_partitions.py)
            self._check_filters(query, held)
        except BadRequest as exc:
            return _error(request, 400, str(exc))
        matching = [event for event in held if _matches(event, query)]
        shown = matching[query.offset : query.offset + query.limit]
        rows = [self._row(event) for event in shown]
        more = query.offset + len(shown) < len(matching)
        next_path = _with(request, offset=query.offset + query.limit) if more else None
        if _wants_json(request):
            return web.json_response(
                {
                    "partitions": rows,
                    "total": len(matching),
                    "offset": query.offset,
                    "limit": query.limit,
                    "next": next_path,
                    "held": self.partitions.held_counts(),
                }
            )
        metrics = {result.metric for event in held for result in event.results}
        return page(
            "Partitions", self._partitionz_html(request, query, rows, len(matching), next_path, metrics)
        )

    async def _detail(self, request: web.Request) -> web.Response:
        try:
            query = _parse(DetailQuery, request)
            partition_type, partition_id = _partition(request)
            if query.tenant is not None and not self._tenancy:
                raise BadRequest("tenant: tenancy is off (security.tenancy.enabled), so there is no tenant")
            event, revisions = self._find(partition_type, partition_id, query)
        except BadRequest as exc:
            return _error(request, 400, str(exc))
        except NotHeld as exc:
            return _error(request, 404, str(exc))
        tenant = tenant_of(event.attributes)
        data = detail(
            event,
            revisions,
            include_content=self._include_content(tenant),
            trace_url_template=self.config.trace_url_template,
            expectations_source=self._source(tenant),
        )
        if _wants_json(request):
            return web.json_response(data, dumps=_dumps)

        def revision_path(revision: int) -> str:
            return _with(request, revision=revision)

        title = f"{partition_type} {partition_id} revision {event.revision}"
        return page(title, [*render(data, revision_path), _json_link(request)])

    async def _rejectionz(self, request: web.Request) -> web.Response:
        rows = list(reversed(self.rejections.recent()))
        if _wants_json(request):
            return web.json_response({"rejections": [asdict(row) for row in rows]})
        body = [[_when(r.unix_time), r.protocol, r.reason, r.spans, r.tenant or "", r.message] for r in rows]
        head = ["when", "protocol", "reason", "spans", "tenant", "message"]
        count = Markup(f"<p>newest first, {len(rows)} kept</p>")
        return page("Recent rejections", [count, table(head, body), _json_link(request)])

    def _check_filters(self, query: PartitionzQuery, held: Sequence[PartitionScores]) -> None:
        if query.tenant is not None and not self._tenancy:
            raise BadRequest(
                "tenant: tenancy is off (security.tenancy.enabled), so there is no tenant to filter by"
            )
        if query.metric is not None:
            known = set(self._metrics())
            known.update(result.metric for event in held for result in event.results)
            if query.metric not in known:
                raise BadRequest(
                    f"metric: unknown metric {query.metric!r}; known: {', '.join(sorted(known))}"
                )

    def _find(
        self, partition_type: str, partition_id: str, query: DetailQuery
    ) -> tuple[PartitionScores, list[int]]:
        """The requested revision of a held partition and every revision of it held."""
        name = f"{partition_type} {partition_id}"
        found = [
            event
            for event in self.partitions.held()
            if event.partition_id == partition_id
            and event.partition_type == partition_type
            and (query.tenant is None or event.attributes.get("tenant") == query.tenant)
        ]
        if not found:
            config = self.config
            raise NotHeld(
                f"{name} is not held: never scored here, evicted, or skipped (debug_pages keeps the last "
                f"{config.max_partitions} revisions, taking at most {config.admit_per_second:g} a second, and "
                f"{config.max_failures_per_task_key} failing ones per task key, at most "
                f"{config.admit_failures_per_second:g} a second each); `stepwatch score` explains any "
                "trace offline"
            )
        tenants = sorted({event.attributes.get("tenant", "") for event in found})
        if len(tenants) > 1:
            raise BadRequest(f"{name} is held for tenants {', '.join(tenants)}: add ?tenant=NAME")
        revisions = sorted({event.revision for event in found})
        if query.revision is None:
            return found[0], revisions  # held() is newest first
        for event in found:
            if event.revision == query.revision:
                return event, revisions
        raise NotHeld(
            f"revision {query.revision} of {name} is not held (evicted or never scored); "
            f"held: {', '.join(map(str, revisions))}"
        )

    def _row(self, event: PartitionScores) -> dict[str, Any]:
        row = asdict(summary(event))
        row["reasons"] = {result.metric: reason for result in event.results if (reason := reason_of(result))}
        row["detail"] = detail_path(event)
        if not self._tenancy:
            row.pop("tenant", None)
        return row

    def _partitionz_html(
        self,
        request: web.Request,
        query: PartitionzQuery,
        rows: list[dict[str, Any]],
        total: int,
        next_path: str | None,
        held_metrics: set[str],
    ) -> list[Cell]:
        head = [
            "scored",
            "type",
            "partition",
            "rev",
            "closed",
            "task key",
            "expectation",
            "spans",
            "scores",
            "reason",
        ]
        if self._tenancy:
            head.insert(1, "tenant")
        body: list[list[Cell]] = []
        for row in rows:
            expectation = row["expectation"] or "none"
            if row["expectation"] and not row["registered"]:
                expectation += " (annotation)"
            cells: list[Cell] = [
                _when(row["unix_time"]),
                row["partition_type"],
                link(row["detail"], row["partition_id"], "detail id"),
                row["revision"],
                row["close_reason"],
                row["task_key"],
                expectation,
                row["span_count"],
                _scores(row["scores"]),
                "; ".join(f"{metric}: {reason}" for metric, reason in row["reasons"].items()),
            ]
            if self._tenancy:
                cells.insert(1, row["tenant"])
            body.append(cells)
        held = self.partitions.held_counts()
        status = (
            f"<p>newest first: {len(rows)} of {total} matching (from {query.offset + 1 if rows else 0}); held: "
            f"{held['recent']} recent, {held['failures']} failing apart"
        )
        if next_path is not None:
            status += f' · <a href="{_attr(next_path)}" rel="next">next page</a>'
        if query.offset:
            status += f' · <a href="{_attr(_with(request, offset=max(0, query.offset - query.limit)))}" rel="prev">previous page</a>'
        status += "</p>"
        return [
            self._filter_form(query, held_metrics),
            Markup(status),
            table(head, body),
            _json_link(request),
        ]

    def _filter_form(self, query: PartitionzQuery, held_metrics: set[str]) -> Markup:
        """A GET form of the filters: works without JavaScript."""

        def choose(name: str, values: Iterable[str], current: str | None) -> str:
            options = "".join(
                f'<option value="{_attr(v)}"{" selected" if v == current else ""}>{_attr(v or "any")}</option>'
                for v in ("", *values)
            )
            return f'<label>{name} <select name="{name}">{options}</select></label>'

        metrics = sorted(set(self._metrics()) | held_metrics)
        fields = [
            f'<label>task_key <input name="task_key" value="{_attr(query.task_key or "")}"></label>',
            choose("metric", metrics, query.metric),
            choose("outcome", OUTCOMES, query.outcome),
            choose("partition_type", ("trace", "session"), query.partition_type),
        ]
        if self._tenancy:
            fields.append(f'<label>tenant <input name="tenant" value="{_attr(query.tenant or "")}"></label>')
        fields.append(f'<input type="hidden" name="limit" value="{query.limit}">')
        return Markup(
            f'<form class="filters" method="get" action="{PARTITIONZ}">{"".join(fields)}<button>filter</button></form>'
        )


class _HeldCollector(Collector):
    """What the debug pages hold and what they dropped to stay within their bounds."""

    def __init__(self, partitions: RecentPartitions) -> None:
        self._partitions = partitions

    def collect(self) -> Iterator[Metric]:
        held = GaugeMetricFamily(
            "stepwatch_debug_partitions_held",
            "Scored partition revisions the debug pages hold with their details, per set (recent: the "
            "last debug_pages.max_partitions; failures: kept apart per task key). One in both counts in both.",
            labels=["set"],
        )
        evicted = CounterMetricFamily(
            "stepwatch_debug_partitions_evicted",
            "Revisions dropped from a debug-page set to stay within its bound.",
            labels=["set"],
        )
        counts = self._partitions.held_counts()
        for name in RINGS:
            held.add_metric([name], counts[name])
            evicted.add_metric([name], self._partitions.evicted[name])
        skipped = CounterMetricFamily(
            "stepwatch_debug_partitions_skipped",
            "Revisions a debug-page set did not take: its admission rate (debug_pages.admit_per_second, "
            "admit_failures_per_second per task key) was reached.",
            labels=["set"],
        )
        for name in RINGS:
            skipped.add_metric([name], self._partitions.skipped[name])
        yield held
        yield evicted
        yield skipped
        yield GaugeMetricFamily(
            "stepwatch_debug_failure_task_keys",
            "Task keys whose failing revisions the debug pages keep apart (at most debug_pages.max_failure_task_keys).",
            value=self._partitions.failure_task_keys(),
        )


def _answered(handler: Callable[[web.Request], Awaitable[web.Response]]) -> Handler:
    """`handler`, with a bug in it answered 500 in one line (and logged with its traceback), never
    a traceback on the page."""

    async def answer(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except Exception:
            log.exception("debug page %s failed", request.path)
            return _error(request, 500, "this page failed; the service log has the error")

    return answer


def _parse(model: type[QueryT], request: web.Request) -> QueryT:
    """The query string as `model`; BadRequest naming the parameter (and the allowed values)."""
    given: dict[str, str] = {}
    for key, value in request.query.items():
        if key in given:
            raise BadRequest(f"{key}: given more than once")
        if value == "" and key != "format":
            continue  # an empty form field: no filter
        given[key] = value
    try:
        return model.model_validate(given)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            allowed = ", ".join(model.model_fields)
            raise BadRequest(f"unknown parameter {name!r}; allowed: {allowed}") from None
        raise BadRequest(f"{name}: {error['msg']} (got {error.get('input')!r})") from None


def _partition(request: web.Request) -> tuple[str, str]:
    partition_type = request.match_info["partition_type"]
    partition_id = request.match_info["partition_id"]
    if partition_type not in ("trace", "session"):
        raise BadRequest(f"partition type {partition_type!r}: must be trace or session")
    if partition_type == "trace":
        if not TRACE_ID.match(partition_id.lower()):
            raise BadRequest(f"trace id {partition_id!r}: must be 32 hex characters")
        return partition_type, partition_id.lower()
    if len(partition_id) > SESSION_ID_MAX or not partition_id.isprintable():
        raise BadRequest(f"session id: must be printable and at most {SESSION_ID_MAX} characters")
    return partition_type, partition_id


def _matches(event: PartitionScores, query: PartitionzQuery) -> bool:
    if query.task_key is not None and event.task_key != query.task_key:
        return False
    if query.partition_type is not None and event.partition_type != query.partition_type:
        return False
    if query.tenant is not None and event.attributes.get("tenant") != query.tenant:
        return False
    results = [r for r in event.results if query.metric is None or r.metric == query.metric]
    if query.metric is not None and not results:
        return False
    return query.outcome is None or any(r.outcome == query.outcome for r in results)


def _wants_json(request: web.Request) -> bool:
    return request.query.get("format") == "json" or "application/json" in request.headers.get("Accept", "")


def _error(request: web.Request, status: int, message: str) -> web.Response:
    if _wants_json(request):
        return web.json_response({"error": message, "status": status}, status=status)
    title = {400: "Bad request", 404: "Not found"}.get(status, "Error")
    return page(title, [span(message, "error")], status=status)


def _with(request: web.Request, **changes: Any) -> str:
    """This page's path with some query parameters changed."""
    params = {k: v for k, v in request.query.items() if v != ""}
    params.update({k: str(v) for k, v in changes.items()})
    return f"{request.path}?{urlencode(params)}"


def _json_link(request: web.Request) -> Markup:
    return Markup(f'<p class="muted">{link(_with(request, format="json"), "this page as JSON")}</p>')


def _attr(value: str) -> str:
    return html.escape(value, quote=True)


def _dumps(value: Any) -> str:
    """JSON of a detail; step content that is not JSON (rare: decoded attribute values are) as repr."""
    return json.dumps(value, default=repr)


def _when(unix_time: float) -> str:
    return (
        datetime.datetime.fromtimestamp(unix_time, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    )


def _scores(scores: dict[str, dict[str, Any]]) -> Markup:
    parts = []
    for metric, entry in scores.items():
        score = entry["score"]
        value = f"{score:.4g}" if score is not None else entry.get("reason", "")
        outcome = entry["outcome"]
        parts.append(f"{esc(metric)}={esc(value)} " + span(f"({outcome})", f"outcome-{outcome}"))
    return Markup("; ".join(parts))
