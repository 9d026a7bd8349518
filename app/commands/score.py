"""`stepwatch score`: score trace files (or a JSONL dataset of them) offline, through the same
pipeline the streaming service uses.

Exit codes: 0 every partition was scored (whatever the scores); 1 some partition or dataset row
could not be scored: its record carries `error`, a scorer asked for with --scorer could not run on
it (e.g. agent.step_accuracy with no expected steps from any source), or a judge scorer gave
`not_scored` because the judge failed (unreachable, past --judge-deadline, malformed answers, over
budget, or the local judge abstained: no evidence either way; judge sampling is a decision, not a
failure): a summary of those rows and why closes the run on stderr; 2 bad input (unreadable/invalid trace file given on
the command line, invalid --expected-steps, --rules or --expectations, unreadable dataset file).
With --check (the CI gate, app/commands/score_gate.py) a score below its threshold, a failed rule and
a partition nothing checked also exit 1, each failing partition named on stderr with its reason.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from stepwatch.commands.score_gate import NOTHING_CHECKED, judge_failed, verdict

HELP = "Score trace files or a JSONL dataset offline (step accuracy, trajectory rules, statistics)."

SCORING_METHODS = ("edit_distance", "strict_position")
INTEGER_METRICS = frozenset({"trajectory.step_count", "trajectory.total_tokens"})
SUMMARY_METRIC = "agent.step_accuracy"
OFFLINE_REQUEST_TIMEOUT_S = 600.0
"""One judge request's timeout offline unless --judge-timeout: a CPU-served model takes 20-60 s."""
JUDGE_SCORER_OF = {"expected_trajectory": "trajectory_steps", "expected_plan": "plan_adherence"}
"""The judge scorer a dataset row's own field asks for."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="trace files: OTLP protobuf or JSON, "
        "native trajectory JSON, OpenInference span list (auto-detected)",
    )
    parser.add_argument(
        "--dataset",
        metavar="DATA.jsonl",
        help="JSONL rows {id, trace, expected_steps, [scoring_method], [rules]}: `trace` is a trace "
        "file path relative to the dataset file; or rows carrying the request inline: trajectory, "
        "expected_trajectory, input, expected_plan, and/or trace as an OpenInference span list "
        "(docs/offline.md, docs/judges.md)",
    )
    parser.add_argument(
        "--expected-steps",
        metavar="JSON",
        help='expected steps, e.g. \'["search", '
        '["fetch_a", "fetch_b"], "answer"]\' (a nested list is an unordered group)',
    )
    parser.add_argument("--scoring-method", choices=SCORING_METHODS, help="default: edit_distance")
    parser.add_argument(
        "--partition",
        choices=("trace", "session"),
        default="trace",
        help="score each trace, or each session (its traces merged); default: trace",
    )
    parser.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        dest="output_format",
        help="table (default) or JSON lines, one object per scored partition",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="show the alignment of expected vs observed steps per partition (moved steps marked), "
        "failed trajectory rules and each metric's reason",
    )
    parser.add_argument("--rules", metavar="FILE", help="trajectory rules YAML (the spec's `scorers:` form)")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="serve's YAML config: its `security.limits` apply as in serve (so do STEPWATCH_CONFIG and "
        "STEPWATCH_SECURITY__LIMITS__* variables); default: serve's default limits",
    )
    parser.add_argument(
        "--expectations",
        metavar="FILE",
        help="serve's expectations file (`tasks:`), loaded as serve loads it: a partition whose task key "
        "it registers is scored against that expectation, with --expected-steps, --rules and a "
        "dataset row's fields laid over it",
    )
    parser.add_argument(
        "--task-key",
        metavar="KEY",
        help="score every partition read from a trace file as task KEY of the --expectations file "
        "(which must register it), whatever task key its spans name",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="gate a merge: exit 1 when any score is below its threshold, any trajectory rule fails or "
        "a partition gets no verdict at all (e.g. its task key is not in --expectations), 0 when every "
        "partition passes, 2 on bad input; one line per failing partition with the reason, then "
        "`N partition(s), M failing`, on stderr",
    )
    parser.add_argument(
        "--scorer",
        action="append",
        metavar="NAME",
        help="run only these scorers (repeatable), e.g. --scorer trajectory_steps --scorer plan_adherence",
    )
    parser.add_argument(
        "--judge",
        choices=("local", "openai"),
        default="local",
        help="judge for trajectory_steps / plan_adherence: the embedded local judge (default) or an "
        "OpenAI-compatible endpoint (see docs/judges.md)",
    )
    parser.add_argument(
        "--judge-base-url", metavar="URL", help="OpenAI-compatible base URL (default OpenAI's)"
    )
    parser.add_argument("--judge-model", metavar="MODEL", help="judge model name")
    parser.add_argument(
        "--judge-api-key-env",
        metavar="VAR",
        help="environment variable holding the API key (default OPENAI_API_KEY)",
    )
    parser.add_argument(
        "--judge-timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="one judge request's timeout (default offline 600: a CPU-served model takes 20-60 s)",
    )
    parser.add_argument(
        "--judge-deadline",
        type=_positive_seconds,
        metavar="SECONDS",
        help="cap the judge's time per partition, retries included: slower is not_scored (default: "
        "no cap, offline waits; partitions are judged one at a time, so none waits behind another)",
    )
    parser.add_argument(
        "--judge-grammar",
        action="store_true",
        help="always constrain the judge's answer lines with a GBNF grammar (= --judge-decoding gbnf)",
    )
    parser.add_argument(
        "--judge-decoding",
        choices=("auto", "gbnf", "json_schema", "none"),
        help="how the judge's answer format is guaranteed: auto (default) probes the server once and "
        "sends a GBNF grammar to llama.cpp's server, a strict JSON schema to vLLM and OpenAI, nothing "
        "to others; gbnf / json_schema always; none never",
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


@dataclass(slots=True)
class Record:
    """One output line: a scored partition, or an error for a partition/row."""

    id: str
    partition_type: str | None = None
    partition_id: str | None = None
    task_key: str | None = None
    results: list[Any] = field(default_factory=list)
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None or any(
            r.error is not None or judge_failed(r) or r.metadata.get("limit_exceeded") for r in self.results
        )

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id}
        if self.partition_type is not None:
            out["partition"] = {"type": self.partition_type, "id": self.partition_id}
            out["task_key"] = self.task_key
        if self.error is not None:
            out["error"] = self.error
        else:
            out["results"] = [_result_json(r) for r in self.results]
        return out


def _result_json(result: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metric": result.metric,
        "score": result.score,
        "passed": result.passed,
        "metadata": result.metadata,
    }
    if result.threshold is not None:
        out["threshold"] = result.threshold
    if result.label is not None:
        out["label"] = result.label
    if result.explanation is not None:
        out["explanation"] = result.explanation
    if result.error is not None:
        out["error"] = result.error
    if result.not_scored is not None:
        out["not_scored"] = result.not_scored
    if result.structured is not None:
        # the same object serve's score events carry as `explanation_detail`
        out["explanation_detail"] = result.structured.as_json()
    return out


@dataclass(frozen=True, slots=True)
class InlineJob:
    """A dataset row scored from its own fields (trajectory, expected_trajectory, input,
    expected_plan, trace as an OpenInference span list) instead of a trace file."""

    id: str
    row: dict[str, Any]
    expectation: Any


@dataclass(frozen=True, slots=True)
class Job:
    """One unit of input: a trace file with the expectation to score its partitions against."""

    id: str | None
    path: Path
    expectation: Any


def run(args: argparse.Namespace) -> int:
    from stepwatch.cli import UsageError

    if bool(args.files) == bool(args.dataset):
        raise UsageError("give trace FILEs or --dataset DATA.jsonl (exactly one of the two)")
    prepare(args)
    base_steps, base_rules = _base_fields(args)
    out = sys.stdout
    if args.dataset:
        return _run_dataset(args, Path(args.dataset), base_steps, base_rules, out)
    expectation = _files_expectation(args, base_steps, base_rules)
    loaded = [_load_or_usage_error(path, args.limits) for path in args.files]
    records: list[Record] = []
    explains: dict[int, list[str]] = {}
    for path, spans in zip(args.files, loaded, strict=True):
        for record, lines in _score_spans(None, path, spans, expectation, args):
            explains[len(records)] = lines
            records.append(record)
            if args.output_format == "json":
                _emit_json(record, out)
    if args.output_format == "table":
        _print_table(records, explains if args.explain else {}, out)
    return _finish(records, args)


def prepare(args: argparse.Namespace) -> None:
    """What a run needs before it scores, into `args`: the --scorer names checked, serve's limits and
    task-key attributes (--config), the --expectations file through serve's loader, --task-key
    checked against it. UsageError (exit 2) on bad input."""
    _check_scorer_names(args)
    args.limits, args.task_key_attributes = _serve_settings(args.config)
    args.expectations_store = _load_expectations_file(args)
    _check_task_key(args)


def score_spans(args: argparse.Namespace, label: str, spans: list[Any]) -> list[Record]:
    """Decoded spans scored exactly as a trace FILE of this command is, after `prepare(args)`:
    serve's limits, partitioning, the expectation of each partition's task key (or --task-key) with
    the command line's fields laid over it. `stepwatch.testing` scores an agent's spans through it."""
    expectation = _files_expectation(args, *_base_fields(args))
    return [
        record
        for record, _ in _score_spans(None, label, _limited(spans, label, args.limits), expectation, args)
    ]


def _base_fields(args: argparse.Namespace) -> tuple[Any, Any]:
    """(expected steps from --expected-steps, rules from --rules), None where not given."""
    base_rules = _load_rules_file(Path(args.rules)) if args.rules else None
    base_steps = _parse_steps_arg(args.expected_steps) if args.expected_steps is not None else None
    return base_steps, base_rules


def _files_expectation(args: argparse.Namespace, base_steps: Any, base_rules: Any) -> Any:
    """The command line's expectation for every trace file's partitions."""
    from stepwatch.cli import UsageError

    expectation = _expectation(base_steps, args.scoring_method, base_rules, args.partition)
    if isinstance(expectation, str):
        raise UsageError(f"--expected-steps: {expectation}")
    return expectation


def _check_task_key(args: argparse.Namespace) -> None:
    """--task-key names a task the --expectations file registers (it is the file's expectation that
    is forced, so there must be one)."""
    key = getattr(args, "task_key", None)
    if key is None:
        return
    from stepwatch.cli import UsageError
    from stepwatch.evaluator.suggest import did_you_mean

    store = args.expectations_store
    if store is None:
        raise UsageError("--task-key needs --expectations FILE: it scores partitions as that file's task")
    if key not in store:
        raise UsageError(
            f"--task-key {key!r}: not a task key of {args.expectations} (it registers: {_task_keys(store)})"
            + did_you_mean(key, store.task_keys)
        )


def _run_dataset(
    args: argparse.Namespace, dataset: Path, base_steps: Any, base_rules: Any, out: TextIO
) -> int:
    from stepwatch.cli import UsageError

    try:
        lines = dataset.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"{dataset}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{dataset}: cannot read dataset ({exc})") from None
    rows = [(number, line) for number, line in enumerate(lines, start=1) if line.strip()]
    if not rows:
        raise UsageError(f"{dataset}: the dataset has no rows")
    # --scorer chooses the scorers itself (agent.step_accuracy named there errs on its own)
    steps_required = _scan_rows(dataset, rows, base_steps) and not args.scorer
    progress = sys.stderr.isatty() and len(rows) > 1
    records: list[Record] = []
    explains: dict[int, list[str]] = {}
    for done, (number, line) in enumerate(rows, start=1):
        job = _dataset_job(dataset, number, line, base_steps, base_rules, args)
        if isinstance(job, Record):
            produced = [(job, [])]
        elif isinstance(job, InlineJob):
            produced = [(_score_inline(job, args), [])]
        else:
            spans = _load_or_error(job.path, args.limits)
            if isinstance(spans, str):
                produced = [(Record(id=job.id or "", error=spans), [])]
            else:
                produced = list(_score_spans(job.id, str(job.path), spans, job.expectation, args))
        if steps_required and _lacks_expected_steps(job):
            produced = [(_require_expected_steps(record), explain) for record, explain in produced]
        for record, explain in produced:
            explains[len(records)] = explain
            records.append(record)
            if args.output_format == "json":
                _emit_json(record, out)
        if progress:
            print(f"\rscored {done}/{len(rows)} rows", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    if args.output_format == "table":
        _print_table(records, explains if args.explain else {}, out)
    return _finish(records, args)


def _scan_rows(dataset: Path, rows: list[tuple[int, str]], base_steps: Any) -> bool:
    """Every row checked before any is scored; whether the dataset uses agent.step_accuracy.

    A row carrying the judges' fields inline but no trajectory (neither `trajectory` nor `trace`)
    is refused (UsageError, exit 2): scored, it would judge an empty run as 0.0. The dataset uses
    step accuracy when --expected-steps is given or any row carries `expected_steps`: then a row
    without them is an error result (`_require_expected_steps`), not silently unscored. Rows that
    are not JSON objects are left to `_dataset_job`, which reports each as that row's error."""
    from stepwatch.cli import UsageError
    from stepwatch.evaluator.inline_rows import INLINE_FIELDS, has_inline_fields

    uses_steps = base_steps is not None
    for number, line in rows:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        uses_steps = uses_steps or row.get("expected_steps") is not None
        if has_inline_fields(row) and "trajectory" not in row and row.get("trace") in (None, ""):
            given = ", ".join(f"`{name}`" for name in INLINE_FIELDS if name in row)
            raise UsageError(
                f"{dataset}:{number}: the row has {given} but no trajectory to score: give `trajectory` "
                "(the agent's steps) or `trace` (a trace file or an OpenInference span list)"
            )
    return uses_steps


