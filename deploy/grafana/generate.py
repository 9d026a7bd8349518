"""Generate the Stepwatch Grafana dashboard (deploy/grafana/dashboards/stepwatch.json) from code.

Built with grafana-foundation-sdk (Grafana's dashboards-as-code library). Every query uses only the
metric names of docs/metrics.md and the recording rules of deploy/prometheus/rules/stepwatch.rules.yml.

    .venv/bin/python deploy/grafana/generate.py          # rewrite the committed JSON
    .venv/bin/python deploy/grafana/generate.py --check  # exit 1 if the committed JSON is stale

tests/deploy/test_grafana_dashboard.py checks that the committed file equals this output and that
every PromQL expression in it parses and returns data against synthetic series (promtool).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import bargauge, dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders.common import (
    ReduceDataOptions,
    StackingConfig,
    TableSortByFieldState,
    VizLegendOptions,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUTPUT = Path(__file__).resolve().parent / "dashboards" / "stepwatch.json"
UID = "stepwatch-overview"

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
# Series selectors shared by the score panels (the template variables are multi-value regexes).
# stepwatch_evaluation_score_ratio holds quality scores only (0-1); the trajectory statistics have
# families of their own (docs/metrics.md), shown in the "Trajectory statistics" row.
# The recording rules have no `version` label: SCORE_SEL; the score families themselves also
# follow the version variable (docs/metrics.md, "Versions"); the per-step families have no version.
SCORE_SEL = 'task_key=~"$task_key", metric=~"$metric"'
SERIES_SEL = SCORE_SEL + ', version=~"$version"'
TASK_SEL = 'task_key=~"$task_key"'
STATS_SEL = TASK_SEL + ', version=~"$version"'
# Per task key, metric and version (the Versions row).
BY_VERSION = "sum by (task_key, metric, version)"
VERSION_Z = "task_key_metric_version:stepwatch_evaluations_pass_ratio_deficit:zscore1h"
# Expected steps of registered task keys by outcome (docs/metrics.md, "Which steps fail").
STEP_OUTCOMES = "stepwatch_expected_step_outcomes_total"
STEP_OUTCOME_VALUES = ("matched", "missing", "moved", "substituted")


def _query(
    expr: str, legend: str, ref: str = "A", *, instant: bool = False, table: bool = True
) -> prometheus.Dataquery:
    """A range query, or an instant one (as a table unless `table=False`: a bar gauge wants one
    series per bar)."""
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    if not instant:
        return q.range()
    return q.instant().format(PromQueryFormat.TABLE) if table else q.instant()


def _thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    return (
        dashboard.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=value, color=color) for value, color in steps])
    )


def _timeseries(title: str, description: str, unit: str, *queries: prometheus.Dataquery) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .height(8)
        .span(12)
        .legend(
            VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
    )
    for q in queries:
        panel = panel.with_target(q)
    return panel


def _variables() -> list[Any]:
    return [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        dashboard.QueryVariable("task_key")
        .label("Task key")
        .description("Task keys with an evaluation (label_values over stepwatch_evaluations_total).")
        .datasource(DATASOURCE)
        .query("label_values(stepwatch_evaluations_total, task_key)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*"),
        dashboard.QueryVariable("metric")
        .label("Metric")
        .description(
            "Scorer names (agent.step_accuracy, trajectory, trajectory_steps, plan_adherence, trajectory.*)."
        )
        .datasource(DATASOURCE)
        .query('label_values(stepwatch_evaluations_total{task_key=~"$task_key"}, metric)')
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*"),
        dashboard.QueryVariable("version")
        .label("Version")
        .description(
            "Agent versions of the selected task keys (the `version` label: at most "
            "exporters.prometheus.max_versions_per_task per task key, plus `other`; `unknown` when none was found)."
        )
        .datasource(DATASOURCE)
        .query('label_values(stepwatch_evaluations_total{task_key=~"$task_key"}, version)')
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*"),
    ]


def _score_rows(board: dashboard.Dashboard) -> dashboard.Dashboard:
    board = board.with_row(dashboard.Row("Scores"))
    board = board.with_panel(
        _timeseries(
            "Score trend by task key and metric",
            "Average quality score (0-1; plan_adherence divided by 100) of the partitions scored in each interval: "
            "rate of the ratio histogram's _sum over its _count; and the median from its buckets. The dots are "
            "exemplars on the buckets: one recent run's score at its scoring time, with its trace_id and span_id. "
            "With the data source's exemplar link set (docs/operations.md, From a score to its trace), a dot "
            "opens that trace.",
            "percentunit",
            _query(
                f"sum by (task_key, metric) (rate(stepwatch_evaluation_score_ratio_sum{{{SERIES_SEL}}}[$__rate_interval]))\n"
                f"/\nsum by (task_key, metric) (rate(stepwatch_evaluation_score_ratio_count{{{SERIES_SEL}}}[$__rate_interval]))",
                "{{task_key}} {{metric}}",
            ),
            # Exemplars are attached to the _bucket lines only, so the target that shows them reads those.
            _query(
                "histogram_quantile(0.5, sum by (le, task_key, metric) "
                f"(rate(stepwatch_evaluation_score_ratio_bucket{{{SERIES_SEL}}}[$__rate_interval])))",
                "{{task_key}} {{metric}} median",
                "B",
            ).exemplar(True),
        )
    )
    board = board.with_panel(
        _timeseries(
            "Pass rate",
            "pass / (pass + fail) per task key and metric; errors and not_scored are shown under Evaluations by outcome.",
            "percentunit",
            _query(
                f'sum by (task_key, metric) (rate(stepwatch_evaluations_total{{{SERIES_SEL}, outcome="pass"}}[$__rate_interval]))\n'
                f'/\nsum by (task_key, metric) (rate(stepwatch_evaluations_total{{{SERIES_SEL}, outcome=~"pass|fail"}}[$__rate_interval]))',
                "{{task_key}} {{metric}}",
            ),
        )
        .min(0)
        .max(1)
    )
    board = board.with_panel(
        _timeseries(
            "Regression versus 7-day baseline",
            "1h average score minus the 7-day average (recording rules). StepwatchTrajectoryRegression fires "
            "below minus the margin (default 0.1) with enough scored partitions.",
            "none",
            _query(
                f"task_key_metric:stepwatch_evaluation_score_ratio:avg_rate1h{{{SCORE_SEL}}}\n"
                f"- on (task_key, metric)\ntask_key_metric:stepwatch_evaluation_score_ratio:avg_rate7d{{{SCORE_SEL}}}",
                "{{task_key}} {{metric}}",
            ),
        ).thresholds(_thresholds((None, "red"), (-0.1, "yellow"), (0, "green")))
    )
    board = board.with_panel(
        bargauge.Panel()
        .title("Worst task keys (1h average score)")
        .description("The ten task keys and metrics with the lowest 1h average quality score.")
        .datasource(DATASOURCE)
        .height(8)
        .span(12)
        .unit("none")
        .min(0)
        .max(1)
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .thresholds(_thresholds((None, "red"), (0.6, "yellow"), (0.8, "green")))
        .with_target(
            _query(
                f"bottomk(10, task_key_metric:stepwatch_evaluation_score_ratio:avg_rate1h{{{SCORE_SEL}}})",
                "{{task_key}} {{metric}}",
                instant=True,
            )
        )
    )
    board = board.with_panel(
        table.Panel()
        .title("Latest score")
        .description(
            "stepwatch_evaluation_last_score_ratio: the most recent quality score (0-1) per task key, metric, "
            "partition type and version (each version keeps its own last score)."
        )
        .datasource(DATASOURCE)
        .height(8)
        .span(12)
        .with_target(
            _query(
                "max by (task_key, metric, partition_type, version) "
                f"(stepwatch_evaluation_last_score_ratio{{{SERIES_SEL}}})",
                "",
                instant=True,
            )
        )
    )
    board = board.with_panel(
        _timeseries(
            "Evaluations by outcome",
            "Evaluations per second by outcome (pass, fail, error, not_scored).",
            "ops",
            _query(
                f"sum by (outcome) (rate(stepwatch_evaluations_total{{{SERIES_SEL}}}[$__rate_interval]))",
                "{{outcome}}",
            ),
        ).stacking(StackingConfig().mode(common.StackingMode.NORMAL))
    )
    return board


def _version_pass_rate(window: str) -> str:
    """pass / (pass + fail) per task key, metric and version over `window`; 0 (not absent) for a
    version whose every evaluation failed, as its pass counter does not exist then."""
    passfail = f'stepwatch_evaluations_total{{{SERIES_SEL}, outcome=~"pass|fail"}}[{window}]'
    return (
        f'(\n  {BY_VERSION} (increase(stepwatch_evaluations_total{{{SERIES_SEL}, outcome="pass"}}[{window}]))\n'
        f"  or on (task_key, metric, version)\n  0 * {BY_VERSION} (increase({passfail}))\n)\n"
        f"/ on (task_key, metric, version)\n{BY_VERSION} (increase({passfail}))"
    )


def _version_mean_score(window: str) -> str:
    """The mean quality score (0-1) per task key, metric and version over `window`."""
    return (
        f"{BY_VERSION} (increase(stepwatch_evaluation_score_ratio_sum{{{SERIES_SEL}}}[{window}]))\n"
        f"/\n{BY_VERSION} (increase(stepwatch_evaluation_score_ratio_count{{{SERIES_SEL}}}[{window}]))"
    )


def _version_rows(board: dashboard.Dashboard) -> dashboard.Dashboard:
    """Pass rate and mean score per version of the selected task keys (issue 38 item 1), and the
    statistic StepwatchVersionRegression reads (item 2)."""
    board = board.with_row(dashboard.Row("Versions"))
    columns = ("pass rate", "mean score", "evaluations")
    rename = {f"Value #{ref}": name for ref, name in zip("ABC", columns, strict=True)}
    board = board.with_panel(
        table.Panel()
        .title("Pass rate and mean score by version")
        .description(
            "Per task key, metric and version, over the dashboard's time range: the pass rate (pass / (pass + "
            "fail)), the mean quality score (0-1; none for the trajectory statistics) and the pass and fail "
            'evaluations behind them. version="other" pools the versions that gave their slot to newer ones '
            "(exporters.prometheus.max_versions_per_task); unknown: no version attribute was found. Lowest "
            "pass rate first."
        )
        .datasource(DATASOURCE)
        .height(10)
        .span(12)
        .unit("percentunit")
        .decimals(1)
        .with_target(_query(_version_pass_rate("$__range"), "", "A", instant=True))
        .with_target(_query(_version_mean_score("$__range"), "", "B", instant=True))
        .with_target(
            _query(
                f'{BY_VERSION} (increase(stepwatch_evaluations_total{{{SERIES_SEL}, outcome=~"pass|fail"}}[$__range]))',
                "",
                "C",
                instant=True,
            )
        )
        .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True},
                    "indexByName": {
                        name: i for i, name in enumerate(("task_key", "metric", "version", *rename.values()))
                    },
                    "renameByName": rename,
                },
            )
        )
        .override_by_name(
            "evaluations",
            [
                dm.DynamicConfigValue(id_val="unit", value="short"),
                dm.DynamicConfigValue(id_val="decimals", value=0),
            ],
        )
        .sort_by([TableSortByFieldState().display_name("pass rate").desc(False)])
    )
    board = board.with_panel(
        _timeseries(
            "Pass rate by version",
            "pass / (pass + fail) per task key, metric and version of the selected task keys.",
            "percentunit",
            _query(_version_pass_rate("$__rate_interval"), "{{task_key}} {{metric}} {{version}}"),
        )
        .min(0)
        .max(1)
    )
    board = board.with_panel(
        _timeseries(
            "Mean score by version",
            "Average quality score (0-1; plan_adherence divided by 100) per task key, metric and version.",
            "percentunit",
            _query(_version_mean_score("$__rate_interval"), "{{task_key}} {{metric}} {{version}}"),
        )
        .min(0)
        .max(1)
    )
    board = board.with_panel(
        _timeseries(
            "Version pass-rate deficit (z)",
            "How many standard errors each version's 1h pass rate lies below its task's other versions pooled "
            "(two-proportion z-test; recording rule). StepwatchVersionRegression fires above the threshold "
            "(default 3.09) when the deficit is also at least 0.05 and both sides have 50 evaluations "
            "(docs/operations.md, How the version alert decides).",
            "none",
            _query(f"{VERSION_Z}{{{SERIES_SEL}}}", "{{task_key}} {{metric}} {{version}}"),
        )
        .span(18)
        .thresholds(_thresholds((None, "green"), (3.09, "red")))
    )
    return board.with_panel(
        stat.Panel()
        .title("Version label overflow in range")
        .description(
            "Versions that gave their slot (and series) to a newer one (stepwatch_version_label_evictions_total), "
            'and scored partitions counted under version="other" because their version had given way '
            "(stepwatch_version_label_overflow_total). Many evictions: the version attribute changes per "
            "run (a build id?); raise exporters.prometheus.max_versions_per_task or pick another attribute."
        )
        .datasource(DATASOURCE)
        .height(8)
        .span(6)
        .unit("short")
        .decimals(0)
        .graph_mode(common.BigValueGraphMode.NONE)
        .thresholds(_thresholds((None, "green"), (1, "yellow")))
        .with_target(
            _query(
                "sum(increase(stepwatch_version_label_evictions_total[$__range]))",
                "evictions",
                instant=True,
                table=False,
            )
        )
        .with_target(
            _query(
                "sum(increase(stepwatch_version_label_overflow_total[$__range]))",
                "other",
                "B",
                instant=True,
                table=False,
            )
        )
    )


def _top_bars(title: str, description: str, expr: str, legend: str) -> bargauge.Panel:
    """A horizontal bar per series of an instant topk() query, largest first."""
    return (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .height(8)
        .span(12)
        .unit("short")
        .decimals(0)
        .min(0)
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .reduce_options(ReduceDataOptions().values(False).calcs(["lastNotNull"]))
        .thresholds(_thresholds((None, "orange")))
        .with_target(_query(expr, legend, instant=True, table=False))
    )


def _outcome_share(outcome: str) -> str:
    """Share of one outcome among a step's outcomes over the range; 0 (not absent) for a step that
    never had it, as the counter of an outcome exists only once it happened."""
    by = "sum by (task_key, step)"
    selected = f"{STEP_OUTCOMES}{{{TASK_SEL}}}[$__range]"
    return (
        f'(\n  {by} (increase({STEP_OUTCOMES}{{{TASK_SEL}, outcome="{outcome}"}}[$__range]))\n'
        f"  or on (task_key, step)\n  0 * {by} (increase({selected}))\n)\n"
        f"/ on (task_key, step)\n{by} (increase({selected}))"
    )


def _step_rows(board: dashboard.Dashboard) -> dashboard.Dashboard:
    """Which expected steps and rules fail, per registered task key (issue 37 item 5)."""
    board = board.with_row(dashboard.Row("Most-missed steps"))
    board = board.with_panel(
        _top_bars(
            "Most-missed expected steps",
            "The ten expected steps never performed most often over the dashboard's time range "
            '(stepwatch_expected_step_outcomes_total{outcome="missing"}), registered task keys only. '
            'step="other" holds the steps past exporters.prometheus.max_steps_per_task.',
            f'topk(10, sum by (task_key, step) (increase({STEP_OUTCOMES}{{{TASK_SEL}, outcome="missing"}}[$__range])) > 0)',
            "{{task_key}}: {{step}}",
        )
    )
    board = board.with_panel(
        _top_bars(
            "Most-failed trajectory rules",
            "The ten trajectory rules that failed most often over the dashboard's time range "
            "(stepwatch_rule_failures_total), registered task keys only.",
            f"topk(10, sum by (task_key, rule) (increase(stepwatch_rule_failures_total{{{TASK_SEL}}}[$__range])) > 0)",
            "{{task_key}}: {{rule}}",
        )
    )
    shares = table.Panel()
    for ref, outcome in zip("ABCD", STEP_OUTCOME_VALUES, strict=True):
        shares = shares.with_target(_query(_outcome_share(outcome), "", ref, instant=True))
    shares = shares.with_target(
        _query(
            f"sum by (task_key, step) (increase({STEP_OUTCOMES}{{{TASK_SEL}}}[$__range]))",
            "",
            "E",
            instant=True,
        )
    )
    rename = {
        f"Value #{ref}": name for ref, name in zip("ABCDE", (*STEP_OUTCOME_VALUES, "outcomes"), strict=True)
    }
    board = board.with_panel(
        shares.title("Step outcome shares")
        .description(
            "Per expected step of the selected task keys, over the dashboard's time range: the share of its "
            "outcomes that matched, were missing (never performed), moved (performed out of order) or were "
            "substituted (another step ran in its place), and how many outcomes that is (one per run and "
            "occurrence in expected_steps). Most missed first."
        )
        .datasource(DATASOURCE)
        .height(10)
        .span(18)
        .unit("percentunit")
        .decimals(1)
        .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True},
                    "indexByName": {name: i for i, name in enumerate(("task_key", "step", *rename.values()))},
                    "renameByName": rename,
                },
            )
        )
        .override_by_name(
            "outcomes",
            [
                dm.DynamicConfigValue(id_val="unit", value="short"),
                dm.DynamicConfigValue(id_val="decimals", value=0),
            ],
        )
        .sort_by([TableSortByFieldState().display_name("missing").desc(True)])
    )
    return board.with_panel(
        stat.Panel()
        .title("Step series overflow in range")
        .description(
            'Observations counted under step="other" or rule="other" because their task key had used '
            "exporters.prometheus.max_steps_per_task label values (stepwatch_step_series_overflow_total). "
            "Above 0: raise the bound, or split the task key."
        )
        .datasource(DATASOURCE)
        .height(10)
        .span(6)
        .unit("short")
        .decimals(0)
        .graph_mode(common.BigValueGraphMode.NONE)
        .thresholds(_thresholds((None, "green"), (1, "yellow")))
        .with_target(
            _query(
                "sum by (family) (increase(stepwatch_step_series_overflow_total[$__range]))",
                "{{family}}",
                instant=True,
                table=False,
            )
        )
    )


def _quantiles(family: str, title: str, description: str, unit: str) -> timeseries.Panel:
    """p50 and p90 per task key of one trajectory-statistics histogram."""
    queries = [
        _query(
            f"histogram_quantile({q}, sum by (task_key, le) (rate({family}_bucket{{{STATS_SEL}}}[$__rate_interval])))",
            f"{{{{task_key}}}} p{int(q * 100)}",
            ref,
        )
        for q, ref in ((0.5, "A"), (0.9, "B"))
    ]
    return _timeseries(title, description, unit, *queries).span(8)


def _statistics_rows(board: dashboard.Dashboard) -> dashboard.Dashboard:
    board = board.with_row(dashboard.Row("Trajectory statistics"))
    board = board.with_panel(
        _quantiles(
            "stepwatch_trajectory_duration_seconds",
            "Trajectory duration",
            "First span start to last span end per partition (trajectory.latency_seconds), p50 and p90.",
            "s",
        )
    )
    board = board.with_panel(
        _quantiles(
            "stepwatch_trajectory_steps",
            "Steps per trajectory",
            "Steps the agent took per partition (trajectory.step_count), p50 and p90.",
            "short",
        )
    )
    return board.with_panel(
        _quantiles(
            "stepwatch_trajectory_tokens",
            "Tokens per trajectory",
            "Input plus output tokens per partition (trajectory.total_tokens), p50 and p90.",
            "short",
        )
    )


def _ingest_rows(board: dashboard.Dashboard) -> dashboard.Dashboard:
    board = board.with_row(dashboard.Row("Ingest and buffering"))
    board = board.with_panel(
        _timeseries(
            "Ingest rate",
            "Spans received per second by protocol.",
            "ops",
            _query(
                "sum by (protocol) (rate(stepwatch_spans_received_total[$__rate_interval]))", "{{protocol}}"
            ),
        )
    )
    board = board.with_panel(
        _timeseries(
            "Rejected and late spans",
            "Spans rejected per second by reason, and spans that arrived after their partition was scored.",
            "ops",
            _query(
                "sum by (reason) (rate(stepwatch_spans_rejected_total[$__rate_interval]))",
                "rejected: {{reason}}",
            ),
            _query("sum(rate(stepwatch_spans_late_total[$__rate_interval]))", "late", "B"),
        )
    )
    board = board.with_panel(
        _timeseries(
            "Partitions closed by reason",
            "Traces and sessions closed per second, by partition type and why they closed.",
            "ops",
            _query(
                "sum by (partition_type, reason) (rate(stepwatch_partitions_closed_total[$__rate_interval]))",
                "{{partition_type}}: {{reason}}",
            ),
        )
    )
    board = board.with_panel(
        _timeseries(
            "Buffer fill",
            "Buffered spans over the configured limit, per instance. At 100% the receiver pushes back.",
            "percentunit",
            _query(
                "max by (instance) (stepwatch_buffered_spans)\n/ on (instance)\nmax by (instance) (stepwatch_buffered_spans_limit > 0)",
                "{{instance}}",
            ),
        )
        .min(0)
        .max(1)
        .thresholds(_thresholds((None, "green"), (0.75, "yellow"), (0.9, "red")))
    )
    board = board.with_panel(
        _timeseries(
            "Score latency",
            "Last span arrival to score emitted (stepwatch_score_latency_seconds), p50 and p99.",
            "s",
            _query(
                "histogram_quantile(0.5, sum by (le) (rate(stepwatch_score_latency_seconds_bucket[$__rate_interval])))",
                "p50",
            ),
            _query(
                "histogram_quantile(0.99, sum by (le) (rate(stepwatch_score_latency_seconds_bucket[$__rate_interval])))",
                "p99",
                "B",
            ),
        )
    )
    board = board.with_panel(
        _timeseries(
            "Buffered partitions",
            "Open traces and sessions held in memory.",
            "short",
            _query("sum by (partition_type) (stepwatch_buffered_partitions)", "{{partition_type}}"),
        )
    )
    return board


def _stream_rows(board: dashboard.Dashboard) -> dashboard.Dashboard:
    board = board.with_row(dashboard.Row("Judges and score streams"))
    board = board.with_panel(
        stat.Panel()
        .title("Judge cost in range")
        .description("USD spent on judge requests over the dashboard's time range, per backend.")
        .datasource(DATASOURCE)
        .height(8)
        .span(6)
        .unit("currencyUSD")
        .graph_mode(common.BigValueGraphMode.NONE)
        .with_target(
            _query(
                "sum by (backend) (increase(stepwatch_judge_cost_usd_total[$__range]))",
                "{{backend}}",
                instant=True,
            )
        )
    )
    board = board.with_panel(
        _timeseries(
            "Judge cost rate",
            "USD per hour spent on judge requests, per backend.",
            "currencyUSD",
            _query(
                "sum by (backend) (rate(stepwatch_judge_cost_usd_total[$__rate_interval])) * 3600",
                "{{backend}}",
            ),
        ).span(6)
    )
    board = board.with_panel(
        _timeseries(
            "Judge requests by outcome",
            "Judge requests per second by backend and outcome (ok, error, timeout, rate_limited, cached).",
            "ops",
            _query(
                "sum by (backend, outcome) (rate(stepwatch_judge_requests_total[$__rate_interval]))",
                "{{backend}}: {{outcome}}",
            ),
        )
    )
    board = board.with_panel(
        _timeseries(
            "Kafka spool",
            "Bytes of score events spooled locally while Kafka is unreachable, against the spool limit.",
            "bytes",
            _query("sum by (instance) (stepwatch_kafka_spool_bytes)", "{{instance}} spooled"),
            _query("sum by (instance) (stepwatch_kafka_spool_bytes_limit)", "{{instance}} limit", "B"),
        )
    )
    board = board.with_panel(
        _timeseries(
            "Kafka score events",
            "Score events sent to, failed on and spooled for topic stepwatch.scores, per second.",
            "ops",
            _query("sum(rate(stepwatch_kafka_events_sent_total[$__rate_interval]))", "sent"),
            _query("sum(rate(stepwatch_kafka_events_failed_total[$__rate_interval]))", "failed", "B"),
            _query("sum(rate(stepwatch_kafka_events_spooled_total[$__rate_interval]))", "spooled", "C"),
            _query(
                "sum by (exporter) (rate(stepwatch_exporter_queue_dropped_total[$__rate_interval]))",
                "dropped: {{exporter}}",
                "D",
            ),
        )
    )
    return board


def build() -> dict[str, Any]:
    """Return the dashboard as the JSON object Grafana's provisioning loads."""
    board = (
        dashboard.Dashboard("Stepwatch")
        .uid(UID)
        .description(
            "Agent trajectory scores, per agent version, the steps and rules that fail, ingest, buffering, "
            "judges and score streams of Stepwatch."
        )
        .tags(["stepwatch", "agents", "opentelemetry"])
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
    )
    for variable in _variables():
        board = board.with_variable(variable)
    board = _stream_rows(_ingest_rows(_statistics_rows(_step_rows(_version_rows(_score_rows(board))))))
    encoded: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return encoded


def render() -> str:
    """The exact text of deploy/grafana/dashboards/stepwatch.json."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed JSON differs")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run deploy/grafana/generate.py", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
