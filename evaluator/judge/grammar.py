"""A GBNF grammar (llama.cpp's `grammar` request field), or a JSON schema (`response_format`
json_schema: OpenAI, vLLM), that admits only the expected answer
lines, each ending in its answer: yes or no, or (evidence lines) an agent step `S1`..`SN` or
`none`. The model chooses nothing but the answers, so every answer lands on a known line and its
token's top_logprobs are the model's own distribution (llama.cpp reports logprobs from the raw
logits, before the grammar masks them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _literal(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def answer_grammar(
    lines: Sequence[str],
    evidence_steps: int | None = None,
    yes_then_step: bool = False,
    labels: Sequence[str] = (),
) -> str:
    """`root ::= "S1. search web: " yn "\\n" ... "full: " yn`; with `evidence_steps` = N, lines
    starting with E are answered `ev ::= "S" ("N" | ... | "1") | "none"` (`yes_then_step`:
    `ev ::= "yes S" (...) | "no"`; `labels`, one per agent step: `ev ::= "S" ("1 label1: " |
    ... ) yn`, the named step restated before its verdict)."""
    parts: list[str] = []
    for position, line in enumerate(lines):
        if position:
            parts.append(_literal("\n"))
        rule = "ev" if evidence_steps is not None and line.startswith("E") else "yn"
        parts.extend([_literal(f"{line}: "), rule])
    rules = [f"root ::= {' '.join(parts)}", 'yn ::= "yes" | "no"']
    if evidence_steps is not None and labels:
        named = " | ".join(_literal(f"{n} {label}: ") for n, label in enumerate(labels, start=1))
        rules.append(f'ev ::= "S" ({named}) yn')
    elif evidence_steps is not None:
        numbers = " | ".join(_literal(str(n)) for n in range(max(1, evidence_steps), 0, -1))
        if yes_then_step:
            rules.append(f'ev ::= "yes S" ({numbers}) | "no"')
        else:
            rules.append(f'ev ::= "S" ({numbers}) | "none"')
    return "\n".join(rules) + "\n"


def answer_choices(
    line: str, evidence_steps: int | None = None, yes_then_step: bool = False, labels: Sequence[str] = ()
) -> list[str]:
    """What one answer line may say after its colon: the same alternatives `answer_grammar`
    admits (`yes` / `no`; `yes S2` / `no`; `S2` / `none`; `S2 <step 2 restated>: yes`)."""
    if evidence_steps is None or not line.startswith("E"):
        return ["yes", "no"]
    if labels:
        return [
            f"S{n} {label}: {verdict}" for n, label in enumerate(labels, start=1) for verdict in ("yes", "no")
        ]
    numbers = range(1, max(1, evidence_steps) + 1)
    if yes_then_step:
        return [*(f"yes S{n}" for n in numbers), "no"]
    return [*(f"S{n}" for n in numbers), "none"]


def answer_schema(
    lines: Sequence[str],
    evidence_steps: int | None = None,
    yes_then_step: bool = False,
    labels: Sequence[str] = (),
) -> dict[str, Any]:
    """A JSON schema (OpenAI / vLLM `response_format: json_schema`, strict) for the same answers:
    an object whose properties are the answer lines, in order, each an enum of its choices, so a
    server that constrains decoding to a schema holds the answers as a GBNF grammar does."""
    return {
        "type": "object",
        "properties": {
            line: {"type": "string", "enum": answer_choices(line, evidence_steps, yes_then_step, labels)}
            for line in lines
        },
        "required": list(lines),
        "additionalProperties": False,
    }
