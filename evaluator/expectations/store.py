"""The expectations document (`tasks:` -> Expectation per task key): parsing, validation, lookup.

Errors name the task key and the field (`task 'refund-order': expected_steps[1]: ...`) so a user
can fix the file from one line. A store is immutable; reloading builds a new one and swaps it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import typing
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from ..suggest import did_you_mean
from .expectation import Expectation
from .rules import RULE_KEYS


class ExpectationsError(ValueError):
    """The document is invalid; one line per problem."""


class ExpectationsStore:
    """Task key -> Expectation, immutable."""

    def __init__(self, tasks: Mapping[str, Expectation] | None = None, source: str = "", digest: str = ""):
        self._tasks: Mapping[str, Expectation] = MappingProxyType(dict(tasks or {}))
        self.source = source
        self.digest = digest
        """Content hash of the file it came from (empty for an in-memory store)."""

    def get(self, task_key: str | None) -> Expectation | None:
        return self._tasks.get(task_key) if task_key is not None else None

    def __contains__(self, task_key: object) -> bool:
        return task_key in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def task_keys(self) -> tuple[str, ...]:
        return tuple(self._tasks)


def parse_expectations(
    text: str,
    source: str = "<expectations>",
    check_scorers: Callable[[Iterable[str]], None] | None = None,
    no_tasks: Callable[[Mapping[str, Any]], str] | None = None,
) -> ExpectationsStore:
    """Parse a YAML or JSON expectations document; ExpectationsError names task key and field.

    `check_scorers` (e.g. `ScorerRegistry.check_listed`) validates explicit `scorers:` lists;
    `no_tasks` says what a top-level mapping without `tasks:` looks like instead (a service config,
    task keys missing their `tasks:`), which only the caller knows. Files are read by one loader,
    `stepwatch.expectations_file.load_expectations_file`, which applies the size caps too.
    """
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ExpectationsError(
            f"{source}: not valid YAML/JSON{where}: {getattr(exc, 'problem', exc)}"
        ) from None
    except RecursionError:
        # PyYAML's composer and constructor recurse per nesting level; a hostile file must end in
        # the store's own error (the service keeps its last good expectations), not crash it.
        raise ExpectationsError(f"{source}: nested too deeply to be an expectations document") from None
    if document is None:
        document = {"tasks": {}}
    if not isinstance(document, dict):
        raise ExpectationsError(f"{source}: the top level must be a mapping with `tasks:`")
    unknown = sorted(set(document) - {"tasks"})
    if unknown and "tasks" not in document and no_tasks is not None:
        raise ExpectationsError(no_tasks(document))
    if unknown:
        raise ExpectationsError(
            f"{source}: unknown top-level key(s) {', '.join(map(repr, unknown))}; expected `tasks:`"
        )
    tasks = document.get("tasks") or {}
    if not isinstance(tasks, dict):
        raise ExpectationsError(f"{source}: `tasks` must map task keys to expectations")
    parsed: dict[str, Expectation] = {}
    problems: list[str] = []
    for key, body in tasks.items():
        task = str(key)
        if body is None:
            body = {}
        if not isinstance(body, dict):
            problems.append(
                f"{source}: task {task!r}: must be a mapping of fields, got {type(body).__name__}"
            )
            continue
        try:
            expectation = Expectation.model_validate(body)
        except ValidationError as exc:
            problems.extend(f"{source}: task {task!r}: {line}" for line in _lines(exc))
            continue
        if check_scorers is not None and expectation.scorers is not None:
            try:
                check_scorers(expectation.scorers)
            except ValueError as exc:
                problems.append(f"{source}: task {task!r}: scorers: {exc}")
                continue
        parsed[task] = expectation
    if problems:
        raise ExpectationsError("\n".join(problems))
    return ExpectationsStore(parsed, source, hashlib.sha256(text.encode()).hexdigest()[:16])


def _where(loc: tuple[int | str, ...]) -> str:
    """`rules[0].with.query` from pydantic's ('rules', 0, 'MustCall', 'with', 'query')."""
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif part[:1].isupper() or part in ("str", "list[str]"):  # union member names and rule tags
            continue
        else:
            parts.append(f".{part}" if parts else part)
    return "".join(parts)


def _line(error: ErrorDetails) -> str:
    """One error as `where: message`; a message that already starts with its place is kept as is."""
    where = _where(error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = f"unknown field{did_you_mean(str(error['loc'][-1]), _field_names())}"
    elif error["type"] == "rule_kind":
        message += f", got {json.dumps(error['input'], default=str)[:80]}"
        if isinstance(error["input"], dict):
            unknown = [str(key) for key in error["input"] if key not in RULE_KEYS]
            message += "".join(did_you_mean(key, RULE_KEYS) for key in unknown)
    names_itself = message.startswith((f"{where}[", f"{where} "))  # e.g. expected_steps[1] is ...
    return f"{where}: {message}" if where and not names_itself else message


@functools.cache
def _field_names() -> frozenset[str]:
    """Every field name (and alias) of Expectation and the models inside it: what a misspelt key
    is matched against."""
    names: set[str] = set()
    seen: set[type] = set()

    def walk(annotation: Any) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation in seen:
                return
            seen.add(annotation)
            for name, field in annotation.model_fields.items():
                names.update(n for n in (name, field.alias) if n)
                walk(field.annotation)
            return
        for arg in typing.get_args(annotation):
            walk(arg)

    walk(Expectation)
    return frozenset(names)


def _lines(exc: ValidationError) -> list[str]:
    out: list[str] = []
    for error in exc.errors():
        line = _line(error)
        if line not in out:
            out.append(line)
    # a nested error ("expected_steps[1][1]") makes its parent's ("expected_steps[1]") redundant
    return [
        line for line in out if not any(o != line and o.startswith(line.split(": ")[0] + "[") for o in out)
    ]
