"""deploy/Dockerfile and .dockerignore. No Docker engine here: the image is not built; instead the
builder stage's wheel build is reproduced from exactly the files the build context lets through,
and the runtime stage's promises (non-root, healthcheck, ports, volume) are checked in the file."""

from __future__ import annotations

import fnmatch
import json
import shutil
import sys
import zipfile
from pathlib import Path

from deploy_support import DEPLOY, REPO, run

DOCKERFILE = DEPLOY / "Dockerfile"
PACKAGE_DIRS = {
    "stepwatch": "stepwatch",
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
    for excluded in (".venv", ".git", "tests/deploy/test_dockerfile.py", "bench", "stepwatch/__pycache__"):
        assert not _in_context(excluded), excluded


def test_builder_stage_wheel_holds_every_module_and_the_cli(tmp_path: Path) -> None:
    """Reproduce `pip wheel --no-deps .` on the files the context admits, as the builder stage does."""
    context = tmp_path / "context"
    for top in ("pyproject.toml", "README.md", *PACKAGE_DIRS):
        source = REPO / top
        if source.is_dir():
            shutil.copytree(source, context / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
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
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "wheels").glob("stepwatch-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert "stepwatch = stepwatch.cli:main" in entry_points
    for folder, installed_as in PACKAGE_DIRS.items():
        for module in (REPO / folder).rglob("*.py"):
            if "__pycache__" in module.parts:
                continue
            target = f"{installed_as}/{module.relative_to(REPO / folder).as_posix()}"
            assert target in names, f"the image would lack {target}: add its package to pyproject.toml"
