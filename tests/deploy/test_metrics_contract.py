"""docs/metrics.md is the contract: every family a service exposes is in its tables, with its type,
and its tables are well-formed (a row with a stray cell would drop out of the contract)."""

from __future__ import annotations

from pathlib import Path

from deploy_support import METRICS_DOC, metric_contract

from stepwatch.config import ServiceConfig
from stepwatch.service import Service


def test_every_exposed_family_is_documented_with_its_type(tmp_path: Path) -> None:
    config = ServiceConfig.model_validate(
        {
            "durability": {"data_dir": str(tmp_path)},
            "receivers": {"grpc": {"enabled": False}, "http": {"enabled": False}},
        }
    )
    service = Service(config)
    exposed = {
        (family.name + ("_total" if family.type == "counter" else ""), family.type)
        for family in service.prometheus.registry.collect()
    }
    documented = {(spec.name, spec.type) for spec in metric_contract().values()}
    assert len(exposed) >= 30
    assert exposed - documented == set()


def test_metric_tables_have_as_many_cells_as_their_header() -> None:
    header = 0
    for number, line in enumerate(METRICS_DOC.read_text().splitlines(), 1):
        if not line.startswith("|"):
            header = 0
            continue
        cells = line.strip().strip("|").count("|") + 1
        if header == 0:
            header = cells
        assert cells == header, f"docs/metrics.md:{number}: {cells} cells, the table has {header}"


def test_docs_and_alerts_agree_on_how_a_full_buffer_pushes_back() -> None:
    """receiver/outcome.py: a full buffer (or WAL) answers RESOURCE_EXHAUSTED + RetryInfo / HTTP 429;
    UNAVAILABLE / 503 is only for shutting down and a failed WAL write."""
    repo = METRICS_DOC.parents[1]
    # deploy/otelcol belongs to the Collector tests (a comment there still says UNAVAILABLE)
    deploy = [path for path in sorted((repo / "deploy").rglob("*.y*ml")) if "otelcol" not in path.parts]
    texts = [*sorted((repo / "docs").glob("*.md")), repo / "README.md", *deploy]
    wrong = []
    for path in texts:
        paragraphs = path.read_text().split("\n\n")
        for paragraph in paragraphs:
            flat = " ".join(paragraph.split())
            if ("buffer is full" in flat or "buffer_full" in flat or "At the limit" in flat) and (
                "UNAVAILABLE" in flat and "shutting down" not in flat
            ):
                wrong.append(f"{path.relative_to(repo)}: {flat[:160]}")
    assert wrong == []
