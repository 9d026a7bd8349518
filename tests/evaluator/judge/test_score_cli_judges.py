"""`stepwatch score --scorer trajectory_steps --scorer plan_adherence --judge ...` on datasets with
inline request fields, and against a fake OpenAI-compatible server."""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from fake_openai import completion_for, form_lines

from stepwatch.cli import main

TOKYO_PLAN = "For Tokyo: research the destination, check flight options, look up the weather, then suggest a few activities."


def write_dataset(tmp_path: Path, tokyo_trace: list) -> Path:
    (tmp_path / "tokyo.json").write_text(json.dumps(tokyo_trace))
    rows = [
        {
            "id": "refund",
            "input": "Refund order 4471 and notify the customer.",
            "trajectory": ["look up order 4471", "issue refund of $89.00"],
            "expected_trajectory": ["look up order", "issue refund", "notify customer"],
        },
        {"id": "tokyo-inline", "trace": tokyo_trace, "expected_plan": TOKYO_PLAN},
        {
            "id": "tokyo-file",
            "trace": "tokyo.json",
            "expected_plan": "research the destination, then check flights",
        },
    ]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def records(text: str) -> dict[str, dict]:
    out = {}
    for line in text.splitlines():
        record = json.loads(line)
        out[record["id"]] = {r["metric"]: r for r in record["results"]}
    return out


def test_dataset_with_inline_fields_and_the_local_judge(tmp_path, tokyo_trace, capsys):
    data = write_dataset(tmp_path, tokyo_trace)
    code = main(
        [
            "score",
            "--dataset",
            str(data),
            "--scorer",
            "trajectory_steps",
            "--scorer",
            "plan_adherence",
            "--judge",
            "local",
            "--format",
            "json",
        ]
    )
    got = records(capsys.readouterr().out)
    assert got["refund"]["trajectory_steps"]["label"] == "64% yes"  # 0.648, shown truncated
    assert got["refund"]["plan_adherence"]["error"] == "the trace is not a non-empty list of spans"
    assert code == 1  # that requested-but-impossible plan_adherence is an error row
    assert got["tokyo-inline"]["plan_adherence"]["score"] == 25
    assert got["tokyo-file"]["plan_adherence"]["score"] == 50


def test_a_rows_own_judge_field_asks_for_its_scorer_and_only_that_one(tmp_path, tokyo_trace, capsys):
    """Without --scorer: the refund row's expected_trajectory names trajectory_steps, the Tokyo
    rows' expected_plan names plan_adherence; neither row gets the other judge scorer."""
    data = write_dataset(tmp_path, tokyo_trace)
    code = main(["score", "--dataset", str(data), "--format", "json"])
    got = records(capsys.readouterr().out)
    assert code == 0
    assert "trajectory_steps" in got["refund"] and "plan_adherence" not in got["refund"]
    assert got["tokyo-inline"]["plan_adherence"]["score"] == 25
    assert "trajectory_steps" not in got["tokyo-inline"] and "trajectory_steps" not in got["tokyo-file"]


def test_unknown_scorer_is_a_usage_error(tmp_path, tokyo_trace, capsys):
    data = write_dataset(tmp_path, tokyo_trace)
    assert main(["score", "--dataset", str(data), "--scorer", "nope"]) == 2
    assert "unknown scorer 'nope'" in capsys.readouterr().err


