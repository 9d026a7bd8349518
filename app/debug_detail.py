"""One partition revision's detail for /debug/partitionz/{type}/{id}: the same dict is the JSON
answer and what the HTML is rendered from, so the two never disagree.

The alignment, failed rules and judge verdicts are the scorers' structured explanations
(evaluator/explanation.py, the same ones every stream carries); the spans that became steps are the
event's `step_spans`. Step inputs and outputs are added only when the partition's tenant has
`privacy.include_content`; names, reasons and span ids always are.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from stepwatch.evaluator.explanation import reason_of
from stepwatch.evaluator.scores import PartitionScores

from .debug_html import Cell, Markup, Td, esc, facts, link, span, table, tag

STEP_ACCURACY = "agent.step_accuracy"
RULES = "trajectory"
JUDGES = ("trajectory_steps", "plan_adherence")


def when(unix_nano: int) -> str:
    """An RFC 3339 UTC timestamp with milliseconds."""
    moment = datetime.datetime.fromtimestamp(unix_nano / 1e9, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def detail_path(event: PartitionScores, revision: bool = True) -> str:
    """The detail page's URL path of an event (`?revision=` and `&tenant=` when they matter)."""
    path = f"/debug/partitionz/{event.partition_type}/{quote(event.partition_id, safe='')}"
    query: dict[str, str | int] = {}
    if revision:
        query["revision"] = event.revision
    tenant = event.attributes.get("tenant")
    if tenant is not None:
        query["tenant"] = tenant
    return path + ("?" + urlencode(query) if query else "")


def detail(
    event: PartitionScores,
    revisions: Sequence[int],
    *,
    include_content: bool,
    trace_url_template: str | None,
    expectations_source: str | None,
) -> dict[str, Any]:
    """The detail of one held revision; `revisions`: every revision of it still held."""
    by_metric = {result.metric: result for result in event.results}
    explained = {
        result.metric: result.structured.as_json()
        for result in event.results
        if result.structured is not None
    }
    alignment = explained.get(STEP_ACCURACY)
    rules = explained.get(RULES)
    tenant = event.attributes.get("tenant")
    source = None
    if event.registered:
        source = expectations_source or "expectations file"
    elif event.expectation_version:
        source = "annotation"
    steps = []
    for index, step in enumerate(event.step_spans.rows() if event.step_spans is not None else ()):
        row: dict[str, Any] = {
            "index": index,
            "span_id": step.span_id,
            "name": step.name,
            "step_kind": step.step_kind,
            "span_kind": step.span_kind,
            "offset_ms": None if step.offset_ns is None else round(step.offset_ns / 1e6, 3),
            "duration_ms": None if step.duration_ns is None else round(step.duration_ns / 1e6, 3),
        }
        if include_content:
            row["input"] = step.input
            row["output"] = step.output
        steps.append(row)
    return {
        "partition_type": event.partition_type,
        "partition_id": event.partition_id,
        "revision": event.revision,
        "revisions_held": sorted(revisions),
        "tenant": tenant,
        "close_reason": event.close_reason,
        "scored_at": when(event.scored_at_unix_nano) if event.scored_at_unix_nano else None,
        "span_count": event.span_count,
        "session_id": event.session_id,
        "task_key": event.task_key,
        "expectation": {
            "version": event.expectation_version,
            "registered": event.registered,
            "source": source,
        },
        "traces": [
            {
                "trace_id": trace_id,
                "url": trace_url_template.replace("{trace_id}", trace_id) if trace_url_template else None,
            }
            for trace_id in event.trace_ids
        ],
        "scores": [
            {
                "metric": result.metric,
                "score": result.score,
                "threshold": result.threshold,
                "passed": result.passed,
                "outcome": result.outcome,
                "reason": reason_of(result),
                "explanation": result.explanation,
                "explanation_detail": explained.get(result.metric),
            }
            for result in event.results
        ],
        "alignment": alignment["alignment"] if alignment is not None else None,
        "summary": alignment["summary"] if alignment is not None else None,
        "scoring_method": by_metric[STEP_ACCURACY].metadata.get("scoring_method")
        if STEP_ACCURACY in by_metric
        else None,
        "failed_rules": rules["failed_rules"] if rules is not None else None,
        "judges": [explained[metric] for metric in JUDGES if metric in explained],
        "steps": steps,
        "content_shown": include_content,
    }


