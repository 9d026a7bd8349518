"""plan_adherence with the local judge: the spec's Tokyo trace, the three signals, the failures."""

from __future__ import annotations

import copy

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.model import Step
from stepwatch.evaluator.plan import plan_from_expected, steps_from_text
from stepwatch.evaluator.scorers.plan_adherence import PlanAdherenceScorer, processed_steps

TOKYO_PLAN = "For Tokyo: research the destination, check flight options, look up the weather, then suggest a few activities."
TRIP_PLAN = "1. Search flights to Tokyo\n2. Book the flight\n3. Book a hotel\n4. Email the itinerary"


def test_plan_steps_from_free_text_and_prompts():
    assert plan_from_expected(TOKYO_PLAN) == [
        "research the destination",
        "check flight options",
        "look up the weather",
        "suggest a few activities",
    ]
    assert steps_from_text(TRIP_PLAN) == [
        "Search flights to Tokyo",
        "Book the flight",
        "Book a hotel",
        "Email the itinerary",
    ]
    assert steps_from_text("First look up the order, then issue the refund and then email the customer.") == [
        "look up the order",
        "issue the refund",
        "email the customer",
    ]
    assert steps_from_text("Plan a short trip to Tokyo.") == []


async def test_tokyo_trace_with_expected_plan(tokyo_trace, make_trace_input):
    inp = make_trace_input(tokyo_trace, Expectation(expected_plan=TOKYO_PLAN))
    result = await PlanAdherenceScorer().score(inp)
    assert result.error is None, result.error
    meta = result.metadata
    assert meta["plan_steps"] == dict(enumerate(plan_from_expected(TOKYO_PLAN)))
    assert meta["plan_source"] == "expected_plan"
    # Only the research was done: one full step, three missed, nothing off plan or out of order.
    statuses = {row["step"]: row["status"] for row in meta["incorrect_plan_steps"]}
    assert statuses == {
        "check flight options": "missed",
        "look up the weather": "missed",
        "suggest a few activities": "missed",
    }
    assert meta["incorrect_span_indexes"] == [] and meta["out_of_order_steps"] == []
    assert result.score == 25 and result.passed is False and result.threshold == 80


async def test_tokyo_trace_plan_from_the_prompts(tokyo_trace, make_trace_input):
    result = await PlanAdherenceScorer().score(
        make_trace_input(tokyo_trace, Expectation(scorers=["plan_adherence"]))
    )
    assert result.metadata["plan_source"] == "user_prompt"
    assert result.metadata["plan_steps"] == {
        0: "research the destination",
        1: "check flights",
        2: "look up weather",
        3: "suggest activities",
    }
    assert result.score is not None and result.score < 80


def _tool(name: str, round_id: str, **args: object) -> Step:
    return Step(name=name, kind="TOOL", input=args or None, round_id=round_id, span_id=None)


FULL_RUN = [
    _tool("search_flights", "r1", to="NRT"),
    _tool("book_flight", "r2", flight_id="JL5"),
    _tool("book_hotel", "r3", city="Tokyo"),
    _tool("send_email", "r4", subject="Your Tokyo itinerary"),
]


async def test_followed_plan_scores_100_and_carries_only_plan_steps(make_steps_input):
    result = await PlanAdherenceScorer().score(
        make_steps_input(FULL_RUN, Expectation(expected_plan=TRIP_PLAN))
    )
    assert result.score == 100 and result.passed and result.label == "100/100"
    assert result.metadata["plan_steps"][3] == "Email the itinerary"
    assert "incorrect_plan_steps" not in result.metadata  # only listed below 100


async def test_parallel_work_in_one_round_is_not_out_of_order(make_steps_input):
    parallel = [_tool("book_hotel", "r2", city="Tokyo"), _tool("book_flight", "r2", flight_id="JL5")]
    steps = [FULL_RUN[0], *parallel, FULL_RUN[3]]
    result = await PlanAdherenceScorer().score(make_steps_input(steps, Expectation(expected_plan=TRIP_PLAN)))
    assert result.metadata["ordering"] == 1.0
    assert result.metadata.get("out_of_order_steps", []) == []


