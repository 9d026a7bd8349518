"""plan_adherence (plan-adherence.txt): did the agent follow the intended plan? Score 0-100.

Questions (K plan steps, N processed steps): per plan step "the trajectory fully carries it out"
(full_i), and per (plan step i, processed step j) "step j carries out (part of) plan step i" (c_ij).
Statuses (0.5 cut-offs): plan step i is full when full_i >= 0.5, else partial when
max_j c_ij >= 0.5, else missed; tool/agent step j is off-plan when max_i c_ij < 0.5. Plan step i
is placed at the first step j with c_ij >= 0.5, and is out of order when it was issued in an
earlier decision round (Step.round_id) than a plan step before it; steps of one round were issued
in parallel and are never out of order.
  C = mean_i credit_i, credit full 1 / partial 0.5 / missed 0          plan completeness
  O = off-plan steps / tool-and-agent steps                              off-plan share
  R = 1 − out_of_order / max(1, placed plan steps − 1)                   ordering
  score = 100 × C × (1 − 0.5 × O) × (1 − 0.5 × (1 − R))
so the score is 100 exactly when nothing is listed in the metadata. The final reply is a
processed step (it can carry out "suggest activities") but is never off-plan, and it is not an
actionable step: a trace whose only processed step is its reply fails, as the spec says; so is an
agent step whose span only wraps the model's reply (`_reply_only_agents`).

Requests: the questions about one plan step (its N c_ij and full_i) form one request group, so a
remote judge gets K requests per trace (the Tokyo example: 4, not K × (N + 1) = 12).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..explanation import plan_explanation
from ..judge.base import Answer, JudgeBatch, Question
from ..judge.local import ABSTAIN_REASON, answer_accuracy, is_weak
from ..judge.render import render_step
from ..judge.runner import JudgeRunner
from ..plan import last_reply, plan_from_expected, plan_from_prompts, prompt_messages
from ..results import ScoreResult
from ..steps import embedded_tool_calls
from .base import ScoringInput

METRIC = "plan_adherence"
DEFAULT_THRESHOLD = 80.0
OFF_PLAN_WEIGHT = 0.5
ORDER_WEIGHT = 0.5
FINAL_ANSWER_PREFIX = "final answer: "
MAX_FINAL_ANSWER_CHARS = 600


@dataclass(frozen=True, slots=True)
class Processed:
    """The processed trace: judge-readable steps, their decision rounds, which one is the answer."""

    steps: list[str]
    rounds: list[int]
    final_answer_index: int | None
    replies: frozenset[int] = frozenset()
    """Indices of agent steps that only replied (see `_reply_only_agents`): processed, never
    actionable, never off-plan, like the final answer."""

    @property
    def actionable(self) -> list[int]:
        """Indices of the actionable steps: every processed step but the answer and the replies."""
        return [j for j in range(len(self.steps)) if j != self.final_answer_index and j not in self.replies]


def _container_agents(inp: ScoringInput) -> set[str]:
    """Span ids of AGENT steps with other steps beneath them: the agent doing the work, not work."""
    parent = {span.span_id: span.parent_span_id for span in inp.partition.spans}
    agents = {step.span_id for step in inp.steps if step.kind == "AGENT" and step.span_id}
    containers: set[str] = set()
    for step in inp.steps:
        ancestor = parent.get(step.span_id or "")
        seen: set[str] = set()
        while ancestor and ancestor not in seen:
            seen.add(ancestor)
            if ancestor in agents:
                containers.add(ancestor)
            ancestor = parent.get(ancestor)
    return containers


def _reply_only_agents(inp: ScoringInput, containers: set[str]) -> set[str]:
    """Span ids of leaf AGENT steps whose spans hold spans, none of them a step or an LLM output
    that issued a tool call: an agent wrapper around the model's reply, which did no work of its
    own. (An agent span with nothing beneath it is a sub-agent run as a unit: actionable.)"""
    candidates = {
        step.span_id
        for step in inp.steps
        if step.kind == "AGENT" and step.span_id and step.span_id not in containers
    }
    if not candidates:
        return set()
    step_spans = {step.span_id for step in inp.steps if step.span_id}
    by_id = {span.span_id: span for span in inp.partition.spans}
    children: dict[str, list[str]] = {}
    for span in inp.partition.spans:
        if span.parent_span_id is not None:
            children.setdefault(span.parent_span_id, []).append(span.span_id)
    replied: set[str] = set()
    for agent in candidates:
        below = list(children.get(agent, ()))
        if not below:
            continue
        seen: set[str] = set()
        work = False
        while below and not work:
            span_id = below.pop()
            if span_id in seen:
                continue
            seen.add(span_id)
            work = span_id in step_spans or bool(embedded_tool_calls(by_id[span_id]))
            below.extend(children.get(span_id, ()))
        if not work:
            replied.add(agent)
    return replied


def processed_steps(inp: ScoringInput) -> Processed:
    """Actionable steps in execution order, then the agent's final reply; rounds by first issue.

    Actionable: tool calls, and agent steps that are leaves (handoffs, sub-agents run as a
    unit); an agent whose span holds other steps is their container and is left out. A leaf agent
    whose span holds only the model's reply (no step, no tool call issued) is kept as a processed
    step (it may carry out a plan step such as "suggest activities") but, like the final reply, is
    not actionable: a trace whose only non-LLM span is such a wrapper has no actionable steps.
    """
    containers = _container_agents(inp)
    kept = [step for step in inp.steps if step.span_id is None or step.span_id not in containers]
    reply_only = _reply_only_agents(inp, containers)
    replies = frozenset(
        j for j, step in enumerate(kept) if step.span_id is not None and step.span_id in reply_only
    )
    steps = [render_step(step) for step in kept]
    round_numbers: dict[str, int] = {}
    rounds: list[int] = []
    for index, step in enumerate(kept):
        key = step.round_id if step.round_id is not None else f"\x00step{index}"
        rounds.append(round_numbers.setdefault(key, len(round_numbers)))
    final = inp.trajectory.final_output or last_reply(inp.partition)
    final_index = None
    if isinstance(final, str) and final.strip():
        final_index = len(steps)
        steps.append(FINAL_ANSWER_PREFIX + final.strip()[:MAX_FINAL_ANSWER_CHARS])
        rounds.append(len(round_numbers))
    return Processed(steps, rounds, final_index, replies)


def resolve_plan(inp: ScoringInput) -> tuple[list[str], str] | str:
    """(plan steps, source) or the spec's failure reason."""
    raw: Any = inp.extras.get("expected_plan")
    if raw is None and inp.expectation is not None:
        raw = inp.expectation.expected_plan
    if raw is not None and raw != "":
        if not isinstance(raw, str):
            return f"expected_plan must be free text, not {type(raw).__name__}"
        steps = plan_from_expected(raw)
        if not steps:
            return "expected_plan is provided but empty: it holds no plan steps"
        return steps, "expected_plan"
    messages = prompt_messages(inp.partition)
    if not messages:
        return "no system or user prompts found in the trace, and no expected_plan given"
    steps, role = plan_from_prompts(messages)
    if not steps:
        return "no plan steps could be resolved: the system and user prompts hold no explicit plan"
    return steps, f"{role}_prompt"


