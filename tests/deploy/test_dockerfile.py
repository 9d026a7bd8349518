"""deploy/Dockerfile and .dockerignore. No Docker engine here: the image is not built; instead the
builder stage's wheel build is reproduced from exactly the files the build context lets through,
and the runtime stage's promises (non-root, healthcheck, ports, volume) are checked in the file."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from deploy_support import DEPLOY, REPO, run
from shared_paths import CORPUS

DOCKERFILE = DEPLOY / "Dockerfile"
PACKAGE_DIRS = {
    "app": "stepwatch",
    "receiver": "stepwatch/receiver",
    "evaluator": "stepwatch/evaluator",
    "exporters": "stepwatch/exporters",
}


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    lines, current = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        if raw.lstrip().startswith("#") and not current:
            continue
        current += raw.rstrip("\\").strip() + " " if raw.endswith("\\") else raw.strip()
        if not raw.endswith("\\"):
            if current:
                keyword, _, rest = current.partition(" ")
                lines.append((keyword.upper(), rest.strip()))
            current = ""
    return lines


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in _instructions():
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, rest))
    return stages


def _in_context(path: str) -> bool:
    """Whether .dockerignore lets `path` (relative to the repository root) into the build context."""
    included = True
    for pattern in (REPO / ".dockerignore").read_text().splitlines():
        pattern = pattern.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = Path(path).parts
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if pattern == "**" or any(
            fnmatch.fnmatch(c, pattern)
            or fnmatch.fnmatch(c, pattern.removeprefix("**/"))
            or fnmatch.fnmatch(Path(c).name, pattern.removeprefix("**/"))
            for c in candidates
        ):
            included = negate
    return included


def test_dockerfile_is_multi_stage_on_python_311_slim() -> None:
    stages = _stages()
    assert len(stages) == 2
    assert stages[0][0][1].endswith("AS builder")
    arg = dict(i.split("=", 1) for k, i in _instructions() if k == "ARG" and "=" in i)
    assert arg["PYTHON_IMAGE"].startswith("python:3.11-slim")
    runtime = stages[1]
    assert runtime[0] == ("FROM", "${PYTHON_IMAGE}")
    copies = [rest for k, rest in runtime if k == "COPY"]
    assert "--from=builder /opt/stepwatch /opt/stepwatch" in copies
    # The runtime stage does not install build tools or compile anything.
    assert not any("pip wheel" in rest or "apt-get" in rest for k, rest in runtime if k == "RUN")


def test_runtime_runs_as_non_root_with_healthcheck_ports_and_data_volume() -> None:
    runtime = dict(_stages()[1])
    user = runtime["USER"].split(":")
    assert user[0].isdigit() and int(user[0]) != 0 and int(user[1]) != 0
    assert set(runtime["EXPOSE"].split()) == {"4317", "4318", "9464"}
    assert json.loads(runtime["VOLUME"]) == ["/var/lib/stepwatch"]
    assert runtime["WORKDIR"] == "/var/lib/stepwatch"
    assert json.loads(runtime["ENTRYPOINT"]) == ["stepwatch"]
    assert json.loads(runtime["CMD"]) == ["serve"]
    assert "STEPWATCH_CONFIG=/etc/stepwatch/config.yaml" in runtime["ENV"]
    healthcheck = runtime["HEALTHCHECK"]
    command = json.loads(healthcheck[healthcheck.index("CMD") + 3 :].strip())
    # the CLI reads the config the container runs with, instead of a hard-coded 127.0.0.1:9464
    assert command == ["stepwatch", "healthcheck"]
    assert "9464" not in healthcheck


def test_every_copied_file_exists_and_is_in_the_build_context() -> None:
    for stage in _stages():
        for keyword, rest in stage:
            if keyword != "COPY" or rest.startswith("--from"):
                continue
            *sources, _dest = rest.split()
            for source in sources:
                assert (REPO / source).exists(), source
                assert _in_context(source.rstrip("/")), f".dockerignore excludes {source}"
    for excluded in (".venv", ".git", "tests/deploy/test_dockerfile.py", "bench", "app/__pycache__"):
        assert not _in_context(excluded), excluded


def test_builder_stage_wheel_holds_every_module_and_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reproduce `pip wheel --no-deps .` on the files the context admits, as the builder stage does
    (CI's wheel build: the native span core included), install it as a regular (non-editable)
    package and run it from the repository root, where a source folder named like the package
    would shadow it."""
    # cargo's incremental cache, as `make` sets it, so this is not a from-scratch Rust build
    monkeypatch.setenv(
        "CARGO_TARGET_DIR", os.environ.get("CARGO_TARGET_DIR", str(REPO / ".cache" / "cargo-target"))
    )
    context = tmp_path / "context"
    for top in ("pyproject.toml", "README.md", *PACKAGE_DIRS, "native"):
        source = REPO / top
        if source.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "target")
            shutil.copytree(source, context / top, ignore=ignore)
        else:
            context.mkdir(exist_ok=True)
            shutil.copy(source, context / top)
    result = run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--wheel-dir",
            str(tmp_path / "wheels"),
            str(context),
        ],
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # a data folder missing from `packages` is still shipped, with a 40-line warning on every install
    assert "would be ignored" not in result.stdout + result.stderr, result.stdout + result.stderr
    (wheel,) = (tmp_path / "wheels").glob("stepwatch-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert "stepwatch = stepwatch.cli:main" in entry_points
    native = [n for n in names if n.startswith("stepwatch/receiver/codec/_spancore") and n.endswith(".so")]
    assert native, "the wheel lacks the native span core (native/, built by setuptools-rust)"
    for folder, installed_as in PACKAGE_DIRS.items():
        for source in (REPO / folder).rglob("*"):
            if "__pycache__" in source.parts or source.is_dir() or source.suffix in (".so", ".pyc"):
                continue
            # modules and data (judge prompts, ...): what a git checkout holds, not build output
            target = f"{installed_as}/{source.relative_to(REPO / folder).as_posix()}"
            assert target in names, f"the image would lack {target}: add its package to pyproject.toml"
    _smoke_test_installed(wheel, tmp_path / "site")


def _smoke_test_installed(wheel: Path, site: Path) -> None:
    """The wheel installed into its own folder, imported and run from the repository root with
    only that folder and the dependencies on the path (no editable finder, no source tree)."""
    installed = run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel)])
    assert installed.returncode == 0, installed.stdout + installed.stderr
    trace = CORPUS / "pai_trip_parallel_tools.pb"
    script = (
        "import sys, stepwatch, stepwatch.receiver.codec.spancore as core, stepwatch.service\n"
        "from stepwatch.cli import main\n"
        "print(stepwatch.__file__, core.AVAILABLE, flush=True)\n"
        "sys.exit(main(['score', sys.argv[1], '--expected-steps', '[\"get_weather\"]', '--format', 'json']))\n"
    )
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join([str(site), sysconfig.get_paths()["purelib"]]),
    }
    result = subprocess.run(
        [sys.executable, "-S", "-c", script, str(trace)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    first, *records = result.stdout.splitlines()
    where, available = first.split()
    assert where.startswith(str(site)) and available == "True", result.stdout
    assert [json.loads(r)["task_key"] for r in records] == ["trip_planner"], result.stdout
