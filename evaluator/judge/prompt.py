"""Render one request group of a JudgeBatch into chat messages, from the versioned prompts.yaml.

A group's questions are answered on lines the model fills in, after worked examples rendered by
the same code as the real question. trajectory_steps: one evidence line per expected step
(`E2. issue refund: S2`, or `none`): the agent step that accomplishes it, so p(performed) is
p(a step) vs p(none) and the order answer is computed from the named steps' positions
(answers.order_from_positions) instead of asked: measured with Qwen2.5-Coder-1.5B, an asked
order question was right on 2 of 16 dev trajectories, the computed one on 15 (docs/judges.md).
plan_adherence: yes/no lines restating each agent step (`S2. search web: yes`).
Prompt stepwatch-judge-7 (`verdict_after_step`) has each evidence line name the nearest agent
step, restate it and only then answer (`E2. refund the customer: S3 check refund eligibility
(order id: 5512): no`): the verdict is decided with the two steps side by side, which lifted
Qwen2.5-Coder-1.5B's dev per-step accuracy from 0.878 (v5) to 0.939 (docs/judges.md).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .base import JudgeBatch, JudgeMalformed, Question
from .readable import readable_item, short_label, verdict_label

YesNo = Literal["yes", "no"]


class StepsExample(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str | None = None
    trajectory: list[str]
    expected: list[str]
    evidence: list[int]
    """Per expected step, the 1-based agent step that accomplishes it, 0 for none."""
    closest: list[int] | None = None
    """Per expected step, the agent step a `verdict_after_step` answer names before its verdict:
    the one that accomplishes it, else the one nearest to it (never 0)."""

    @model_validator(mode="after")
    def _evidence_fits(self) -> StepsExample:
        if len(self.evidence) != len(self.expected) or not all(
            0 <= n <= len(self.trajectory) for n in self.evidence
        ):
            raise ValueError("evidence needs one agent step number (0 = none) per expected step")
        if self.closest is not None and (
            len(self.closest) != len(self.expected)
            or not all(1 <= n <= len(self.trajectory) for n in self.closest)
            or any(e and e != c for e, c in zip(self.evidence, self.closest, strict=True))
        ):
            raise ValueError(
                "closest needs one agent step per expected step, the evidence step where there is one"
            )
        return self


class PlanExample(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str | None = None
    trajectory: list[str]
    plan_step: str
    answers: list[YesNo]
    full: YesNo


class PromptFile(BaseModel):
    """prompts.yaml, validated: a typo in the file fails at load, not in production answers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str
    system: str
    plan_system: str
    trajectory_steps: str
    restate_expected: bool
    yes_then_step: bool = False
    """Evidence lines answer `yes S2` / `no` (p from the yes/no token, the step after it) rather
    than `S2` / `none`."""
    """Evidence lines restate their step (`E1. look up order: S1`) rather than `E1: S1`."""
    verdict_after_step: bool = False
    """Evidence lines name the nearest agent step, restate it, then judge it:
    `E1. refund the customer: S3 check refund eligibility (order id: 5): no`. The yes/no is
    decided with the two steps side by side, as a one-pair question would be (p from the
    verdict token, the position from the digit); takes precedence over `yes_then_step`."""
    plan_step: str
    task_line: str
    trajectory_steps_examples: list[StepsExample] = Field(min_length=1)
    plan_step_examples: list[PlanExample] = Field(min_length=1)

    @model_validator(mode="after")
    def _examples_name_a_step(self) -> PromptFile:
        if self.verdict_after_step and any(ex.closest is None for ex in self.trajectory_steps_examples):
            raise ValueError("verdict_after_step: every trajectory_steps example needs `closest`")
        return self


@functools.cache
def _load(name: str) -> PromptFile:
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    return PromptFile.model_validate(yaml.safe_load(text))


