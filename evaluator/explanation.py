"""One structured explanation per score: why a partition scored what it did, for every surface.

Built once at scoring time and carried on `ScoreResult.structured`, so the OTel event, the Kafka
event, the log line, the debug pages and `stepwatch score --format json` all read the same answer
(docs/score-events.md). Two layers, because scoring is the hot path and most explanations are never
read:

- `Explanation` (plain, slotted): what a scorer hands over, holding references to what it already
  computed (the alignment's entries, the observed steps, the rule outcomes). Rows, the summary and
  the reason line are derived on first use and cached.
- `ScoreExplanation` (pydantic, versioned): the edge model every stream serialises, validated once
  per result when an exporter first asks (`Explanation.model()`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from .model import Step, normalise_tool_name

if TYPE_CHECKING:
    from .results import ScoreResult

EXPLANATION_VERSION: Final = 1
"""Bumped only on a breaking change of ScoreExplanation (a field removed, renamed or retyped)."""
REASON_MAX_CHARS: Final = 200
"""The reason line's bound: it goes into log lines and OTel attributes."""

Op = Literal["match", "substitute", "insert", "delete"]
StepOutcome = Literal["matched", "missing", "moved", "substituted"]
"""What became of one expected step (StepAccuracyExplanation.expected_outcomes): each expected step
that went wrong is in exactly one of StepSummary's lists, and `matched` otherwise."""


class _Edge(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AlignmentRow(_Edge):
    """One row of the agent.step_accuracy alignment, in alignment order."""

    op: Op
    expected: str | None = Field(description="Expected step or group member; null for an insert.")
    observed: str | None = Field(description="Observed step name; null for a delete.")
    observed_index: int | None = Field(description="Index into the observed steps (after ignore_steps).")
    span_id: str | None = Field(description="Span id of the observed step, when known.")
    group: int | None = Field(description="Expected-token index of the group window; null for a bare step.")
    moved_to: int | None = Field(
        description="This row's expected step ran elsewhere: the row holding that observed step."
    )
    moved_from: int | None = Field(
        description="This row's observed step was expected elsewhere: the row holding that expected step."
    )


class Substitution(_Edge):
    expected: str
    observed: str


class StepSummary(_Edge):
    """Derived from the rows: each expected step that went wrong is in exactly one list."""

    missing: list[str] = Field(description="Expected steps never performed.")
    extra: list[str] = Field(description="Observed steps not expected anywhere.")
    moved: list[str] = Field(
        description="Expected steps performed, but out of order (one move, not two edits)."
    )
    substituted: list[Substitution] = Field(description="An unexpected step where an expected one should be.")


class FailedRule(_Edge):
    rule: str = Field(
        description="The rule as one line, e.g. `must_call: issue_refund after verify_identity`."
    )
    reason: str
    step_index: int | None = Field(
        description="The offending step (0-based, trajectory order), when one exists."
    )
    span_id: str | None = Field(description="That step's span id, when known.")


class ExpectedStepVerdict(_Edge):
    index: int
    step: str
    p_performed: float
    performed: bool
    evidence_index: int | None = Field(description="The trajectory item the judge named as doing it.")
    evidence_step: str | None
    span_id: str | None


class PlanItemVerdict(_Edge):
    index: int
    step: str
    status: Literal["full", "partial", "missed"]
    reason: str | None


class OffPlanStep(_Edge):
    index: int
    step: str
    reason: str


class OutOfOrderPlanStep(_Edge):
    step: str
    reason: str


class ScoreExplanation(_Edge):
    """The structured explanation of one score, as every stream carries it (`explanation_detail`).

    Fields that do not belong to the metric are null.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", title="StepwatchScoreExplanation")

    version: Literal[1] = Field(default=EXPLANATION_VERSION, description="ScoreExplanation schema version.")
    metric: str
    reason: str = Field(
        description=f"One line for people, at most {REASON_MAX_CHARS} characters; empty when nothing is wrong."
    )
    alignment: list[AlignmentRow] | None = Field(default=None, description="agent.step_accuracy")
    summary: StepSummary | None = Field(default=None, description="agent.step_accuracy")
    failed_rules: list[FailedRule] | None = Field(default=None, description="trajectory")
    expected_steps: list[ExpectedStepVerdict] | None = Field(default=None, description="trajectory_steps")
    p_order: float | None = Field(default=None, description="trajectory_steps")
    plan: list[PlanItemVerdict] | None = Field(default=None, description="plan_adherence")
    off_plan: list[OffPlanStep] | None = Field(default=None, description="plan_adherence")
    out_of_order: list[OutOfOrderPlanStep] | None = Field(default=None, description="plan_adherence")


def bound(text: str, limit: int = REASON_MAX_CHARS) -> str:
    """`text` cut to `limit` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Explanation:
    """The lazy explanation a scorer returns; subclasses derive `parts` from what they hold."""

    __slots__ = ("_model", "_parts", "_reason", "metric")

    version: Final = EXPLANATION_VERSION

    def __init__(self, metric: str) -> None:
        self.metric = metric
        self._parts: dict[str, Any] | None = None
        self._reason: str | None = None
        self._model: ScoreExplanation | None = None

    def _derive(self) -> tuple[dict[str, Any], str]:
        """(ScoreExplanation fields other than version/metric/reason, the unbounded reason)."""
        raise NotImplementedError

    def parts(self) -> dict[str, Any]:
        """The metric's fields as plain values (lists of dicts), derived once."""
        if self._parts is None:
            self._parts, reason = self._derive()
            self._reason = bound(reason)
        return self._parts

    @property
    def reason(self) -> str:
        """The one-line reason, at most REASON_MAX_CHARS; "" when nothing went wrong."""
        if self._reason is None:
            self.parts()
        return self._reason  # type: ignore[return-value]  # set by parts()

    def model(self) -> ScoreExplanation:
        """The validated edge model, built once."""
        if self._model is None:
            self._model = ScoreExplanation.model_validate(
                {"version": EXPLANATION_VERSION, "metric": self.metric, "reason": self.reason, **self.parts()}
            )
        return self._model

    def as_json(self) -> dict[str, Any]:
        """What every stream carries: the edge model as JSON values."""
        return self.model().model_dump(mode="json")

    def __eq__(self, other: object) -> bool:
        if other is self:  # a copied result shares its explanation: nothing to derive
            return True
        if not isinstance(other, Explanation):
            return NotImplemented
        return self.metric == other.metric and self.parts() == other.parts() and self.reason == other.reason

    __hash__ = None  # type: ignore[assignment]  # mutable cache, compared by value

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.metric!r}, reason={self.reason!r})"


