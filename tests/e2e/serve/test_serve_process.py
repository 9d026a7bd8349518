"""`stepwatch serve` as a real process: zero-config start-up, bad config exit 2, SIGTERM drain."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest
from serve_helpers import K8S_SERVICE_LINKS, STEPWATCH, scrape, serve_env, start_serve, total
from shared_paths import REPO

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
def test_sigterm_drains_every_buffered_partition_and_exits_0(tmp_path, agent, event_loop: str) -> None:
    expectations = REPO / "examples" / "expectations.yaml"
    env = serve_env(
        STEPWATCH_BUFFER__SESSION_IDLE_TIMEOUT="120",
        STEPWATCH_BUFFER__SWEEP_INTERVAL="0.02",
        STEPWATCH_EVENT_LOOP=event_loop,
    )
    serve = start_serve("--expectations", str(expectations), "--trace-idle-timeout", "120", env=env)
    try:
        agent.send("grpc", f"127.0.0.1:{serve.grpc}", agent.demo_runs())
        deadline = time.monotonic() + 10
        while total(scrape(serve.metrics), "stepwatch_buffered_spans") < 14 and time.monotonic() < deadline:
            time.sleep(0.05)
        samples = scrape(serve.metrics)
        assert total(samples, "stepwatch_buffered_spans") == 14  # 4 traces, nothing closed yet
        assert total(samples, "stepwatch_spans_scored_total") == 0
    finally:
        code, err = serve.stop(signal.SIGTERM)
    assert code == 0, err
    assert f"event loop: {event_loop}" in err
    assert f"listening on 127.0.0.1:{serve.grpc}" in err and f"127.0.0.1:{serve.http}/v1/traces" in err
    assert "drained: 14 span(s) received, 0 replayed, 14 scored, 0 rejected, 0 duplicate, 0 late" in err


def test_bad_config_exits_2_with_the_key_and_source(tmp_path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("buffer:\n  trace_idle_timeout: -1\n  max_spans_per_trce: 5\n")
    done = subprocess.run(
        [STEPWATCH, "serve", "--config", str(config)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert f"buffer.trace_idle_timeout (from {config})" in done.stderr
    assert "buffer.max_spans_per_trce" in done.stderr and "unknown key" in done.stderr
    env = {**os.environ, "STEPWATCH_RECEIVERS__GRPC__ENDPOINT": "nonsense"}
    done = subprocess.run([STEPWATCH, "check-config"], capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 2 and "from STEPWATCH_RECEIVERS__GRPC__ENDPOINT" in done.stderr
    env = {**os.environ, "STEPWATCH_EVENT_LOOP": "tokio"}
    done = subprocess.run([STEPWATCH, "serve"], capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 2
    assert "STEPWATCH_EVENT_LOOP='tokio': expected one of auto, uvloop, asyncio" in done.stderr


@pytest.mark.parametrize(
    ("flag", "listener"),
    [
        ("--grpc-endpoint", "OTLP/gRPC receiver"),
        ("--http-endpoint", "OTLP/HTTP receiver"),
        ("--metrics-endpoint", "metrics endpoint"),
    ],
)
def test_a_port_in_use_is_one_line_and_exit_2(flag: str, listener: str) -> None:
    """4317 taken (a collector already running) must read like 4318 and 9464: one line, exit 2."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        endpoints = {f: "127.0.0.1:0" for f in ("--grpc-endpoint", "--http-endpoint", "--metrics-endpoint")}
        endpoints[flag] = f"127.0.0.1:{port}"
        argv = [STEPWATCH, "serve", *(part for item in endpoints.items() for part in item)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=serve_env())
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "add_port" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert errors == [
        f"stepwatch serve: error: cannot start: {listener} cannot bind 127.0.0.1:{port}: address already in use"
    ]


def test_check_config_ignores_kubernetes_service_links_and_refuses_real_typos() -> None:
    """A pod in a namespace with the stepwatch-metrics and stepwatch-gateway Services gets their
    service-link variables; check-config (and serve) must take them, and still catch a typo."""
    env = {**serve_env(), **K8S_SERVICE_LINKS, "STEPWATCH_BUFFER__TRACE_IDLE_TIMEOUT": "1.5"}
    done = subprocess.run([STEPWATCH, "check-config"], capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 0, done.stderr
    assert "trace_idle_timeout: 1.5" in done.stdout and "10.96.0.12" not in done.stdout
    env["STEPWATCH_EXPORTERS__PROMETHEUS__MAX_TASK_KEYZ"] = "5"
    done = subprocess.run([STEPWATCH, "check-config"], capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr  # one problem, one line
    assert (
        "exporters.prometheus.max_task_keyz (from STEPWATCH_EXPORTERS__PROMETHEUS__MAX_TASK_KEYZ)"
        in done.stderr
    )
    assert "did you mean 'max_task_keys'?" in done.stderr


def test_invalid_expectations_file_refuses_to_start(tmp_path) -> None:
    bad = tmp_path / "exp.yaml"
    bad.write_text("tasks:\n  refund-order:\n    threshold: 2\n")
    done = subprocess.run(
        [STEPWATCH, "serve", "--expectations", str(bad), "--grpc-endpoint", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "task 'refund-order': threshold" in done.stderr


def test_healthcheck_probes_the_configured_metrics_endpoint() -> None:
    """The image's HEALTHCHECK (`stepwatch healthcheck`) follows the config, not 127.0.0.1:9464."""
    from serve_helpers import free_port

    from stepwatch.commands.healthcheck import probe_url

    assert probe_url("0.0.0.0:9464", tls=False) == "http://127.0.0.1:9464/healthz"
    assert probe_url("[::]:9464", tls=True) == "https://[::1]:9464/healthz"
    metrics = free_port()
    env = serve_env(STEPWATCH_EXPORTERS__PROMETHEUS__ENDPOINT=f"0.0.0.0:{metrics}")
    serve = start_serve(env=env, ports=(free_port(), free_port(), metrics))
    try:
        done = subprocess.run([STEPWATCH, "healthcheck"], capture_output=True, text=True, timeout=30, env=env)
        assert done.returncode == 0, done.stderr
    finally:
        serve.stop()
    done = subprocess.run([STEPWATCH, "healthcheck"], capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 1 and f"unhealthy: http://127.0.0.1:{metrics}/healthz" in done.stderr
