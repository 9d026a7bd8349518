#!/usr/bin/env python3
"""How far reading "only what scoring needs" can go in Python: floors next to the loadgen's `walk`.

In one process, on the loadgen's traffic (CPU time per span, median of --rounds):
  parse        - upb parses each ExportTraceServiceRequest (the loadgen's `count` floor, less gRPC);
  walk         - parse, then every span's ids, name, times, status and attributes into Python values
                 (the loadgen's sink_server `walk_spans`, the floor the issue compares with);
  select       - the least Stepwatch's close path reads, with its own production pieces: each span's
                 bytes framed (receiver/codec/framing.py) and parsed in one upb call as LeanSpans
                 (receiver/codec/otlp_selective.py), then ids, name, kind, times, status and only the
                 scoring attributes (`scoring_attributes`, no step I/O) into Python values: no
                 canonical Span, no steps, no scores;
  select_ids   - the same without any attribute: ids, name, kind, times and status only;
  native_read  - the native span core's close-time reader (receiver/codec/spancore.py, native/) on the
                 same records, one call per request: the same fields and only the scoring
                 attributes as Python values (one dict per span, no canonical Span);
  native_spans - the same, building the canonical Spans the scorers get (what `serve` runs);
  index_native / index_python - ingest's index of each request (split_request's records and
                 rejections) by the native core, and by the pure-Python loop over the parsed request
                 (the parse itself is `parse`);
  check_native - the request check the receivers run instead of the upb parse (every field against
                 the schema), and check_index_native the check plus the index, in one call per
                 request (OtlpRequest.from_bytes): what `parse` + `index_native` cost before.
`select` / `walk` is what any design that reads spans through upb in Python starts from, before it
buffers, partitions, finds steps, scores or exports anything (bench_pipeline.py measures those).

Usage: taskset -c 1 python bench/bench_floors.py [--traces 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_pipeline import DEFAULT_LOADGEN, make_traffic
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from stepwatch.config import load_config
from stepwatch.evaluator.pipeline import scoring_attributes
from stepwatch.receiver.codec import spancore
from stepwatch.receiver.codec.framing import span_extents, varint_bytes
from stepwatch.receiver.codec.otlp_proto import new_span
from stepwatch.receiver.codec.otlp_selective import LeanSpans, _whole, any_value_bytes, selected
from stepwatch.receiver.ingest import split_request


def lean_spans(requests: list[bytes]) -> list[object]:
    """Every request's spans as one LeanSpans parse each, framed from the bytes as the buffer holds them."""
    out = []
    for data in requests:
        extents = span_extents(data)
        assert extents is not None
        parts = []
        for start, end in extents:
            parts += (b"\x12", varint_bytes(end - start), data[start:end])
        out.append(LeanSpans.FromString(b"".join(parts)).spans)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loadgen", default=str(DEFAULT_LOADGEN))
    parser.add_argument("--traces", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, args.loadgen)
    from sink_server import walk_spans  # the loadgen's own walk, as its `walk` mode runs it

    with tempfile.TemporaryDirectory(prefix="stepwatch-floors-") as tmp:
        requests, _ = make_traffic(Path(args.loadgen), args.traces, args.seed, Path(tmp))
    parse = ExportTraceServiceRequest.FromString
    spans = sum(walk_spans(parse(r)) for r in requests)
    keys = load_config(None, environ={}).partitioning.task_key_attributes
    selection = scoring_attributes(keys, step_io=False)

    def read(with_attributes: bool) -> None:
        pick, wanted, prefixes = selected, selection.keys, selection.prefixes
        rows = []
        for lean in lean_spans(requests):
            for span in lean:
                status = span.status
                rows.append(
                    (
                        span.trace_id,
                        span.span_id,
                        span.parent_span_id,
                        span.name,
                        span.kind,
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        status.code,
                        status.message,
                        pick(span.attributes, wanted, prefixes) if with_attributes else None,
                    )
                )
        assert len(rows) == spans

    floors: dict[str, Callable[[], object]] = {
        "parse": lambda: [parse(r) for r in requests],
        "walk": lambda: [walk_spans(parse(r)) for r in requests],
        "select": lambda: read(True),
        "select_ids": lambda: read(False),
    }
    if spancore.AVAILABLE:
        parsed = [parse(r) for r in requests]
        records = [split_request(p, r)[0] for p, r in zip(parsed, requests, strict=True)]
        origins: dict[object, tuple[dict[str, object], str]] = {}

        def origin_of(origin: object) -> tuple[dict[str, object], str]:
            return origins.setdefault(origin, ({}, ""))

        def native(make: Callable[[dict[str, object]], object]) -> None:
            n = 0
            for batch in records:
                out = spancore.read_spans(
                    batch, selection, set(), 1 << 30, None, origin_of, any_value_bytes, _whole, make
                )
                assert out is not None
                n += len(out)
            assert n == spans

        def index_python() -> None:
            core, spancore._core = spancore._core, None
            try:
                for p, r in zip(parsed, requests, strict=True):
                    split_request(p, r)
            finally:
                spancore._core = core

        floors["native_read"] = lambda: native(dict)
        floors["native_spans"] = lambda: native(new_span)
        floors["index_native"] = lambda: [spancore.index_request(r) for r in requests]
        floors["index_python"] = index_python
        schema = spancore._request_schema()
        floors["check_native"] = lambda: [schema.accepts(r) for r in requests]
        floors["check_index_native"] = lambda: [spancore.index_valid_request(r) for r in requests]
    us: dict[str, list[float]] = {name: [] for name in floors}
    for _ in range(args.rounds):
        for name, fn in floors.items():
            started = time.process_time()
            fn()
            us[name].append((time.process_time() - started) / spans * 1e6)
    median = {name: round(statistics.median(values), 2) for name, values in us.items()}
    print(
        json.dumps(
            {
                "bench": "floors_in_process",
                "spans": spans,
                "us_per_span": median,
                "select_over_walk": round(median["select"] / median["walk"], 2),
                "select_ids_over_walk": round(median["select_ids"] / median["walk"], 2),
                **(
                    {
                        "native_read_over_walk": round(median["native_read"] / median["walk"], 3),
                        "native_spans_over_walk": round(median["native_spans"] / median["walk"], 3),
                        "native_read_over_select": round(median["native_read"] / median["select"], 3),
                    }
                    if spancore.AVAILABLE
                    else {"native": spancore.STATUS}
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