async def test_work_issued_in_an_earlier_round_is_out_of_order(make_steps_input):
    swapped = [
        FULL_RUN[0],
        _tool("book_hotel", "r2", city="Tokyo"),
        _tool("book_flight", "r3", flight_id="JL5"),
        FULL_RUN[3],
    ]
    in_order = await PlanAdherenceScorer().score(
        make_steps_input(FULL_RUN, Expectation(expected_plan=TRIP_PLAN))
    )
    result = await PlanAdherenceScorer().score(
        make_steps_input(swapped, Expectation(expected_plan=TRIP_PLAN))
    )
    assert [row["step"] for row in result.metadata["out_of_order_steps"]] == ["Book a hotel"]
    assert "Book the flight" in result.metadata["out_of_order_steps"][0]["reason"]
    assert result.score < in_order.score


async def test_off_plan_work_is_flagged_by_index(make_steps_input):
    steps = [*FULL_RUN[:2], _tool("get_stock_price", "r9", ticker="ACME"), *FULL_RUN[2:]]
    result = await PlanAdherenceScorer().score(make_steps_input(steps, Expectation(expected_plan=TRIP_PLAN)))
    assert [row["index"] for row in result.metadata["incorrect_span_indexes"]] == [2]
    assert "get_stock_price" in result.metadata["incorrect_span_indexes"][0]["reason"]
    assert result.score < 100
    # issue 37: the structured explanation names the same off-plan step, by index
    assert result.structured is not None
    (off,) = result.structured.model().off_plan or []
    assert off.index == 2 and "get_stock_price" in off.step
    assert "off-plan: get_stock_price" in result.structured.reason


async def test_missed_step_is_reported_and_fails(make_steps_input):
    result = await PlanAdherenceScorer().score(
        make_steps_input(FULL_RUN[:3], Expectation(expected_plan=TRIP_PLAN))
    )
    assert result.metadata["incorrect_plan_steps"] == [
        {
            "step": "Email the itinerary",
            "status": "missed",
            "reason": result.metadata["incorrect_plan_steps"][0]["reason"],
        }
    ]
    assert result.passed is False
    assert result.structured is not None
    plan = result.structured.model().plan or []
    assert [item.status for item in plan] == ["full"] * (len(plan) - 1) + ["missed"]
    assert result.structured.reason == "missed: Email the itinerary"


async def test_failure_conditions_give_an_error_and_no_score(
    tokyo_trace, make_trace_input, make_steps_input, make_inline
):
    scorer = PlanAdherenceScorer()
    empty = await scorer.score(make_inline({"expected_plan": TOKYO_PLAN}))
    assert empty.error == "the trace is not a non-empty list of spans"

    bad_plan = await scorer.score(make_steps_input(FULL_RUN, Expectation(expected_plan="  ...  ")))
    assert "expected_plan is provided but empty" in bad_plan.error

    not_text = make_steps_input(FULL_RUN, Expectation())
    not_text.extras["expected_plan"] = ["a", "b"]
    assert "free text" in (await scorer.score(not_text)).error

    no_prompts = await scorer.score(make_steps_input(FULL_RUN, Expectation()))
    assert no_prompts.error.startswith("no system or user prompts")

    no_plan = await scorer.score(make_steps_input(FULL_RUN, Expectation(), prompts=True))
    assert no_plan.error.startswith("no plan steps could be resolved")

    no_steps = await scorer.score(make_steps_input([], Expectation(expected_plan=TRIP_PLAN)))
    assert no_steps.error == "the trace has no actionable steps to score"

    trace = copy.deepcopy(tokyo_trace)
    for span in trace:
        span["attributes"] = {k: v for k, v in span["attributes"].items() if "input_messages" not in k}
    no_prompt_trace = await scorer.score(make_trace_input(trace, Expectation(scorers=["plan_adherence"])))
    assert no_prompt_trace.error.startswith("no system or user prompts")
    for result in (empty, bad_plan, no_prompts, no_plan, no_steps, no_prompt_trace):
        assert result.score is None and result.outcome == "error"