MISSING_ROW_STEPS = (
    "no expected steps for this row, while the dataset scores agent.step_accuracy (--expected-steps or "
    "other rows' `expected_steps`): give the row `expected_steps` or annotate its trace with "
    "aip.eval.expected_steps (every occurrence must resolve them, or scoring fails)"
)


def _lacks_expected_steps(job: Job | InlineJob | Record) -> bool:
    """Whether a dataset job scores observed steps (a trace file, or an inline span list) with no
    expected steps of its own (nor --expected-steps): its trace's annotation may still give them."""
    if isinstance(job, Record) or (isinstance(job, InlineJob) and not isinstance(job.row.get("trace"), list)):
        return False
    return job.expectation is None or job.expectation.expected_steps is None


def _require_expected_steps(record: Record) -> Record:
    """The record with an agent.step_accuracy error result when it scored a partition but produced
    none (no expected steps resolved): in a dataset that uses step accuracy, missing expected steps
    fail the row instead of passing silently."""
    from stepwatch.evaluator.results import ScoreResult

    if record.error is None and all(result.metric != SUMMARY_METRIC for result in record.results):
        record.results = [*record.results, ScoreResult(metric=SUMMARY_METRIC, error=MISSING_ROW_STEPS)]
    return record


def _dataset_job(
    dataset: Path, number: int, line: str, base_steps: Any, base_rules: Any, args: argparse.Namespace
) -> Job | Record:
    where = f"{dataset}:{number}"
    try:
        row = json.loads(line)
    except ValueError as exc:
        return Record(id=where, error=f"{where}: invalid JSON: {exc}")
    if not isinstance(row, dict):
        return Record(id=where, error=f"{where}: a dataset row must be a JSON object")
    row_id = str(row["id"]) if row.get("id") not in (None, "") else where
    trace = row.get("trace")
    steps = base_steps
    if "expected_steps" in row:
        steps = _row_steps(row["expected_steps"])
        if isinstance(steps, str):
            return Record(id=row_id, error=f"{where}: expected_steps: {steps}")
    method = row.get("scoring_method", args.scoring_method)
    if method is not None and method not in SCORING_METHODS:
        return Record(id=row_id, error=f"{where}: scoring_method must be one of {', '.join(SCORING_METHODS)}")
    rules = base_rules
    if row.get("rules") is not None:
        rules = _row_rules(row["rules"], dataset.parent)
        if isinstance(rules, str):
            return Record(id=row_id, error=f"{where}: rules: {rules}")
    expectation = _expectation(steps, method, rules, args.partition)
    if isinstance(expectation, str):
        return Record(id=row_id, error=f"{where}: {expectation}")
    expectation = _with_judge_fields(expectation, row)
    if isinstance(expectation, str):
        return Record(id=row_id, error=f"{where}: {expectation}")
    if not isinstance(trace, str) or not trace:
        from stepwatch.evaluator.inline_rows import has_inline_fields

        if has_inline_fields(row):
            return InlineJob(id=row_id, row=row, expectation=expectation)
        return Record(
            id=row_id, error=f"{where}: `trace` must be a path to a trace file or an OpenInference span list"
        )
    return Job(id=row_id, path=dataset.parent / trace, expectation=expectation)