def prompt_file(version: str | None = None) -> PromptFile:
    """The default prompt (prompts.yaml), or an earlier version by name (`stepwatch-judge-5`):
    earlier versions stay in prompts/VERSION.yaml so a measurement can be re-run on the prompt it
    was made with, and a deployment can pin a version while it re-checks a new default."""
    default = _load("prompts.yaml")
    if version is None or version == default.version:
        return default
    if not version.replace("-", "").replace(".", "").isalnum():
        raise ValueError(f"not a prompt version: {version!r}")
    try:
        file = _load(f"prompts/{version}.yaml")
    except FileNotFoundError:
        raise ValueError(f"no judge prompt version {version!r} (evaluator/judge/prompts/)") from None
    if file.version != version:
        raise ValueError(f"prompts/{version}.yaml says it is version {file.version!r}")
    return file


@dataclass(frozen=True, slots=True)
class RenderedGroup:
    """The messages of one request, and the answer lines it asks for (one per question, in order)."""

    messages: list[dict[str, str]]
    lines: list[str]
    """`E1. look up order` (or `E1`), `S2. search web`, `full`: each answer line up to its colon."""
    evidence: bool = False
    """E-lines are answered with the accomplishing agent step (`S2`) or `none`."""
    derived: tuple[int, ...] = ()
    """Positions in the group's questions answered by computation, not by a line (the order
    question of trajectory_steps, from the evidence positions)."""
    steps: int = 0
    """How many agent steps the lines can name (S1..S{steps})."""
    yes_then_step: bool = False
    """Evidence lines are answered `yes S2` / `no` (prompts.yaml `yes_then_step`)."""
    labels: tuple[str, ...] = ()
    """With `verdict_after_step`: what an answer restates for agent step n (labels[n - 1])."""

    @property
    def verdict_after_step(self) -> bool:
        """Evidence lines are answered `S3 <step 3 restated>: yes` (prompts.yaml `verdict_after_step`)."""
        return bool(self.labels)

    @property
    def keys(self) -> list[str]:
        """The line keys the answers are matched by (`E1`, `order`, `S2`, `full`)."""
        return [line.split(".", 1)[0] if line[:1] in "ES" and "." in line else line for line in self.lines]


def _task(template: str, task: Any) -> str:
    return template.format(input=" ".join(task.split())) if isinstance(task, str) and task.strip() else ""


def _numbered(items: Sequence[str], prefix: str) -> str:
    return "\n".join(f"{prefix}{n}. {readable_item(item)}" for n, item in enumerate(items, start=1))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _steps_user(
    file: PromptFile, task: Any, trajectory: Sequence[str], expected: Sequence[str], lines: list[str]
) -> str:
    return file.trajectory_steps.format(
        task=_task(file.task_line, task),
        steps=_numbered(trajectory, "S") or "(no steps)",
        expected="\n".join(f"E{n}. {_one_line(step)}" for n, step in enumerate(expected, start=1)),
        form="\n".join(f"{line}: {_form(file)}" for line in lines),
    )


def _form(file: PromptFile) -> str:
    if file.verdict_after_step:
        return VERDICT_FORM
    return YES_STEP_FORM if file.yes_then_step else EVIDENCE_FORM


EVIDENCE_FORM = "S? or none"
YES_STEP_FORM = "yes S? or no"
VERDICT_FORM = "S? (that step again): yes or no"
"""What the form asks on an evidence line; tests/fake_openai.py answers lines that end so."""


def _evidence(n: int, yes_then_step: bool = False) -> str:
    if yes_then_step:
        return f"yes S{n}" if n else "no"
    return f"S{n}" if n else "none"


def _verdict(trajectory: Sequence[str], closest: int, performed: bool) -> str:
    """`S3 check refund eligibility (order id: 5): no`: the nearest agent step, restated, judged."""
    return f"S{closest} {verdict_label(trajectory[closest - 1])}: {'yes' if performed else 'no'}"


def _plan_user(
    file: PromptFile, task: Any, trajectory: Sequence[str], plan_step: str, lines: list[str]
) -> str:
    return file.plan_step.format(
        task=_task(file.task_line, task),
        steps=_numbered(trajectory, "S") or "(no steps)",
        plan_step=_one_line(plan_step),
        form="\n".join(f"{line}: yes or no" for line in lines),
    )