def render(data: dict[str, Any], revision_path: Callable[[int], str]) -> list[Cell]:
    """The detail page's body parts from `detail()`'s dict."""
    expectation = data["expectation"]
    source = expectation["source"] or "none matched"
    parts: list[Cell] = [
        facts(
            [
                ("partition", f"{data['partition_type']} {data['partition_id']}"),
                *([("tenant", data["tenant"])] if data["tenant"] is not None else []),
                ("revision", _revisions(data, revision_path)),
                ("closed", data["close_reason"]),
                ("scored at", data["scored_at"]),
                ("spans", data["span_count"]),
                ("task key", data["task_key"]),
                ("expectation", f"version {expectation['version'] or '-'} from {source}"),
                ("trace", _trace_links(data["traces"])),
            ]
        ),
        Markup("<h2>Scores</h2>"),
        table(
            ["metric", "score", "threshold", "outcome", "reason"],
            [
                [
                    s["metric"],
                    "" if s["score"] is None else f"{s['score']:.4g}",
                    "" if s["threshold"] is None else f"{s['threshold']:.4g}",
                    span(s["outcome"], f"outcome-{s['outcome']}"),
                    s["reason"] or s["explanation"],
                ]
                for s in data["scores"]
            ],
        ),
    ]
    parts += _alignment(data)
    parts += _rules(data)
    parts += _judges(data)
    parts += _steps(data)
    return parts


def _revisions(data: dict[str, Any], revision_path: Callable[[int], str]) -> Markup:
    shown = []
    for revision in data["revisions_held"]:
        if revision == data["revision"]:
            shown.append(f"<b>{revision}</b>")
        else:
            shown.append(link(revision_path(revision), revision))
    return Markup(" · ".join(shown) + ' <span class="muted">(held)</span>')


def _trace_links(traces: list[dict[str, Any]]) -> Markup:
    shown = []
    for trace in traces:
        text = Markup(f'<span class="id">{trace["trace_id"]}</span>')
        shown.append(link(trace["url"], text, "trace-link") if trace["url"] else text)
    return Markup(", ".join(shown) or '<span class="muted">none</span>')


def _alignment(data: dict[str, Any]) -> list[Cell]:
    rows = data["alignment"]
    if rows is None:
        return []
    summary = data["summary"]
    said = [
        f"{label}: {', '.join(names)}"
        for label, names in (
            ("missing", summary["missing"]),
            ("moved", summary["moved"]),
            ("substituted", [f"{s['expected']}→{s['observed']}" for s in summary["substituted"]]),
            ("extra", summary["extra"]),
        )
        if names
    ]
    cells: list[list[Cell | Td]] = []
    classes: list[str] = []
    shown = display_rows(rows)
    previous_group = None
    for i, row in enumerate(shown):
        group = row["group"]
        moved = row["moved_to"] is not None or row["moved_from"] is not None
        css = [f"op-{row['op']}"] + (["moved"] if moved else []) + (["group"] if group is not None else [])
        classes.append(" ".join(css))
        expected: Cell = Markup("—")
        if row["expected"] is not None:
            expected = Markup(f'<span class="id">{_esc(row["expected"])}</span>')
            if group is not None and group != previous_group:
                expected = Markup(expected + tag(f"group {group}: any order", "group"))
            if row["moved_to"] is not None:
                expected = Markup(expected + tag(f"moved: ran at row {row['moved_to'] + 1}", "moved"))
        # an expected step that ran elsewhere (moved) was not performed *here*: its tag says where
        observed: Cell = Markup(
            "not performed" if row["expected"] is not None and row["moved_to"] is None else "—"
        )
        if row["observed"] is not None:
            observed = Markup(f'<span class="id">{_esc(row["observed"])}</span>')
            if row["moved_from"] is not None:
                observed = Markup(observed + tag(f"moved: expected at row {row['moved_from'] + 1}", "moved"))
        previous_group = group
        label = "moved" if moved and row["op"] in ("delete", "insert") else OP_LABELS[row["op"]]
        cells.append(
            [
                i + 1,
                Td(expected, "expected step" + (" none" if row["expected"] is None else "")),
                Td(observed, "observed step" + (" none" if row["observed"] is None else "")),
                tag(label, "moved" if label == "moved" else row["op"]),
                Markup(f'<span class="id">{_esc(row["span_id"] or "")}</span>'),
            ]
        )
    head = f"<h2>Expected vs observed ({_esc(data['scoring_method'] or '')})</h2>"
    if said:
        head += f"<p>{_esc('; '.join(said))}</p>"
    table_html = table(["#", "expected", "observed", "operation", "span id"], cells, classes)
    return [Markup(head), Markup(table_html.replace("<table>", '<table class="alignment">', 1))]


OP_LABELS = {"match": "match", "substitute": "substitute", "delete": "missing", "insert": "extra"}


