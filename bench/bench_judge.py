"""trajectory_steps against a real model server: per-step accuracy on the labelled trajectories,
requests and tokens per trajectory, judged partitions per second; medians of runs.

    .venv/bin/python bench/bench_judge.py                       # Qwen2.5-Coder-1.5B, test split, 3 runs
    .venv/bin/python bench/bench_judge.py --model qwen2.5-coder-0.5b-instruct-q4_k_m --split dev
    .venv/bin/python bench/bench_judge.py --base-url http://127.0.0.1:8080/v1 --served-model m

Without --base-url it starts llama.cpp's `llama-server` itself (tests/evaluator/judge/llama_fixture.py:
built from source and cached under .cache/judge/ on first use). Each run uses a fresh judge (empty answer
cache), so every run pays for every request; the server keeps its own prompt-prefix cache, as a
production server does. The labelled set is tests/evaluator/judge/data/trajectories.json: `dev` is for
tuning the prompt, `test` is reported and never tuned on. The local (lexical) judge is scored on
the same split for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "evaluator" / "judge"))

from llama_fixture import BENCH_MODEL, MODELS, LlamaServer  # noqa: E402

from stepwatch.evaluator.judge.base import Judge  # noqa: E402
from stepwatch.evaluator.judge.local import LocalJudge  # noqa: E402
from stepwatch.evaluator.judge.openai import OpenAIJudge  # noqa: E402
from stepwatch.evaluator.judge.runner import JudgeRunner  # noqa: E402
from stepwatch.evaluator.judge.settings import OpenAIJudgeConfig  # noqa: E402
from stepwatch.evaluator.model import Partition  # noqa: E402
from stepwatch.evaluator.scorers.base import ScoringInput  # noqa: E402
from stepwatch.evaluator.scorers.trajectory_steps import TrajectoryStepsScorer  # noqa: E402
from stepwatch.evaluator.trajectory import Trajectory  # noqa: E402

DATA = REPO / "tests" / "evaluator" / "judge" / "data" / "trajectories.json"
GOAL_ACCURACY = 0.90  # issue 15, for Qwen2.5-Coder-1.5B Q4_K_M at p >= 0.5, one request per trajectory


@dataclass
class RunResult:
    correct: int = 0
    steps: int = 0
    order_correct: int = 0
    trajectories: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    not_scored: int = 0
    latencies: list[float] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=dict)
    misses: list[str] = field(default_factory=list)


def scoring_input(item: dict[str, Any]) -> ScoringInput:
    extras: dict[str, Any] = {
        "trajectory": item["trajectory"],
        "expected_trajectory": [step for step, _ in item["expected"]],
    }
    if item.get("input"):
        extras["input"] = item["input"]
    partition = Partition(type="trace", id=item["id"], spans=[])
    return ScoringInput(partition, [], Trajectory(), None, None, extras=extras)


async def run_once(
    items: list[dict[str, Any]], judge: Judge, deadline_s: float, progress: bool = False
) -> RunResult:
    """One pass over `items`; `progress` prints each trajectory's answers to stderr as they come."""
    from stepwatch.evaluator.judge.governor import JudgeGovernor

    runner = JudgeRunner(judge=judge, governor=JudgeGovernor(deadline_s=deadline_s))
    scorer = TrajectoryStepsScorer(runner)
    out = RunResult()
    started = time.perf_counter()
    try:
        for item in items:
            before = time.perf_counter()
            result = await scorer.score(scoring_input(item))
            out.latencies.append(time.perf_counter() - before)
            out.trajectories += 1
            if result.score is None:
                out.not_scored += 1
                out.steps += len(item["expected"])
                out.misses.append(f"{item['id']}: not scored: {result.not_scored or result.error}")
                continue
            if progress:
                rows = [
                    (r["step"], label, r["probability"])
                    for r, (_, label) in zip(result.metadata["details"], item["expected"], strict=True)
                ]
                order = (item["order"], result.metadata["p_order"])
                print(
                    json.dumps(
                        {
                            "id": item["id"],
                            "seconds": round(out.latencies[-1], 2),
                            "steps": rows,
                            "order": order,
                        }
                    ),
                    file=sys.stderr,
                    flush=True,
                )
            for row, (step, label) in zip(result.metadata["details"], item["expected"], strict=True):
                out.steps += 1
                hit = row["performed"] == bool(label)
                out.correct += hit
                out.sources[row["probability_source"]] = out.sources.get(row["probability_source"], 0) + 1
                if not hit:
                    out.misses.append(f"{item['id']}: {step!r} label {label} p {row['probability']:.2f}")
            out.order_correct += (result.metadata["p_order"] >= 0.5) == bool(item["order"])
    finally:
        close = getattr(judge, "aclose", None)
        if close is not None:
            await close()
    out.seconds = time.perf_counter() - started
    stats = getattr(judge, "stats", None)
    if stats is not None and judge.backend != "local":
        out.requests = stats.requests.get("ok", 0) + stats.requests.get("malformed", 0)
        out.prompt_tokens, out.completion_tokens = stats.input_tokens, stats.output_tokens
    return out


