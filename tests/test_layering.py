"""The layering rule of docs (BRIEF, README): receiver -> evaluator <- exporters.

The evaluator imports neither receiver nor exporters; receiver and exporters do not import each
other. Read from the source (every import statement, including those inside functions), so a
violation fails here before it becomes a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"receiver": "receiver", "evaluator": "evaluator", "exporters": "exporters"}
FORBIDDEN = {
    "evaluator": {"receiver", "exporters"},
    "receiver": {"exporters"},
    "exporters": {"receiver"},
}


def _imports(path: Path, package: str, root: Path = REPO) -> set[str]:
    """The stepwatch sub-packages a module under root/package imports (absolute or relative)."""
    found: set[str] = set()
    own = ["stepwatch", package, *path.relative_to(root / package).parts[:-1]]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's own package
                base = own[: len(own) - (node.level - 1)]
                names = [".".join([*base, node.module or ""]).rstrip(".")]
            elif node.module:
                names = [node.module]
        for name in names:
            parts = name.split(".")
            if len(parts) >= 2 and parts[0] == "stepwatch":
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_point_one_way(package: str) -> None:
    modules = sorted((REPO / PACKAGES[package]).rglob("*.py"))
    assert modules, f"no modules under {package}/"
    violations = {
        str(path.relative_to(REPO)): sorted(_imports(path, PACKAGES[package]) & FORBIDDEN[package])
        for path in modules
    }
    assert not {k: v for k, v in violations.items() if v}, violations


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    """The rule can fail: an evaluator module importing an exporter is caught."""
    module = tmp_path / "evaluator" / "scorers" / "probe.py"
    module.parent.mkdir(parents=True)
    module.write_text("from stepwatch.exporters.base import PartitionScores\nfrom ...receiver import wal\n")
    assert _imports(module, "evaluator", tmp_path) == {"exporters", "receiver"}
    module.write_text("from ..model import Span\nfrom . import base\n")
    assert _imports(module, "evaluator", tmp_path) == {"evaluator"}


LEAVES = ("kafka_client", "listen_errors", "security", "segment_log")
"""Parts of the root package (app/) that receiver/ and exporters/ may import: they import neither
of them (the evaluator they may), so no cycle runs through the root."""


@pytest.mark.parametrize("leaf", LEAVES)
def test_shared_root_modules_are_leaves(leaf: str) -> None:
    path = REPO / "app" / leaf
    modules = sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
    for module in modules:
        imported = _imports(module, "app") & {"receiver", "exporters"}
        assert not imported, f"{module.relative_to(REPO)} imports {sorted(imported)}"


def test_receiver_and_exporters_import_only_the_root_leaves() -> None:
    """Beyond the evaluator, only the leaves: never the service, the config or the commands."""
    root_modules = {path.stem for path in (REPO / "app").iterdir()} - {"__init__", "__pycache__"}
    for package in ("receiver", "exporters"):
        for path in (REPO / package).rglob("*.py"):
            used = _imports(path, package) & root_modules
            assert used <= set(LEAVES), (
                f"{path.relative_to(REPO)} imports stepwatch.{sorted(used - set(LEAVES))}"
            )