def _names_match(expected: str, step: Step) -> bool:
    """step-accuracy.txt rule 3 (alignment.names_match, without importing the scorer package)."""
    return (normalise_tool_name(expected) if step.kind == "TOOL" else expected) == step.key


def _join(label: str, names: Sequence[str]) -> str | None:
    return f"{label}: {', '.join(names)}" if names else None


class StepAccuracyExplanation(Explanation):
    """agent.step_accuracy: the alignment entries (the metadata's `steps`) and the observed steps
    they index, held by reference; rows with span ids and moves are derived on first use."""

    __slots__ = ("_entries", "_observed", "_trailing_from")

    def __init__(
        self,
        metric: str,
        entries: Sequence[dict[str, Any]],
        observed: Sequence[Step],
        trailing_from: int | None,
    ) -> None:
        """`trailing_from`: under strict_position, the first observed index past the expected
        steps (those steps are extra, with no entry of their own); None under edit_distance."""
        super().__init__(metric)
        self._entries = entries
        self._observed = observed
        self._trailing_from = trailing_from

    def _derive(self) -> tuple[dict[str, Any], str]:
        observed = self._observed
        rows: list[dict[str, Any]] = []
        for entry in self._entries:
            index = entry["observed_index"]
            rows.append(
                {
                    "op": entry["op"],
                    "expected": entry["expected"],
                    "observed": entry["actual"],
                    "observed_index": index,
                    "span_id": observed[index].span_id if index is not None else None,
                    "group": entry.get("group"),
                    "moved_to": None,
                    "moved_from": None,
                }
            )
        if self._trailing_from is not None:
            for index in range(self._trailing_from, len(observed)):
                step = observed[index]
                rows.append(
                    {
                        "op": "insert",
                        "expected": None,
                        "observed": step.name,
                        "observed_index": index,
                        "span_id": step.span_id,
                        "group": None,
                        "moved_to": None,
                        "moved_from": None,
                    }
                )
        summary = _summarise(rows, observed)
        reason = "; ".join(
            part
            for part in (
                _join("missing", summary["missing"]),
                _join("moved", summary["moved"]),
                _join("substituted", [f"{s['expected']}→{s['observed']}" for s in summary["substituted"]]),
                _join("extra", summary["extra"]),
            )
            if part is not None
        )
        return {"alignment": rows, "summary": summary}, reason

    @property
    def summary(self) -> dict[str, Any]:
        """missing / extra / moved / substituted, as plain values."""
        return self.parts()["summary"]  # type: ignore[no-any-return]

    def expected_outcomes(self) -> list[tuple[str, StepOutcome]]:
        """(expected step or group member, what became of it) for every expected step, in
        alignment order: the per-step metric's observations, for every scored partition. Read off
        the entries and the moves (_moves) without laying out the rows, which cost ~10x more."""
        entries = self._entries
        if all(entry["op"] == "match" for entry in entries):
            return [(entry["expected"], "matched") for entry in entries]
        ops = [(entry["op"], entry["expected"], entry["observed_index"]) for entry in entries]
        if self._trailing_from is not None:  # strict_position's extra steps: rows of their own
            ops += [("insert", None, index) for index in range(self._trailing_from, len(self._observed))]
        moved_to, moved_from = _moves(ops, self._observed)
        outcomes: list[tuple[str, StepOutcome]] = []
        for i, (op, expected, _) in enumerate(ops):
            if expected is None:  # an insert: no expected step
                continue
            if op == "match":
                outcomes.append((expected, "matched"))
            elif i in moved_to:
                outcomes.append((expected, "moved"))
            elif op == "delete" or i in moved_from:
                outcomes.append((expected, "missing"))  # as _summarise: its partner ran elsewhere
            else:
                outcomes.append((expected, "substituted"))
        return outcomes