def plan_questions(plan: list[str], steps: list[str]) -> list[Question]:
    """K `full_i` questions, then the K × N `c_ij` (i major); group `plan{i}` per plan step."""
    questions = [
        Question(
            id=f"full{i}",
            kind="fully_accomplishes",
            text=f"The steps in the trajectory together fully carry out “{step}”, not just part of it.",
            refs=("trajectory", "plan_steps"),
            args={"target": "plan_steps", "index": i},
            group=f"plan{i}",
        )
        for i, step in enumerate(plan)
    ]
    questions += [
        Question(
            id=f"c{i}.{j}",
            kind="contributes",
            text=f"Trajectory step {j + 1} carries out “{plan[i]}” or a part of it.",
            refs=("trajectory", "plan_steps"),
            args={"target": "plan_steps", "step": i, "index": j},
            group=f"plan{i}",
        )
        for i in range(len(plan))
        for j in range(len(steps))
    ]
    return questions


def _quote(text: str, limit: int = 80) -> str:
    return f"“{text if len(text) <= limit else text[: limit - 1] + '…'}”"


class PlanAdherenceScorer:
    """AsyncScorer `plan_adherence`; `runner` holds the judge and its governor."""

    name = METRIC

    def __init__(self, runner: JudgeRunner | None = None, threshold: float | None = None) -> None:
        self.runner = runner or JudgeRunner()
        self.threshold = threshold

    def applicable(self, inp: ScoringInput) -> bool:
        """When asked for by name: the task's `judge.scorers` (or `scorers:`, or `--scorer`), or an
        inline dataset row's own `expected_plan`. A registered plan alone does not turn it on;
        without a plan the plan comes from the prompts (a trace without one is an error result,
        as the spec says)."""
        expectation = inp.expectation
        if expectation is not None and expectation.scorers is not None and METRIC in expectation.scorers:
            return True  # named outright (`--scorer`)
        settings = expectation.judge if expectation else None
        if settings is not None and settings.scorers is not None:
            return METRIC in settings.scorers
        return "expected_plan" in inp.extras

    def _threshold(self, inp: ScoringInput) -> float:
        if self.threshold is not None:
            return self.threshold
        if inp.expectation is not None:
            return inp.expectation.thresholds.get(METRIC, DEFAULT_THRESHOLD)
        return DEFAULT_THRESHOLD

    async def score(self, inp: ScoringInput) -> ScoreResult:
        if not inp.partition.spans:
            return ScoreResult(metric=METRIC, error="the trace is not a non-empty list of spans")
        resolved = resolve_plan(inp)
        if isinstance(resolved, str):
            return ScoreResult(metric=METRIC, error=resolved)
        plan, source = resolved
        processed = processed_steps(inp)
        if not processed.actionable:
            return ScoreResult(metric=METRIC, error="the trace has no actionable steps to score")
        batch = JudgeBatch(
            state={"trajectory": processed.steps, "plan_steps": plan},
            questions=plan_questions(plan, processed.steps),
        )
        answers = await self.runner.ask(
            METRIC,
            batch,
            task_key=inp.partition.task_key,
            partition_id=inp.partition.id,
            settings=inp.expectation.judge if inp.expectation else None,
        )
        if isinstance(answers, ScoreResult):
            return answers
        k, n = len(plan), len(processed.steps)
        p = [answer.p for answer in answers]
        full = p[:k]
        matrix = [p[k + i * n : k + (i + 1) * n] for i in range(k)]
        result = self._result(plan, source, processed, full, matrix, self._threshold(inp), answers)
        if answers and all(answer.source == "lexical" for answer in answers):
            return self._lexical(result, plan, source, processed, full, matrix, answers)
        return result

    def _lexical(
        self,
        result: ScoreResult,
        plan: list[str],
        source: str,
        processed: Processed,
        full: list[float],
        matrix: list[list[float]],
        answers: list[Answer],
    ) -> ScoreResult:
        """The local judge's result, honest about its evidence: no score when its weak answers to
        "step j carries out plan step i" (judge.local.is_weak) decide pass or fail (all of them no
        vs all yes; whether a done step was done fully or partly is a half credit, not a verdict
        on its own), else `confidence` is the measured accuracy of the least sure answer that
        decided a plan step's status."""
        threshold = result.threshold if result.threshold is not None else DEFAULT_THRESHOLD

        def passes(value: float) -> bool:
            rows = [[value if is_weak(p) else p for p in row] for row in matrix]
            return self._result(plan, source, processed, full, rows, threshold, answers).passed is True

        if any(is_weak(p) for row in matrix for p in row) and passes(0.0) != passes(1.0):
            self.runner.governor.counters["abstained"] += 1
            weak = [plan[i] for i in range(len(plan)) if any(is_weak(p) for p in matrix[i])]
            return ScoreResult(
                metric=METRIC,
                not_scored=ABSTAIN_REASON,
                threshold=threshold,
                explanation="no lexical evidence either way for "
                + (", ".join(_quote(step) for step in weak) or "the steps' contributions"),
                metadata={
                    "judge": self.runner.judge.backend,
                    "judge_outcome": "abstained",
                    "plan_steps": dict(enumerate(plan)),
                    "undecided_steps": weak,
                    "processed_steps": processed.steps,
                    "confidence": 0.0,
                },
            )
        deciding = [full[i] if full[i] >= 0.5 else max(matrix[i], default=0.0) for i in range(len(plan))]
        confidence = min(answer_accuracy(p) for p in deciding) if deciding else 0.0
        metadata = {
            **result.metadata,
            "confidence": confidence,
            "confidence_basis": "measured local-judge accuracy",
        }
        return result.model_copy(update={"metadata": metadata})

    def _result(
        self,
        plan: list[str],
        source: str,
        processed: Processed,
        full: list[float],
        matrix: list[list[float]],
        threshold: float,
        answers: list[Answer],
    ) -> ScoreResult:
        steps, rounds = processed.steps, processed.rounds
        p_any = [max(max(row, default=0.0), f) for row, f in zip(matrix, full, strict=True)]

        incorrect_plan_steps = []
        verdicts: list[tuple[Literal["full", "partial", "missed"], str | None]] = [("full", None)] * len(plan)
        for i, text in enumerate(plan):
            if full[i] >= 0.5:
                continue
            if p_any[i] >= 0.5:
                best = max(range(len(steps)), key=lambda j: matrix[i][j])
                reason = f"only partly carried out (best match: step {best} {_quote(steps[best])}, p(full) {full[i]:.2f})"
                incorrect_plan_steps.append({"step": text, "status": "partial", "reason": reason})
                verdicts[i] = ("partial", reason)
            else:
                reason = f"no step carries it out (highest p {max(matrix[i], default=0.0):.2f})"
                incorrect_plan_steps.append({"step": text, "status": "missed", "reason": reason})
                verdicts[i] = ("missed", reason)

        actionable = processed.actionable
        on_plan = {j: max(matrix[i][j] for i in range(len(plan))) for j in actionable}
        incorrect_span_indexes = [
            {"index": j, "reason": f"{_quote(steps[j])} contributes to no plan step (highest p {p:.2f})"}
            for j, p in on_plan.items()
            if p < 0.5
        ]

        placed = {
            i: next(j for j in range(len(steps)) if matrix[i][j] >= 0.5)
            for i in range(len(plan))
            if any(p >= 0.5 for p in matrix[i])
        }
        out_of_order_steps = []
        for later, j_later in placed.items():
            earlier_plan = [i for i in placed if i < later and rounds[placed[i]] > rounds[j_later]]
            if earlier_plan:
                first = earlier_plan[0]
                out_of_order_steps.append(
                    {
                        "step": plan[later],
                        "reason": f"issued (step {j_later}, round {rounds[j_later] + 1}) before plan step "
                        f"{first} {_quote(plan[first])} (step {placed[first]}, round {rounds[placed[first]] + 1})",
                    }
                )
        ordering = 1 - len(out_of_order_steps) / max(1, len(placed) - 1)
        partial = sum(1 for row in incorrect_plan_steps if row["status"] == "partial")
        completeness = (len(plan) - len(incorrect_plan_steps) + 0.5 * partial) / len(plan)
        off_plan_share = len(incorrect_span_indexes) / len(actionable) if actionable else 0.0

        score = (
            100 * completeness * (1 - OFF_PLAN_WEIGHT * off_plan_share) * (1 - ORDER_WEIGHT * (1 - ordering))
        )
        score = round(score, 2)
        metadata: dict[str, Any] = {
            "plan_steps": dict(enumerate(plan)),
            "plan_source": source,
            "completeness": round(completeness, 4),
            "off_plan_share": round(off_plan_share, 4),
            "ordering": round(ordering, 4),
            "processed_steps": steps,
            "judge": self.runner.judge.backend,
            "answers_without_logprobs": sum(answer.source == "answer_text" for answer in answers),
            **self.runner.prompt_metadata(),
        }
        if score < 100:
            metadata["incorrect_plan_steps"] = incorrect_plan_steps
            metadata["incorrect_span_indexes"] = incorrect_span_indexes
            metadata["out_of_order_steps"] = out_of_order_steps
        statuses = {
            "full": len(plan) - len(incorrect_plan_steps),
            "partial": sum(1 for s in incorrect_plan_steps if s["status"] == "partial"),
            "missed": sum(1 for s in incorrect_plan_steps if s["status"] == "missed"),
        }
        explanation = (
            f"plan of {len(plan)} from {source}: {statuses['full']} full, {statuses['partial']} partial, "
            f"{statuses['missed']} missed; {len(incorrect_span_indexes)} off-plan step(s); "
            f"{len(out_of_order_steps)} out of order → {score:.0f}/100"
        )
        if metadata["answers_without_logprobs"]:
            explanation += (
                f" · {metadata['answers_without_logprobs']} answer(s) without logprobs: read from the "
                "answer text as 1/0, not probabilities"
            )
        return ScoreResult(
            metric=METRIC,
            score=score,
            passed=score >= threshold,
            threshold=threshold,
            label=f"{score:.0f}/100",
            explanation=explanation,
            metadata=metadata,
            structured=plan_explanation(
                METRIC, plan, verdicts, incorrect_span_indexes, out_of_order_steps, steps
            ),
        )
