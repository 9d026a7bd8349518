"""A GBNF grammar (llama.cpp's `grammar` request field) that admits only the expected answer
lines, each ending in yes or no: the model chooses nothing but the answers, so every answer
lands on a known line and its token's top_logprobs are the model's own yes/no distribution
(llama.cpp reports logprobs from the raw logits, before the grammar masks them).
"""

from __future__ import annotations

from collections.abc import Sequence


def _literal(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def answer_grammar(lines: Sequence[str]) -> str:
    """`root ::= "E1. look up order: " yn "\\n" ... "order: " yn`."""
    parts: list[str] = []
    for position, line in enumerate(lines):
        if position:
            parts.append(_literal("\n"))
        parts.extend([_literal(f"{line}: "), "yn"])
    return f'root ::= {" ".join(parts)}\nyn ::= "yes" | "no"\n'
