"""A toy refund agent, instrumented with the real OpenTelemetry SDK (GenAI semantic conventions).

Its model is a script: from the tools already called it picks the next one. The `version` picks the
script: "v2" follows the plan (look the order up, check the refund policy, refund); "v3" is the
regression a CI gate must catch, a prompt change after which it refunds before checking the policy.

Spans: a root `invoke_agent refund_agent` (gen_ai.agent.name is Stepwatch's task key), one
`chat` span per model decision and one `execute_tool <name>` span per tool call (gen_ai.tool.name,
its arguments and result), as an agent framework's instrumentation would emit them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import SpanKind, Tracer

AGENT = "refund_agent"
SCRIPTS: dict[str, list[str]] = {
    "v2": ["lookup_order", "check_policy", "issue_refund"],
    "v3": ["lookup_order", "issue_refund", "check_policy"],
}
TOOLS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "lookup_order": lambda args: {"order_id": args["order_id"], "amount": 42.0, "status": "delivered"},
    "check_policy": lambda args: {"order_id": args["order_id"], "refundable": True},
    "issue_refund": lambda args: {"refund_id": f"R-{args['order_id']}", "amount": 42.0},
}


def decide(version: str, called: list[str]) -> str | None:
    """The scripted model's next tool, or None when it answers."""
    script = SCRIPTS[version]
    return script[len(called)] if len(called) < len(script) else None


def run_agent(tracer: Tracer, order_id: str, version: str = "v2") -> str:
    """Handle one refund request; returns the agent's answer."""
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": AGENT}
    with tracer.start_as_current_span(f"invoke_agent {AGENT}", attributes=attributes) as root:
        called: list[str] = []
        while True:
            with tracer.start_as_current_span(
                "chat scripted-model",
                kind=SpanKind.CLIENT,
                attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": f"scripted-{version}"},
            ):
                tool = decide(version, called)
            if tool is None:
                break
            arguments = {"order_id": order_id}
            with tracer.start_as_current_span(
                f"execute_tool {tool}",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool,
                    "gen_ai.tool.call.arguments": json.dumps(arguments),
                },
            ) as span:
                span.set_attribute("gen_ai.tool.call.result", json.dumps(TOOLS[tool](arguments)))
            called.append(tool)
        answer = f"Order {order_id} refunded."
        root.set_attribute("gen_ai.output.messages", json.dumps([{"role": "assistant", "content": answer}]))
        return answer