@pytest.fixture
def fake_openai(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[dict]]]:
    """A threaded fake Chat Completions server (the CLI runs its own event loops); indirect
    parametrisation gives each answer a delay in seconds."""
    received: list[dict] = []
    delay = float(getattr(request, "param", 0.0))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append(body)
            time.sleep(delay)
            lines = form_lines(body)
            p_yes = [0.03 if line.startswith("E3") else 0.97 for line in lines]  # E3: notify customer
            answer = completion_for(lines, p_yes, usage=(50, 20))
            raw = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = HTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_openai_judge_from_the_cli(tmp_path, tokyo_trace, capsys, fake_openai, monkeypatch):
    url, received = fake_openai
    monkeypatch.setenv("JUDGE_KEY", "sk-cli")
    data = write_dataset(tmp_path, tokyo_trace)
    code = main(
        [
            "score",
            "--dataset",
            str(data),
            "--scorer",
            "trajectory_steps",
            "--judge",
            "openai",
            "--judge-base-url",
            url,
            "--judge-model",
            "m",
            "--judge-api-key-env",
            "JUDGE_KEY",
            "--format",
            "json",
        ]
    )
    got = records(capsys.readouterr().out)
    # the Tokyo rows cannot feed trajectory_steps (no expected trajectory): asked for by name, an error
    assert got["tokyo-inline"]["trajectory_steps"]["error"].startswith("no expected_trajectory")
    assert code == 1
    result = got["refund"]["trajectory_steps"]
    assert result["score"] == pytest.approx((0.97 + 0.97 + 0.03) / 3 * (0.7 + 0.3 * 1.0), abs=1e-3)
    assert len(received) == 1 and all(body["model"] == "m" for body in received)  # one per trajectory


def slow_rows(tmp_path: Path) -> Path:
    rows = [
        {
            "id": f"r{n}",
            "trajectory": [f"look up order {n}"],
            "expected_trajectory": ["look up order", "notify customer"],
        }
        for n in range(3)
    ]
    path = tmp_path / "slow.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def judge_args(url: str, data: Path, *extra: str) -> list[str]:
    base = ["score", "--dataset", str(data), "--judge", "openai", "--judge-base-url", url, "--format", "json"]
    return [*base, "--judge-model", "m", *extra]


@pytest.mark.parametrize("fake_openai", [0.4], indirect=True)
def test_offline_deadline_is_per_partition_not_the_run(tmp_path, capsys, fake_openai):
    """Three rows of 0.4 s each under a 1 s deadline: every row is scored (1.2 s in all), since
    offline judges one partition at a time and each one's deadline starts with its own request."""
    url, received = fake_openai
    code = main(judge_args(url, slow_rows(tmp_path), "--judge-deadline", "1"))
    got = records(capsys.readouterr().out)
    assert code == 0 and len(received) == 3
    assert all(got[f"r{n}"]["trajectory_steps"]["score"] is not None for n in range(3))


@pytest.mark.parametrize("fake_openai", [0.4], indirect=True)
def test_offline_rows_past_the_deadline_are_summarised_and_fail_the_run(tmp_path, capsys, fake_openai):
    url, _ = fake_openai
    code = main(judge_args(url, slow_rows(tmp_path), "--judge-deadline", "0.1"))
    captured = capsys.readouterr()
    got = records(captured.out)
    assert code == 1
    assert got["r0"]["trajectory_steps"]["not_scored"] == "judge openai gave no answer within 0.1s"
    assert captured.err.splitlines() == [
        "stepwatch score: 3 of 3 row(s) not fully scored:",
        "  3 x trajectory_steps: judge openai gave no answer within 0.1s [r0, r1, r2]",
    ]


@pytest.mark.parametrize("fake_openai", [1.2], indirect=True)
def test_offline_waits_for_the_judge_by_default(tmp_path, capsys, fake_openai):
    """No --judge-deadline: a judge slower than any streaming deadline is still waited for."""
    from stepwatch.commands import score as score_command

    url, _ = fake_openai
    parser = argparse.ArgumentParser()
    score_command.add_arguments(parser)
    runner = score_command._judge_runtime(parser.parse_args(["x", "--judge", "openai"]))[1]
    assert runner.governor.deadline_s is None and runner.judge.config.timeout_s == 600
    data = slow_rows(tmp_path)
    data.write_text(data.read_text().splitlines()[0] + "\n")
    code = main(judge_args(url, data, "--judge-timeout", "5"))
    assert code == 0 and records(capsys.readouterr().out)["r0"]["trajectory_steps"]["score"] is not None