def _moves(
    rows: Sequence[tuple[str, str | None, int | None]], observed: Sequence[Step]
) -> tuple[dict[int, int], dict[int, int]]:
    """Pair each unmatched expected step (a delete's, or a substitute's expected side) with the
    first free unmatched observed step of the same name (an insert's, or a substitute's observed
    side) in another row: a move. `rows`: (op, expected, observed index) in alignment order.
    Returns (row -> the row that ran its expected step, row -> the row that expected its step)."""
    free = [
        i for i, (op, _, index) in enumerate(rows) if op in ("insert", "substitute") and index is not None
    ]
    moved_to: dict[int, int] = {}
    moved_from: dict[int, int] = {}
    for i, (op, expected, _) in enumerate(rows):
        if op not in ("delete", "substitute"):
            continue
        for position, j in enumerate(free):
            if j != i and _names_match(expected, observed[rows[j][2]]):  # type: ignore[arg-type,index]
                moved_to[i] = j
                moved_from[j] = i
                del free[position]
                break
    return moved_to, moved_from


def _summarise(rows: list[dict[str, Any]], observed: Sequence[Step]) -> dict[str, Any]:
    """Sets the rows' moved_to/moved_from (_moves); what is left is missing, extra or substituted."""
    moved_to, _ = _moves([(r["op"], r["expected"], r["observed_index"]) for r in rows], observed)
    for i, j in moved_to.items():
        rows[i]["moved_to"] = j
        rows[j]["moved_from"] = i
    missing: list[str] = []
    extra: list[str] = []
    moved: list[str] = []
    substituted: list[dict[str, str]] = []
    for row in rows:
        op = row["op"]
        if op == "match":
            continue
        expected_moved = row["moved_to"] is not None
        observed_moved = row["moved_from"] is not None
        if expected_moved:
            moved.append(row["expected"])
        if op == "delete":
            if not expected_moved:
                missing.append(row["expected"])
        elif op == "insert":
            if not observed_moved:
                extra.append(row["observed"])
        elif not expected_moved and not observed_moved:
            substituted.append({"expected": row["expected"], "observed": row["observed"]})
        elif not expected_moved:
            missing.append(row["expected"])
        elif not observed_moved:
            extra.append(row["observed"])
    return {"missing": missing, "extra": extra, "moved": moved, "substituted": substituted}


class RulesExplanation(Explanation):
    """trajectory: the failed rules, as (rule text, reason, offending step index) triples, and the
    span ids of the trajectory's steps (None where a step's span is not known)."""

    __slots__ = ("_failed", "_span_ids")

    def __init__(
        self, metric: str, failed: Sequence[tuple[str, str, int | None]], span_ids: Sequence[str | None]
    ) -> None:
        super().__init__(metric)
        self._failed = failed
        self._span_ids = span_ids

    def _derive(self) -> tuple[dict[str, Any], str]:
        spans = self._span_ids
        rules = [
            {
                "rule": rule,
                "reason": reason,
                "step_index": index,
                "span_id": spans[index] if index is not None and index < len(spans) else None,
            }
            for rule, reason, index in self._failed
        ]
        return {"failed_rules": rules}, "; ".join(reason for _, reason, _ in self._failed)

    def failed_rule_names(self) -> list[str]:
        """Each failed rule as one line (`must_call: check_budget`), without deriving the rows."""
        return [rule for rule, _, _ in self._failed]


def tool_span_ids(steps: Sequence[Step], tools: Sequence[str]) -> list[str | None]:
    """Span id per trajectory step: the trajectory's tool calls are the partition's TOOL steps in
    the same order; a step whose name disagrees (a different extraction) gets None, not a guess."""
    tool_steps = [step for step in steps if step.kind == "TOOL"]
    if len(tool_steps) != len(tools):
        return [None] * len(tools)
    return [
        step.span_id if step.key == normalise_tool_name(tool) else None
        for step, tool in zip(tool_steps, tools, strict=True)
    ]


