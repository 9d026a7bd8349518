"""Render one request group of a JudgeBatch into chat messages, from the versioned prompts.yaml.

A group's questions are answered on lines the model fills in (`E2. issue refund: yes`), each
line restating what it answers, after worked examples rendered by the same code as the real
question. Why this shape: measured with Qwen2.5-Coder-1.5B, a prompt that names steps by index
into JSON state scored 0.67 per step; the step text in each question, restated on its answer
line, with worked examples, scored 0.9+ (docs/judges.md).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from .base import JudgeBatch, JudgeMalformed, Question
from .readable import readable_item, short_label

YesNo = Literal["yes", "no"]


class StepsExample(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str | None = None
    trajectory: list[str]
    expected: list[str]
    answers: list[YesNo]
    order: YesNo


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
    trajectory_steps: str
    plan_step: str
    task_line: str
    trajectory_steps_examples: list[StepsExample] = Field(min_length=1)
    plan_step_examples: list[PlanExample] = Field(min_length=1)


@functools.cache
def prompt_file() -> PromptFile:
    text = resources.files(__package__).joinpath("prompts.yaml").read_text(encoding="utf-8")
    return PromptFile.model_validate(yaml.safe_load(text))


@dataclass(frozen=True, slots=True)
class RenderedGroup:
    """The messages of one request, and the answer lines it asks for (one per question, in order)."""

    messages: list[dict[str, str]]
    lines: list[str]
    """`E1. look up order`, `order`, `S2. search web`, `full`: each answer line up to its colon."""

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
        form="\n".join(f"{line}: yes or no" for line in lines),
    )


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


def steps_lines(expected: Sequence[str], indices: Sequence[int | None]) -> list[str]:
    """Answer lines for step indices (None = the order question)."""
    return [f"E{i + 1}. {_one_line(expected[i])}" if i is not None else "order" for i in indices]


def plan_lines(trajectory: Sequence[str], indices: Sequence[int | None]) -> list[str]:
    """Answer lines for trajectory indices (None = the `full` question)."""
    return [f"S{j + 1}. {short_label(trajectory[j])}" if j is not None else "full" for j in indices]


def _examples(file: PromptFile, kind: str) -> list[dict[str, str]]:
    turns: list[dict[str, str]] = []
    if kind == "steps":
        for ex in file.trajectory_steps_examples:
            lines = steps_lines(ex.expected, [*range(len(ex.expected)), None])
            turns.append(
                {"role": "user", "content": _steps_user(file, ex.input, ex.trajectory, ex.expected, lines)}
            )
            turns.append({"role": "assistant", "content": _filled(lines, [*ex.answers, ex.order])})
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
    if kinds <= {"accomplishes", "order"}:
        lines = steps_lines(
            target, [int(q.args["index"]) if q.kind == "accomplishes" else None for q in questions]
        )
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
        {"role": "system", "content": file.system},
        *_examples(file, kind),
        {"role": "user", "content": user},
    ]
    return RenderedGroup(messages=messages, lines=lines)