def _row_steps(raw: Any) -> Any:
    from stepwatch.evaluator.pipeline import parse_expected_steps, validate_expected_steps_value

    try:
        return parse_expected_steps(raw) if isinstance(raw, str) else validate_expected_steps_value(raw)
    except ValueError as exc:
        return str(exc)


def _row_rules(raw: Any, base: Path) -> Any:
    from stepwatch.cli import UsageError

    if isinstance(raw, str):
        try:
            return _load_rules_file(base / raw)
        except UsageError as exc:
            return str(exc)
    problem = _validate_rules(raw)
    return problem if problem is not None else raw


def _parse_steps_arg(text: str) -> Any:
    from stepwatch.cli import UsageError
    from stepwatch.evaluator.pipeline import parse_expected_steps

    try:
        return parse_expected_steps(text)
    except ValueError as exc:
        raise UsageError(f"--expected-steps: {exc}") from None


def _validate_rules(raw: Any) -> str | None:
    from pydantic import TypeAdapter, ValidationError

    from stepwatch.evaluator.expectations.expectation import RuleSpec

    if not isinstance(raw, list):
        return "rules must be a list"
    try:
        TypeAdapter(list[RuleSpec]).validate_python(raw)
    except ValidationError as exc:
        return _first_error(exc)
    return None