def summary(name: str, runs: list[RunResult]) -> dict[str, Any]:
    first = runs[0]
    n = first.trajectories
    per_run_accuracy = [r.correct / r.steps for r in runs]
    return {
        "judge": name,
        "trajectories": n,
        "expected_steps": first.steps,
        "runs": len(runs),
        "per_step_accuracy_median": round(statistics.median(per_run_accuracy), 4),
        "per_step_accuracy_runs": [round(a, 4) for a in per_run_accuracy],
        "order_accuracy_median": round(statistics.median(r.order_correct / n for r in runs), 4),
        "not_scored_median": statistics.median(r.not_scored for r in runs),
        "requests_per_trajectory_median": round(statistics.median(r.requests / n for r in runs), 3),
        "prompt_tokens_per_trajectory_median": round(statistics.median(r.prompt_tokens / n for r in runs), 1),
        "completion_tokens_per_trajectory_median": round(
            statistics.median(r.completion_tokens / n for r in runs), 1
        ),
        "partitions_per_second_median": round(statistics.median(n / r.seconds for r in runs), 3),
        "seconds_per_trajectory_median": round(
            statistics.median(statistics.median(r.latencies) for r in runs), 3
        ),
        "seconds_per_trajectory_max": round(max(max(r.latencies) for r in runs), 3),
        "probability_sources": first.sources,
        "misses_first_run": first.misses,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=BENCH_MODEL, choices=sorted(MODELS))
    parser.add_argument(
        "--split",
        default="test",
        choices=("dev", "test", "all", "heldout"),
        help="heldout: data/paraphrase_heldout.json (30 trajectories, never tuned on)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--no-grammar", action="store_true", help="free-form answers (as OpenAI/vLLM without guides)"
    )
    parser.add_argument(
        "--base-url", help="an already running OpenAI-compatible server instead of starting one"
    )
    parser.add_argument("--served-model", default=None, help="model name for --base-url")
    parser.add_argument(
        "--prompt", default=None, help="judge prompt version (default: evaluator/judge/prompts.yaml's)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args()

    data = json.loads(DATA.read_text())
    if args.split == "heldout":
        data = json.loads((DATA.parent / "paraphrase_heldout.json").read_text())
    items = data["dev"] + data["test"] if args.split == "all" else data[args.split]
    config = dict(
        timeout_s=args.timeout,
        max_retries=0,
        decoding="none" if args.no_grammar else "gbnf",
        max_concurrency=1,
        prompt_version=args.prompt,
    )

    results = [summary("local", [asyncio.run(run_once(items, LocalJudge(), 60))])]
    server: LlamaServer | None = None
    if args.base_url is None:
        server = LlamaServer(args.model, threads=args.threads).start()
    base_url = args.base_url or server.base_url  # type: ignore[union-attr]
    try:
        model = args.served_model or args.model
        runs = []
        for number in range(1, args.runs + 1):
            judge = OpenAIJudge(OpenAIJudgeConfig(base_url=base_url, model=model, **config), environ={})
            runs.append(asyncio.run(run_once(items, judge, args.timeout * 2, progress=True)))
            print(
                f"run {number}: accuracy {runs[-1].correct / runs[-1].steps:.3f} in {runs[-1].seconds:.1f}s",
                file=sys.stderr,
            )
        results.append(summary(f"openai:{model}{'' if args.no_grammar else '+grammar'}", runs))
        results[-1]["prompt"] = judge.prompt.version
    finally:
        if server is not None:
            server.stop()

    if args.json:
        print(json.dumps({"split": args.split, "results": results}, indent=1))
    else:
        for row in results:
            prompt = f", prompt {row['prompt']}" if "prompt" in row else ""
            print(
                f"{row['judge']}{prompt} on {args.split} ({row['trajectories']} trajectories, {row['expected_steps']} expected steps, {row['runs']} run(s))"
            )
            for key, value in row.items():
                if key not in ("judge", "misses_first_run", "prompt"):
                    print(f"  {key}: {value}")
            for miss in row["misses_first_run"]:
                print(f"  miss: {miss}")
    llm = results[-1]
    if args.model == BENCH_MODEL and args.split == "test":
        met = llm["per_step_accuracy_median"] >= GOAL_ACCURACY and llm["requests_per_trajectory_median"] == 1
        print(
            f"goal (>= {GOAL_ACCURACY} per-step accuracy, one request per trajectory): {'met' if met else 'NOT met'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