def test_applicable_only_when_requested(make_steps_input):
    scorer = PlanAdherenceScorer()
    assert not scorer.applicable(make_steps_input(FULL_RUN, Expectation()))
    # a registered plan alone does not ask for a judge (no `judge:` section)
    assert not scorer.applicable(make_steps_input(FULL_RUN, Expectation(expected_plan=TRIP_PLAN)))
    assert scorer.applicable(
        make_steps_input(
            FULL_RUN, Expectation(expected_plan=TRIP_PLAN, judge={"scorers": ["plan_adherence"]})
        )
    )
    assert scorer.applicable(make_steps_input(FULL_RUN, Expectation(scorers=["plan_adherence"])))
    assert not scorer.applicable(
        make_steps_input(
            FULL_RUN, Expectation(expected_plan=TRIP_PLAN, judge={"scorers": ["trajectory_steps"]})
        )
    )


def _tokyo_spans(tokyo_trace, *names_and_ids: str) -> list[dict]:
    wanted = set(names_and_ids)
    return [copy.deepcopy(s) for s in tokyo_trace if s["context"]["span_id"] in wanted]


async def test_plan_adherence_refuses_a_partition_with_no_actionable_steps_behind_an_agent_wrapper(
    tokyo_trace, make_trace_input
):
    """plan-adherence.txt: evaluation fails "when the trace has no actionable steps to score". The
    reply alone under a nested agent wrapper ("Trip Planner" holding only the final LLM reply) has
    none: the wrapper did no work of its own, so it is refused like the bare reply (was 0.0)."""
    root, wrapper, reply = "0x145e3c64b3b99a77", "0x083b5fc1127d658a", "0xbbbbbbbbbbbbbbbb"
    plan = "research the destination, check flight options, then suggest a few activities"
    inp = make_trace_input(_tokyo_spans(tokyo_trace, root, wrapper, reply), Expectation(expected_plan=plan))
    assert [(step.name, step.kind) for step in inp.steps] == [("Trip Planner", "AGENT")]
    result = await PlanAdherenceScorer().score(inp)
    assert result.error == "the trace has no actionable steps to score" and result.score is None
    # the same wrapper with a tool call beneath it is a container: the tool call is scored
    worked = _tokyo_spans(tokyo_trace, root, wrapper, "0x64e5562a83068b87", "0x6c9868e6283f0ed1", reply)
    scored = await PlanAdherenceScorer().score(make_trace_input(worked, Expectation(expected_plan=plan)))
    assert scored.error is None and scored.score is not None


async def test_an_agent_wrapper_that_only_replied_is_never_off_plan(
    make_steps_input, tokyo_trace, make_trace_input
):
    """Beside real work, a reply-only agent step stays a processed step (it may carry out a plan
    step) but is not actionable: it is not counted as off-plan work."""
    root, wrapper, reply = "0x145e3c64b3b99a77", "0x083b5fc1127d658a", "0xbbbbbbbbbbbbbbbb"
    spans = _tokyo_spans(tokyo_trace, root, wrapper, reply)
    tool = copy.deepcopy(next(s for s in tokyo_trace if s["context"]["span_id"] == "0x6c9868e6283f0ed1"))
    tool["parent_id"] = root  # the research ran beside the wrapper, not inside it
    inp = make_trace_input([*spans, tool], Expectation(expected_plan="research the destination"))
    processed = processed_steps(inp)
    wrapper_index = processed.steps.index(next(s for s in processed.steps if "Trip Planner" in s))
    assert wrapper_index in processed.replies and wrapper_index not in processed.actionable
    result = await PlanAdherenceScorer().score(inp)
    assert result.error is None
    assert all(row["index"] != wrapper_index for row in result.metadata.get("incorrect_span_indexes", []))