def _filled(lines: list[str], answers: Sequence[str]) -> str:
    return "\n".join(f"{line}: {answer}" for line, answer in zip(lines, answers, strict=True))


def steps_lines(expected: Sequence[str], indices: Sequence[int], restate: bool = True) -> list[str]:
    """Evidence lines for expected-step indices."""
    return [f"E{i + 1}. {_one_line(expected[i])}" if restate else f"E{i + 1}" for i in indices]


def plan_lines(trajectory: Sequence[str], indices: Sequence[int | None]) -> list[str]:
    """Answer lines for trajectory indices (None = the `full` question)."""
    return [f"S{j + 1}. {short_label(trajectory[j])}" if j is not None else "full" for j in indices]


def _examples(file: PromptFile, kind: str) -> list[dict[str, str]]:
    turns: list[dict[str, str]] = []
    if kind == "steps":
        for ex in file.trajectory_steps_examples:
            lines = steps_lines(ex.expected, range(len(ex.expected)), file.restate_expected)
            turns.append(
                {"role": "user", "content": _steps_user(file, ex.input, ex.trajectory, ex.expected, lines)}
            )
            if file.verdict_after_step and ex.closest is not None:
                answers = [
                    _verdict(ex.trajectory, c, bool(e)) for e, c in zip(ex.evidence, ex.closest, strict=True)
                ]
            else:
                answers = [_evidence(n, file.yes_then_step) for n in ex.evidence]
            turns.append({"role": "assistant", "content": _filled(lines, answers)})
    else:
        for px in file.plan_step_examples:
            lines = plan_lines(px.trajectory, [*range(len(px.trajectory)), None])
            turns.append(
                {"role": "user", "content": _plan_user(file, px.input, px.trajectory, px.plan_step, lines)}
            )
            turns.append({"role": "assistant", "content": _filled(lines, [*px.answers, px.full])})
    return turns


def _strings(state: Any, name: str) -> list[str]:
    value = state.get(name)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise JudgeMalformed(f"state field {name!r} must be a list of strings")
    return value


def render_group(batch: JudgeBatch, indices: Sequence[int], file: PromptFile | None = None) -> RenderedGroup:
    """Messages for the questions `indices` of `batch` (one group: all step questions, or one plan step)."""
    file = file or prompt_file()
    questions: list[Question] = [batch.questions[i] for i in indices]
    kinds = {q.kind for q in questions}
    trajectory = _strings(batch.state, questions[0].refs[0])
    target = _strings(batch.state, str(questions[0].args.get("target", "")))
    task = batch.state.get("input")
    derived: tuple[int, ...] = ()
    if kinds <= {"accomplishes", "order"}:
        asked = [int(q.args["index"]) for q in questions if q.kind == "accomplishes"]
        if not asked:
            raise JudgeMalformed("an order question needs step questions in its request group")
        derived = tuple(n for n, q in enumerate(questions) if q.kind == "order")
        lines = steps_lines(target, asked, file.restate_expected)
        user = _steps_user(file, task, trajectory, target, lines)
        kind = "steps"
    elif kinds <= {"contributes", "fully_accomplishes"}:
        steps = {int(q.args["step"] if q.kind == "contributes" else q.args["index"]) for q in questions}
        if len(steps) != 1:
            raise JudgeMalformed("a plan request group must ask about exactly one plan step")
        lines = plan_lines(
            trajectory, [int(q.args["index"]) if q.kind == "contributes" else None for q in questions]
        )
        user = _plan_user(file, task, trajectory, target[steps.pop()], lines)
        kind = "plan"
    else:
        raise JudgeMalformed(f"question kinds {sorted(kinds)} cannot share one request")
    messages = [
        {"role": "system", "content": file.system if kind == "steps" else file.plan_system},
        *_examples(file, kind),
        {"role": "user", "content": user},
    ]
    return RenderedGroup(
        messages=messages,
        lines=lines,
        evidence=kind == "steps",
        derived=derived,
        steps=len(trajectory),
        yes_then_step=file.yes_then_step,
        labels=tuple(verdict_label(item) for item in trajectory)
        if kind == "steps" and file.verdict_after_step
        else (),
    )