class ValuesExplanation(Explanation):
    """An explanation whose fields a judge scorer already holds as plain values (not the hot path)."""

    __slots__ = ("_text", "_values")

    def __init__(self, metric: str, values: dict[str, Any], reason: str) -> None:
        super().__init__(metric)
        self._values = values
        self._text = reason

    def _derive(self) -> tuple[dict[str, Any], str]:
        return self._values, self._text


def trajectory_steps_explanation(
    metric: str,
    details: Sequence[dict[str, Any]],
    p_order: float | None,
    trajectory: Sequence[str],
    own_steps: Sequence[Step] | None,
    reason: str | None = None,
) -> ValuesExplanation:
    """trajectory_steps: per expected step p(performed) and the evidence step, and p(order).
    `own_steps`: the partition's steps when the trajectory is rendered from them (then the evidence
    is named by the step's name and span id, not the rendering with its arguments); `reason`:
    instead of the derived one (an abstention names the undecided steps)."""
    verdicts = []
    for row in details:
        evidence: int | None = row.get("evidence_index")
        if evidence is not None and not 0 <= evidence < len(trajectory):
            evidence = None
        step = own_steps[evidence] if evidence is not None and own_steps is not None else None
        verdicts.append(
            {
                "index": row["index"],
                "step": row["step"],
                "p_performed": row["probability"],
                "performed": row.get("performed", row["probability"] >= 0.5),
                "evidence_index": row.get("evidence_index"),
                "evidence_step": (
                    step.name if step is not None else trajectory[evidence] if evidence is not None else None
                ),
                "span_id": step.span_id if step is not None else None,
            }
        )
    missing = [v["step"] for v in verdicts if not v["performed"]]
    parts = [_join("missing", missing)]
    if p_order is not None and p_order < 0.5:
        parts.append(f"out of order (p_order {p_order:.2f})")
    if reason is None:
        reason = "; ".join(p for p in parts if p is not None)
    return ValuesExplanation(metric, {"expected_steps": verdicts, "p_order": p_order}, reason)


def plan_explanation(
    metric: str,
    plan: Sequence[str],
    verdicts: Sequence[tuple[Literal["full", "partial", "missed"], str | None]],
    off_plan: Sequence[dict[str, Any]],
    out_of_order: Sequence[dict[str, Any]],
    steps: Sequence[str],
) -> ValuesExplanation:
    """plan_adherence: each plan item's verdict (status, reason), the off-plan steps (the metadata's
    `incorrect_span_indexes`, indexing `steps`) and the out-of-order ones."""
    items: list[dict[str, Any]] = [
        {"index": index, "step": text, "status": status, "reason": why}
        for index, (text, (status, why)) in enumerate(zip(plan, verdicts, strict=True))
    ]
    off = [{"index": row["index"], "step": steps[row["index"]], "reason": row["reason"]} for row in off_plan]
    late = [{"step": row["step"], "reason": row["reason"]} for row in out_of_order]
    reason = "; ".join(
        part
        for part in (
            _join("missed", [i["step"] for i in items if i["status"] == "missed"]),
            _join("partial", [i["step"] for i in items if i["status"] == "partial"]),
            _join("out of order", [row["step"] for row in late]),
            _join("off-plan", [row["step"] for row in off]),
        )
        if part is not None
    )
    return ValuesExplanation(metric, {"plan": items, "off_plan": off, "out_of_order": late}, reason)


def reason_of(result: ScoreResult) -> str:
    """The line an operator reads first: the error, else the structured reason, else why it was
    not scored, else the scorer's free text (metrics without a structured explanation), bounded."""
    if result.error is not None:
        return bound(result.error)
    if result.structured is not None and result.structured.reason:
        return result.structured.reason
    if result.not_scored is not None:
        return bound(result.not_scored)
    if result.structured is None and result.explanation:
        return bound(result.explanation)
    return ""


def failure_reasons(results: Sequence[ScoreResult]) -> dict[str, str]:
    """metric -> reason line, for the results that failed or errored only: what the per-partition
    log line carries (deriving a passing score's explanation there would cost every partition)."""
    return {
        result.metric: reason_of(result)
        for result in results
        if result.outcome in ("fail", "error") and reason_of(result)
    }


class LazyReasons:
    """`failure_reasons(results)` when called: a log field that stepwatch.logs resolves only for a
    line it writes, so a failing partition whose line the rate limit suppresses derives nothing."""

    __slots__ = ("_results",)

    def __init__(self, results: Sequence[ScoreResult]) -> None:
        self._results = results

    def __call__(self) -> dict[str, str]:
        return failure_reasons(self._results)
