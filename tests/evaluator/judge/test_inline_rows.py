"""Dataset rows with inline request fields, through the registry entries and the async pipeline."""

from __future__ import annotations

from stepwatch.evaluator.expectations.expectation import Expectation
from stepwatch.evaluator.inline_rows import has_inline_fields, inline_scoring_input
from stepwatch.evaluator.judge.runner import JudgeRunner
from stepwatch.evaluator.pipeline import run_async_scorers
from stepwatch.evaluator.scorers.judge_registration import judge_scorer_entries
from stepwatch.evaluator.scorers.registry import ScorerRegistry
from stepwatch.loaders.openinference_json import decode_openinference


def decode(document: list) -> list:
    return decode_openinference(document).spans


def registry() -> ScorerRegistry:
    return ScorerRegistry.builtin().extended(judge_scorer_entries(JudgeRunner()))


async def test_inline_trajectory_row_scores_trajectory_steps():
    row = {
        "id": "refund",
        "input": "Refund order 4471 and notify the customer.",
        "trajectory": ["look up order 4471", "issue refund of $89.00"],
        "expected_trajectory": ["look up order", "issue refund", "notify customer"],
    }
    assert has_inline_fields(row)
    scorer = registry().create("trajectory_steps")
    [result] = await run_async_scorers(inline_scoring_input(row, None, decode, "refund"), [scorer])
    assert result.label == "64% yes" and result.metadata["missing_steps"] == ["notify customer"]


async def test_inline_openinference_trace_scores_plan_adherence(tokyo_trace):
    row = {"id": "tokyo", "trace": tokyo_trace, "expected_plan": "Research the destination; check flights."}
    scorers = [registry().create("plan_adherence"), registry().create("trajectory.step_count")]
    results = await run_async_scorers(inline_scoring_input(row, None, decode, "tokyo"), scorers)
    by_metric = {r.metric: r for r in results}
    assert by_metric["plan_adherence"].metadata["plan_steps"] == {
        0: "Research the destination",
        1: "check flights",
    }
    assert by_metric["plan_adherence"].score == 50
    assert by_metric["trajectory.step_count"].score is not None


def test_judge_scorers_run_only_where_judge_scorers_names_them():
    reg = registry()
    names = lambda e: {s.name for s in reg.scorers_for(e)}  # noqa: E731
    assert not names(Expectation()) & {"trajectory_steps", "plan_adherence"}
    # a registered plan or outcome steps alone do not turn a judge on (no `judge:` section)
    assert not names(Expectation(expected_plan="a, b", expected_trajectory=["look up order"])) & {
        "trajectory_steps",
        "plan_adherence",
    }
    assert "trajectory_steps" in names(
        Expectation(expected_trajectory=["look up order"], judge={"scorers": ["trajectory_steps"]})
    )
    only_steps = names(Expectation(expected_plan="a, b", judge={"scorers": ["trajectory_steps"]}))
    assert "trajectory_steps" in only_steps and "plan_adherence" not in only_steps
    # named without a plan: the plan comes from the prompts
    assert "plan_adherence" in names(Expectation(judge={"scorers": ["plan_adherence"]}))
    # a judge section without scorers names none
    assert not names(Expectation(expected_plan="a, b", judge={"sampling_rate": 0.5})) & {"plan_adherence"}