def _load_rules_file(path: Path) -> list[Any]:
    """Rules from YAML: `scorers: [{type: trajectory, rules: [...]}]`, or `rules: [...]`, or a list."""
    import yaml

    from stepwatch.cli import UsageError

    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read rules file ({exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{path}: invalid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    if isinstance(document, dict) and "scorers" in document:
        scorers = document["scorers"]
        if not isinstance(scorers, list):
            raise UsageError(f"{path}: `scorers` must be a list")
        rules: list[Any] = []
        for entry in scorers:
            if isinstance(entry, dict) and entry.get("type") == "trajectory":
                rules.extend(entry.get("rules") or [])
        if not rules:
            raise UsageError(f"{path}: no `type: trajectory` scorer with rules under `scorers`")
    elif isinstance(document, dict) and "rules" in document:
        rules = document["rules"]
    elif isinstance(document, list):
        rules = document
    else:
        raise UsageError(f"{path}: expected `scorers: [{{type: trajectory, rules: [...]}}]`")
    problem = _validate_rules(rules)
    if problem is not None:
        raise UsageError(f"{path}: invalid rules: {problem}")
    return rules


def _expectation(steps: Any, method: str | None, rules: Any, partition: str) -> Any:
    """An Expectation, or a one-line string saying why the inputs do not make one."""
    from pydantic import ValidationError

    from stepwatch.evaluator.expectations.expectation import Expectation

    try:
        return Expectation(
            partition=partition,
            expected_steps=steps,
            scoring_method=method or "edit_distance",
            rules=rules or [],
        )
    except ValidationError as exc:
        return _first_error(exc)


def _first_error(exc: Any) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _load_or_usage_error(path: str, limits: Any = None) -> Any:
    from stepwatch.cli import UsageError

    spans = _load_or_error(Path(path), limits, label=path)
    if isinstance(spans, str):
        raise UsageError(spans)
    return spans


def _load_or_error(path: Path, limits: Any = None, label: str | None = None) -> Any:
    """The file's spans, or the one-line load error. Rejected spans are reported on stderr.
    `limits`: serve's `security.limits` (--config), None for serve's defaults."""
    from stepwatch.loaders.files import LoadError, load_file

    try:
        loaded = load_file(path)
    except LoadError as exc:
        return str(exc) if label is None else str(exc).replace(str(path), label, 1)
    if loaded.rejected:
        reasons = sorted({r.reason for r in loaded.rejected})
        print(
            f"stepwatch score: warning: {label or path}: {len(loaded.rejected)} span(s) rejected "
            f"({', '.join(reasons)}); first: {loaded.rejected[0].detail}",
            file=sys.stderr,
        )
    if not loaded.spans:
        return f"{label or path}: no valid spans to score"
    return _limited(loaded.spans, label or str(path), limits)


def _limited(spans: Any, label: str, limits: Any = None) -> Any:
    """The spans with serve's close-time limits applied (`limits`: serve's `security.limits` from
    --config, else its defaults), so a file scores as the same spans would through `serve`: the
    attributes scoring reads kept first, over-long values truncated (inside the JSON values scoring
    unwraps), extra attributes dropped, JSON nested too deeply left unwrapped. What was limited is
    said on stderr, and whether it cut what scoring reads (the results then carry `limited`)."""
    from stepwatch.evaluator.limited import limited_of
    from stepwatch.receiver.codec.records import limit_spans
    from stepwatch.security.config import LimitsConfig
    from stepwatch.security.limits import LimitCounters

    meter = LimitCounters()
    spans = limit_spans(list(spans), limits if limits is not None else LimitsConfig(), meter)
    if meter.counts:
        hits = ", ".join(f"{name} {count}" for name, count in sorted(meter.counts.items()))
        cut = limited_of(spans)
        print(
            f"stepwatch score: warning: {label}: limits applied as serve applies them: {hits}"
            + (f"; they cut values scoring reads ({', '.join(cut)}): results carry `limited`" if cut else ""),
            file=sys.stderr,
        )
    return spans


def _serve_settings(config: str | None) -> tuple[Any, tuple[str, ...]]:
    """(serve's `security.limits`, serve's `partitioning.task_key_attributes`): from --config (serve's
    YAML) and the environment as serve reads them (STEPWATCH_CONFIG, STEPWATCH_SECURITY__LIMITS__*,
    STEPWATCH_PARTITIONING__*), else serve's defaults; the rest of the file is validated as serve
    would, then ignored. A partition's task key, and so its expectation, is then the one serve finds.
    ConfigError is a usage error (exit 2)."""
    import os

    from stepwatch.evaluator.partitioning import DEFAULT_TASK_KEY_ATTRIBUTES
    from stepwatch.security.config import LimitsConfig

    prefixes = ("STEPWATCH_SECURITY__LIMITS__", "STEPWATCH_PARTITIONING__")
    if config is None and not any(
        name == "STEPWATCH_CONFIG" or name.startswith(prefixes) for name in os.environ
    ):
        return LimitsConfig(), DEFAULT_TASK_KEY_ATTRIBUTES  # serve's config module only when asked for
    from stepwatch.cli import UsageError
    from stepwatch.config import ConfigError, load_config

    try:
        loaded = load_config(Path(config) if config is not None else None)
    except ConfigError as exc:
        raise UsageError(f"--config: {str(exc).splitlines()[0]}") from None
    return loaded.security.limits, tuple(loaded.partitioning.task_key_attributes)


def _score_spans(
    row_id: str | None, label: str, spans: Any, expectation: Any, args: argparse.Namespace
) -> Any:
    """(Record, explain lines) per partition of `spans`."""
    from stepwatch.evaluator.partitioning import (
        DEFAULT_TASK_KEY_ATTRIBUTES,
        partition_sessions,
        partition_traces,
    )
    from stepwatch.receiver.codec import spancore

    fields = spancore.partitioner()  # serve's native passes, as serve runs them
    keys = getattr(args, "task_key_attributes", DEFAULT_TASK_KEY_ATTRIBUTES)
    if args.partition == "session":
        partitions = partition_sessions(spans, keys, include_sessionless=True, fields=fields)
    else:
        partitions = partition_traces(spans, keys, fields=fields)
    forced = getattr(args, "task_key", None)
    registry, runner = _judge_runtime(args)
    for partition in partitions:
        if forced is not None:
            partition = partition.model_copy(update={"task_key": forced})
        record = Record(
            id=row_id if row_id is not None else f"{label}#{partition.id}",
            partition_type=partition.type,
            partition_id=partition.id,
            task_key=partition.task_key,
        )
        try:
            registered = _registered(expectation, partition.task_key, args)
            selected, scorers = _selected_scorers(registry, registered, args)
            inp, record.results = _score_partition(partition, selected, scorers, runner, args.limits)
            record.results = _with_unmet_requests(record.results, args)
        except Exception as exc:  # one partition's failure must not stop the others
            record.error = f"{type(exc).__name__}: {exc}"
            yield record, []
            continue
        yield record, _explain_lines(record.results, inp.steps)


def _load_expectations_file(args: argparse.Namespace) -> Any:
    """--expectations through serve's own loader (stepwatch.expectations_file: size caps, scorer
    names, shape) under --config's `security.limits` (`args.limits`), so a file `score` takes is one
    `serve` and `check-config` take; None without it."""
    if not args.expectations:
        return None
    from stepwatch.cli import UsageError
    from stepwatch.evaluator.expectations.store import ExpectationsError
    from stepwatch.expectations_file import load_expectations_file

    try:
        return load_expectations_file(Path(args.expectations), getattr(args, "limits", None))
    except ExpectationsError as exc:
        raise UsageError(str(exc)) from None


def _registered(explicit: Any, task_key: str | None, args: argparse.Namespace) -> Any:
    """The --expectations file's expectation for `task_key` with what the command line or the row
    gave laid over it (expected steps with their scoring method, rules, plan, outcome steps);
    `explicit` alone for a task key the file does not register."""
    store = getattr(args, "expectations_store", None)
    registered = store.get(task_key) if store is not None else None
    if registered is None:
        return explicit
    from stepwatch.evaluator.expectations.expectation import Expectation

    given = explicit.model_dump() if explicit is not None else {}
    over: dict[str, Any] = {}
    if given.get("expected_steps") is not None:
        over |= {"expected_steps": given["expected_steps"], "scoring_method": given["scoring_method"]}
    elif args.scoring_method:
        over["scoring_method"] = args.scoring_method
    over |= {key: given[key] for key in ("rules", "expected_plan", "expected_trajectory") if given.get(key)}
    return Expectation.model_validate({**registered.model_dump(), **over}) if over else registered


def _judge_runtime(args: argparse.Namespace) -> Any:
    """(registry with the judge scorers, their JudgeRunner), built once per command run."""
    runtime = getattr(args, "judge_runtime", None)
    if runtime is None:
        from stepwatch.evaluator.judge.factory import build_runner
        from stepwatch.evaluator.judge.settings import JudgeServiceConfig, OpenAIJudgeConfig
        from stepwatch.evaluator.scorers.judge_registration import judge_scorer_entries
        from stepwatch.evaluator.scorers.registry import ScorerRegistry

        overrides = {
            key: value
            for key, value in (
                ("base_url", args.judge_base_url),
                ("model", args.judge_model),
                ("api_key_env", args.judge_api_key_env),
                ("timeout_s", args.judge_timeout),
                ("answer_grammar", args.judge_grammar or None),
                ("decoding", getattr(args, "judge_decoding", None)),
            )
            if value
        }
        overrides.setdefault("timeout_s", OFFLINE_REQUEST_TIMEOUT_S)
        service: dict[str, Any] = {"backend": args.judge, "openai": OpenAIJudgeConfig(**overrides)}
        runner = build_runner(JudgeServiceConfig(**service))
        # offline waits for the judge unless capped: partitions are judged one after another, and a
        # deadline sized for streaming (60 s) would drop rows a CPU-served model answers in 70 s
        runner.governor.deadline_s = args.judge_deadline
        if args.judge == "openai":
            _say_judge_logs()
        runtime = (ScorerRegistry.builtin().extended(judge_scorer_entries(runner)), runner)
        args.judge_runtime = runtime
    return runtime


class _StderrLines(logging.Handler):
    """`stepwatch score: <message>` on the current sys.stderr (looked up per line, not kept)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"stepwatch score: {record.getMessage()}", file=sys.stderr)


def _say_judge_logs() -> None:
    """The judge's own lines (which decoding mode it chose, fallbacks) on stderr: offline there is
    no service logging to carry them."""
    judge_log = logging.getLogger("stepwatch.judge")
    if not any(isinstance(h, _StderrLines) for h in judge_log.handlers) and not logging.getLogger().handlers:
        judge_log.addHandler(_StderrLines())
        judge_log.setLevel(logging.INFO)


def _check_scorer_names(args: argparse.Namespace) -> None:
    from stepwatch.cli import UsageError
    from stepwatch.evaluator.scorers.registry import UnknownScorerError

    if args.scorer:
        try:
            _judge_runtime(args)[0].check_names(args.scorer)
        except UnknownScorerError as exc:
            raise UsageError(f"--scorer: {exc}") from None


def _with_judge_fields(expectation: Any, row: dict[str, Any]) -> Any:
    """A row's expected_plan / expected_trajectory join its expectation (also for trace-file rows),
    and name their judge scorer: a row is its own task, and its field is its request for that
    scorer (the spec's request fields), as `judge.scorers` is a registered task's."""
    from pydantic import ValidationError

    from stepwatch.evaluator.expectations.expectation import Expectation

    fields = {key: row[key] for key in ("expected_plan", "expected_trajectory") if key in row}
    if not fields:
        return expectation
    base = expectation.model_dump() if expectation is not None else {}
    named = [JUDGE_SCORER_OF[key] for key in fields]
    judge = dict(base.get("judge") or {})
    judge["scorers"] = list(dict.fromkeys([*(judge.get("scorers") or []), *named]))
    try:
        return Expectation.model_validate({**base, **fields, "judge": judge})
    except ValidationError as exc:
        return _first_error(exc)


def _selected_scorers(registry: Any, expectation: Any, args: argparse.Namespace) -> tuple[Any, list[Any]]:
    """(expectation, scorers): --scorer names run as if the expectation listed them."""
    from stepwatch.evaluator.expectations.expectation import Expectation

    if not args.scorer:
        return expectation, registry.scorers_for(expectation)
    base = expectation.model_dump() if expectation is not None else {}
    expectation = Expectation.model_validate({**base, "scorers": list(args.scorer)})
    return expectation, [registry.create(name, expectation) for name in args.scorer]


UNMET_REASONS = {
    SUMMARY_METRIC: "no expected steps to score against: none from --expected-steps, the dataset row or "
    "the trace's aip.eval.expected_steps (every partition must resolve them, or scoring fails)",
    "trajectory_steps": "no expected_trajectory (nor expected_steps) to judge against",
    "trajectory": "no trajectory rules given (--rules or the row's rules)",
}


def _with_unmet_requests(results: list[Any], args: argparse.Namespace) -> list[Any]:
    """An error result for each scorer asked for by --scorer that produced no result: asked for and
    silently absent would read as "nothing to report" and exit 0."""
    if not args.scorer:
        return results
    from stepwatch.evaluator.results import ScoreResult

    produced = {result.metric for result in results}
    unmet = [name for name in dict.fromkeys(args.scorer) if name not in produced]
    reasons = [UNMET_REASONS.get(name, "this scorer does not apply to the partition") for name in unmet]
    return results + [ScoreResult(metric=name, error=why) for name, why in zip(unmet, reasons, strict=True)]


def _run_async(inp: Any, scorers: list[Any], runner: Any) -> list[Any]:
    """Judge scorers are async: one event loop per partition; the judge's HTTP session closes with it."""
    from stepwatch.evaluator.pipeline import run_async_scorers

    async def scored() -> list[Any]:
        try:
            return await run_async_scorers(inp, scorers)
        finally:
            close = getattr(runner.judge, "aclose", None)
            if close is not None:
                await close()

    return asyncio.run(scored())


def _score_partition(
    partition: Any, expectation: Any, scorers: list[Any], runner: Any, limits: Any = None
) -> Any:
    """The engine's own scoring step (evaluator/engine.py), under serve's limits: a partition too
    large to align gets the same not_scored results as it would in `serve`."""
    from stepwatch.evaluator.engine import evaluate
    from stepwatch.receiver.codec import spancore

    done = evaluate(partition, expectation, scorers, _serve_guard(limits), spancore.observer())
    if done.pending:
        done.results.extend(_run_async(done.inp, done.pending, runner))
    return done.inp, done.results


def _serve_guard(limits: Any = None) -> Any:
    """The scoring guard under serve's limits (`limits`, else serve's defaults)."""
    from stepwatch.security.config import LimitsConfig
    from stepwatch.security.limits import LimitCounters, guard

    limits, meter = limits if limits is not None else LimitsConfig(), LimitCounters()
    return lambda inp: guard(inp, limits, meter)


def _guarded(inp: Any, scorers: list[Any], limits: Any = None) -> tuple[list[Any], list[Any]]:
    """(scorers to run, not_scored results of those serve's guard stops) for an inline row."""
    from stepwatch.evaluator.engine import guarded_scorers

    return guarded_scorers(scorers, _serve_guard(limits)(inp))


def _score_inline(job: InlineJob, args: argparse.Namespace) -> Record:
    from stepwatch.evaluator.inline_rows import inline_scoring_input
    from stepwatch.loaders.openinference_json import decode_openinference

    registry, runner = _judge_runtime(args)
    record = Record(id=job.id, partition_type="trace")
    try:
        expectation, scorers = _selected_scorers(registry, job.expectation, args)
        inp = inline_scoring_input(
            job.row,
            expectation,
            lambda doc: _limited(decode_openinference(doc).spans, job.id, args.limits),
            job.id,
        )
        record.partition_id, record.task_key = inp.partition.id, inp.partition.task_key
        run, skipped = _guarded(inp, scorers, args.limits)
        record.results = _with_unmet_requests([*_run_async(inp, run, runner), *skipped], args)
    except ValueError as exc:  # DecodeError included: a bad inline trace is this row's error
        record.error = f"{job.id}: {exc}"
    return record


def _explain_lines(results: list[Any], steps: list[Any]) -> list[str]:
    """`--explain`: the step-accuracy alignment (moved steps marked), its summary, the failed
    trajectory rules and every other metric's reason line, all read from the structured
    explanation each result carries (the one serve emits)."""
    lines: list[str] = []
    aligned = False
    for result in results:
        structured = result.structured
        if result.metric == SUMMARY_METRIC:
            aligned = True
            if result.error is not None:
                lines.append(f"  step accuracy error: {result.error}")
            elif structured is not None:
                lines.extend(_alignment_lines(result, structured.parts()))
        elif structured is not None and result.metric == "trajectory":
            failed = structured.parts()["failed_rules"]
            if failed:
                lines.append("  failed rules (trajectory):")
                for rule in failed:
                    where = f" [step {rule['step_index']}" if rule["step_index"] is not None else ""
                    if where and rule["span_id"]:
                        where += f", span {rule['span_id']}"
                    lines.append(f"    {rule['reason']}{where + ']' if where else ''}")
        elif structured is not None and structured.reason:
            lines.append(f"  {result.metric}: {structured.reason}")
    if not aligned:
        observed = ", ".join(step.name for step in steps) or "(none)"
        lines.insert(0, f"  no expected steps resolved; observed steps: {observed}")
    return lines


def _alignment_lines(result: Any, parts: dict[str, Any]) -> list[str]:
    """The alignment table, a move marked on both its rows (`moved ->N`: the expected step ran at
    row N; `moved <-N`: the observed step was expected at row N), then the summary."""
    rows = [("#", "op", "expected", "observed", "group", "moved")]
    for number, row in enumerate(parts["alignment"], start=1):
        group = row["group"]
        marks = []
        if row["moved_to"] is not None:
            marks.append(f"->{row['moved_to'] + 1}")
        if row["moved_from"] is not None:
            marks.append(f"<-{row['moved_from'] + 1}")
        rows.append(
            (
                str(number),
                row["op"],
                row["expected"] or "-",
                row["observed"] or "-",
                f"[{group}]" if group is not None else "",
                " ".join(marks),
            )
        )
    lines = [f"  alignment ({result.metadata.get('scoring_method', '')}):"]
    lines.extend("    " + line.rstrip() for line in _columns(rows))
    summary = parts["summary"]
    for label in ("missing", "moved", "extra"):
        if summary[label]:
            lines.append(f"    {label}: {', '.join(summary[label])}")
    if summary["substituted"]:
        pairs = ", ".join(f"{s['expected']} -> {s['observed']}" for s in summary["substituted"])
        lines.append(f"    substituted: {pairs}")
    ignored = result.metadata.get("ignored_steps")
    if ignored:
        lines.append(f"    ignored: {', '.join(ignored)}")
    return lines


def _emit_json(record: Record, out: TextIO) -> None:
    out.write(json.dumps(record.as_json(), default=str) + "\n")
    out.flush()


def _format_score(metric: str, result: Any) -> str:
    if result.error is not None:
        return "error"
    if result.score is None:
        return "n/a"
    if metric in INTEGER_METRICS:
        return str(int(result.score))
    return f"{result.score:.3f}"


def _format_pass(result: Any) -> str:
    if result.error is not None or result.passed is None:
        return "-"
    return "pass" if result.passed else "FAIL"


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]


def _finish(records: list[Record], args: argparse.Namespace) -> int:
    """The exit code, after a summary on stderr of every row not scored and why: 1 when any
    partition or result failed (an error, or a judge that could not score: down, over budget,
    past --judge-deadline, abstaining), 0 otherwise (a sampled-out judge is a decision). With
    --check, the gate's lines follow, and a failing partition (a score below its threshold, a
    failed rule, no verdict at all) exits 1 too."""
    lines = not_scored_summary(records)
    if lines:
        print("\n".join(lines), file=sys.stderr)
    code = 1 if any(record.failed for record in records) else 0
    if getattr(args, "check", False):
        gate = verdict(records, lambda record: unchecked_reason(record, args))
        print("\n".join(f"stepwatch score: {line}" for line in gate.lines()), file=sys.stderr)
        if not gate.passed:
            code = 1
    return code


def unchecked_reason(record: Any, args: argparse.Namespace) -> str:
    """Why a partition got no verdict: its task key is not in --expectations (the usual cause: an
    agent renamed, a task key misspelt), else no expectation gave it a threshold or a rule."""
    store = getattr(args, "expectations_store", None)
    if store is not None and record.task_key not in store:
        return (
            f"nothing checked: task key {record.task_key!r} is not registered in {args.expectations} "
            f"(it registers: {_task_keys(store)}; --task-key KEY scores it as one of them)"
        )
    return f"{NOTHING_CHECKED} (give --expectations, --expected-steps or --rules)"


def _task_keys(store: Any, shown: int = 5) -> str:
    """The file's task keys for a message, the first `shown` of them."""
    keys = list(store.task_keys)
    more = f" (+{len(keys) - shown} more)" if len(keys) > shown else ""
    return (", ".join(keys[:shown]) or "none") + more


def not_scored_summary(records: list[Record]) -> list[str]:
    """`stepwatch score: N of M row(s) not fully scored:` then one line per (metric, reason) with
    its count and the first row ids, for what fails the run (errors, a judge that could not score,
    a limit); [] when nothing did."""
    reasons: dict[tuple[str, str], list[str]] = {}
    rows: set[str] = set()
    for record in records:
        if record.error is not None:
            reasons.setdefault(("row", f"error: {record.error}"), []).append(record.id)
            rows.add(record.id)
            continue
        for result in record.results:
            if result.error is not None:
                why = f"error: {result.error}"
            elif result.not_scored is not None and (
                judge_failed(result) or result.metadata.get("limit_exceeded")
            ):
                why = result.not_scored
            else:
                continue  # scored, or skipped by design (a sampled-out judge, a statistic with no data)
            reasons.setdefault((result.metric, why), []).append(record.id)
            rows.add(record.id)
    if not reasons:
        return []
    lines = [f"stepwatch score: {len(rows)} of {len(records)} row(s) not fully scored:"]
    for (metric, why), ids in sorted(reasons.items(), key=lambda item: -len(item[1])):
        shown = ", ".join(ids[:5]) + (f", ... ({len(ids) - 5} more)" if len(ids) > 5 else "")
        lines.append(f"  {len(ids)} x {metric}: {why} [{shown}]")
    return lines


def _print_table(records: list[Record], explains: dict[int, list[str]], out: TextIO) -> None:
    header = ("ID", "PARTITION", "TASK", "METRIC", "SCORE", "PASS")
    rows: list[tuple[str, ...]] = [header]
    owners: list[int] = [-1]
    for index, record in enumerate(records):
        partition = f"{record.partition_type} {record.partition_id}" if record.partition_type else "-"
        if record.error is not None:
            rows.append((record.id, partition, record.task_key or "-", "error", record.error, "-"))
            owners.append(index)
            continue
        for position, result in enumerate(record.results):
            first = position == 0
            rows.append(
                (
                    record.id if first else "",
                    partition if first else "",
                    (record.task_key or "-") if first else "",
                    result.metric,
                    _format_score(result.metric, result),
                    _format_pass(result),
                )
            )
            owners.append(index)
    lines = _columns(rows)
    previous = -1
    for line, owner in zip(lines, owners, strict=True):
        if owner != previous and previous >= 0 and explains.get(previous):
            out.write("\n".join(explains[previous]) + "\n")
        out.write(line + "\n")
        previous = owner
    if previous >= 0 and explains.get(previous):
        out.write("\n".join(explains[previous]) + "\n")
    out.write(_summary(records) + "\n")


def _summary(records: list[Record]) -> str:
    """The partition count, then one line per metric (in first-seen order): how many were scored,
    the mean score, and the pass rate over the results that have a verdict (statistics without a
    maximum have none: `-`); not-scored and errored results are counted, never averaged."""
    errors = sum(record.failed for record in records)
    head = f"{len(records)} partition(s), {errors} with errors"
    by_metric: dict[str, list[Any]] = {}
    for record in records:
        for result in record.results:
            by_metric.setdefault(result.metric, []).append(result)
    if not by_metric:
        return head
    rows: list[tuple[str, ...]] = [("METRIC", "SCORED", "MEAN", "PASS RATE", "NOT SCORED", "ERRORS")]
    for metric, results in by_metric.items():
        scored = [r for r in results if r.score is not None and r.error is None]
        judged = [r for r in scored if r.passed is not None]
        mean = "-"
        if scored:
            value = sum(r.score for r in scored) / len(scored)
            mean = f"{value:.1f}" if metric in INTEGER_METRICS else f"{value:.3f}"
        rate = "-"
        if judged:
            passed = sum(bool(r.passed) for r in judged)
            rate = f"{passed}/{len(judged)} ({100 * passed / len(judged):.0f}%)"
        failed = sum(r.error is not None for r in results)
        skipped = len(results) - len(scored) - failed
        rows.append((metric, str(len(scored)), mean, rate, str(skipped), str(failed)))
    return "\n".join([head, *_columns(rows)])
