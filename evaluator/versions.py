"""Which version of an agent produced a partition: the `version` dimension of the scores.

`partitioning.version_attributes` lists where to look, first present wins: each attribute is looked
up on the partition's root span, then on that span's resource attributes, before the next attribute
is tried. The root span is the first span in span order with no parent (spans are sorted by start
time, so a trace's root is usually its first span, and a session's is its first trace's root); a
partition whose root never arrived uses its first span. The special entry `@gen_ai.request.model`
(MODEL_RECIPE) stands for the model: the most frequent `gen_ai.request.model` among the partition's
spans, the only entry that reads more than the root span.

Resolved once per partition revision by the engine (PartitionScores.version); the exporters bound
the label values (exporters/task_keys.py VersionCap). No version found: None, shown as `unknown`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .model import Span

DEFAULT_VERSION_ATTRIBUTES: Final[tuple[str, ...]] = ("service.version",)
MODEL_ATTRIBUTE: Final = "gen_ai.request.model"
MODEL_RECIPE: Final = "@" + MODEL_ATTRIBUTE
"""A version_attributes entry meaning "the partition's most frequent request model"."""
RECIPES: Final = frozenset({MODEL_RECIPE})


def span_attributes_read(version_attributes: Sequence[str]) -> tuple[str, ...]:
    """The span attributes resolve_version may read: what a selective decoder must keep
    (pipeline.scoring_attributes); resource attributes are always decoded whole."""
    return tuple(MODEL_ATTRIBUTE if name == MODEL_RECIPE else name for name in version_attributes)


def resolve_version(spans: Sequence[Span], version_attributes: Sequence[str]) -> str | None:
    """The partition's version: the first of `version_attributes` present (non-empty) on its root
    span or, failing that, the root's resource; None when none is. `spans` in span order.

    Stops at the first parentless span, normally the first span: ~0.3 us a partition with the
    default single attribute (docs/metrics.md, "Versions")."""
    root = None
    for span in spans:
        if span.parent_span_id is None:
            root = span
            break
    if root is None:
        if not spans:
            return None
        root = spans[0]
    attributes = root.attributes
    resource = root.resource_attributes
    for name in version_attributes:
        if name == MODEL_RECIPE:
            value = most_frequent_model(spans)
        else:
            value = attributes.get(name)
            if value is None or value == "":
                value = resource.get(name)
        if value is not None and value != "":
            return str(value)
    return None


def most_frequent_model(spans: Sequence[Span]) -> str | None:
    """The `gen_ai.request.model` most spans of the partition carry (the LLM calls; the GenAI
    conventions put it on inference spans); a tie goes to the model seen first. None: no span has one."""
    counts: dict[str, int] = {}
    for span in spans:
        value = span.attributes.get(MODEL_ATTRIBUTE)
        if value is not None and value != "":
            key = str(value)
            counts[key] = counts.get(key, 0) + 1
    if not counts:
        return None
    return max(counts, key=counts.__getitem__)  # max keeps the first of equal counts