def display_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The alignment rows as the page shows them: a substitution with a moved side is two rows, the
    expected step with no observed partner and the observed step with none, since half of it
    belongs to a move (the summary counts it so). `moved_to` / `moved_from` are re-pointed at the
    shown rows: moved_to on an expected half names the row its step ran in, moved_from on an
    observed half the row it was expected in."""
    shown: list[dict[str, Any]] = []
    expected_at: dict[int, int] = {}
    observed_at: dict[int, int] = {}
    for i, row in enumerate(rows):
        split = row["op"] == "substitute" and (row["moved_to"] is not None or row["moved_from"] is not None)
        if split:
            expected_at[i] = len(shown)
            shown.append({**row, "op": "delete", "observed": None, "observed_index": None, "span_id": None})
            observed_at[i] = len(shown)
            shown.append({**row, "op": "insert", "expected": None, "group": None})
        else:
            expected_at[i] = observed_at[i] = len(shown)
            shown.append(dict(row))
    for i, row in enumerate(rows):
        expected_half, observed_half = shown[expected_at[i]], shown[observed_at[i]]
        expected_half["moved_to"] = observed_at[row["moved_to"]] if row["moved_to"] is not None else None
        observed_half["moved_from"] = (
            expected_at[row["moved_from"]] if row["moved_from"] is not None else None
        )
        if expected_at[i] != observed_at[i]:
            expected_half["moved_from"] = None
            observed_half["moved_to"] = None
    return shown


def _rules(data: dict[str, Any]) -> list[Cell]:
    rules = data["failed_rules"]
    if rules is None:
        return []
    if not rules:
        return [Markup("<h2>Rules</h2><p>every rule held</p>")]
    return [
        Markup("<h2>Failed rules</h2>"),
        table(
            ["rule", "reason", "step", "span id"],
            [[r["rule"], r["reason"], r["step_index"], r["span_id"]] for r in rules],
        ),
    ]


def _judges(data: dict[str, Any]) -> list[Cell]:
    parts: list[Cell] = []
    for judged in data["judges"]:
        parts.append(Markup(f"<h2>Judge: {_esc(judged['metric'])}</h2>"))
        if judged.get("expected_steps") is not None:
            parts.append(
                table(
                    ["#", "expected step", "p(performed)", "performed", "evidence", "span id"],
                    [
                        [
                            v["index"],
                            v["step"],
                            f"{v['p_performed']:.2f}",
                            "yes" if v["performed"] else "no",
                            v["evidence_step"],
                            v["span_id"],
                        ]
                        for v in judged["expected_steps"]
                    ],
                )
            )
            if judged.get("p_order") is not None:
                parts.append(Markup(f"<p>p(order) {judged['p_order']:.2f}</p>"))
        if judged.get("plan") is not None:
            parts.append(
                table(
                    ["#", "plan item", "verdict", "reason"],
                    [[p["index"], p["step"], p["status"], p["reason"]] for p in judged["plan"]],
                )
            )
        if judged.get("off_plan"):
            parts.append(Markup("<p>off-plan steps</p>"))
            parts.append(
                table(
                    ["#", "step", "reason"],
                    [[o["index"], o["step"], o["reason"]] for o in judged["off_plan"]],
                )
            )
        if judged.get("out_of_order"):
            parts.append(Markup("<p>out of order</p>"))
            parts.append(
                table(["plan item", "reason"], [[o["step"], o["reason"]] for o in judged["out_of_order"]])
            )
    return parts


def _steps(data: dict[str, Any]) -> list[Cell]:
    steps = data["steps"]
    if not steps:
        return []
    head = ["#", "span id", "name", "step kind", "span kind", "offset ms", "duration ms"]
    if data["content_shown"]:
        head += ["input", "output"]
    rows: list[list[Cell]] = []
    for s in steps:
        row: list[Cell] = [
            s["index"],
            Markup(f'<span class="id">{_esc(s["span_id"] or "")}</span>'),
            s["name"],
            s["step_kind"],
            s["span_kind"],
            s["offset_ms"],
            s["duration_ms"],
        ]
        if data["content_shown"]:
            row += [_content(s.get("input")), _content(s.get("output"))]
        rows.append(row)
    note = (
        ""
        if data["content_shown"]
        else ' <span class="muted">(inputs and outputs withheld: privacy.include_content is off)</span>'
    )
    return [Markup(f"<h2>Spans that became steps{note}</h2>"), table(head, rows)]


def _content(value: Any) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 500 else text[:499] + "…"


def _esc(value: Any) -> str:
    return esc(str(value))
