"""A GBNF grammar (llama.cpp's `grammar` request field) that admits only the expected answer
lines, each ending in its answer: yes or no, or (evidence lines) an agent step `S1`..`SN` or
`none`. The model chooses nothing but the answers, so every answer lands on a known line and its
token's top_logprobs are the model's own distribution (llama.cpp reports logprobs from the raw
logits, before the grammar masks them).
"""

from __future__ import annotations

from collections.abc import Sequence


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
