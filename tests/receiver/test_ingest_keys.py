"""What an accepted request holds in a log (WAL segment or Kafka offset) until it is scored."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from receiver_rig import IngestRig, corpus_bytes

from stepwatch.evaluator.accounting import SpanAccounting
from stepwatch.evaluator.buffer import BufferLimits, PartitionBuffer
from stepwatch.evaluator.clock import ManualClock
from stepwatch.receiver.ingest import Ingestor


def test_keys_name_only_the_traces_whose_spans_were_taken() -> None:
    """A span rejected on its own is never scored, so its trace id must not hold a log position
    (a Kafka offset held by it would stop commits for good)."""
    request = ExportTraceServiceRequest.FromString(corpus_bytes())
    spans = request.resource_spans[0].scope_spans[0].spans
    real_trace = spans[1].trace_id
    spans[0].trace_id = b"\x07" * 16
    spans[0].name = ""  # invalid on its own: rejected, its (otherwise unseen) trace never buffered
    rig = IngestRig()
    result = rig.ingestor.consume(request, "kafka")
    assert result.rejected == 1
    assert result.keys == frozenset({real_trace})


def test_a_refused_request_holds_nothing() -> None:
    rig = IngestRig(max_buffered_spans=12)  # the corpus request has 8 spans: room for one, not two
    rig.ingestor.consume(ExportTraceServiceRequest.FromString(corpus_bytes()), "kafka")  # fills most
    other = ExportTraceServiceRequest.FromString(corpus_bytes())
    for rs in other.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                span.trace_id = b"\x09" * 16
    result = rig.ingestor.consume(other, "kafka")
    assert result.refusal == "buffer_full" and result.keys == frozenset()


def test_a_request_larger_than_the_whole_buffer_is_rejected_not_retried_forever() -> None:
    request = ExportTraceServiceRequest.FromString(corpus_bytes())
    total = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    rig = IngestRig(max_buffered_spans=total - 1)
    result = rig.ingestor.consume(request, "grpc")
    assert result.retry_after is None and result.refusal is None  # a retry could never succeed
    assert result.rejected == total and result.accepted == 0
    assert "more than the whole buffer" in result.error_message
    assert rig.accounting.rejected["limit"] == total and rig.buffer.buffered_spans == 0


def _late_span_keys(max_retained_spans: int) -> frozenset[bytes]:
    """Keys of a request holding one late span for a trace that was closed and scored."""
    clock, accounting = ManualClock(), SpanAccounting()
    buffer = PartitionBuffer(BufferLimits(max_retained_spans=max_retained_spans), accounting, clock.monotonic)
    ingestor = Ingestor(buffer, accounting, retry_after=1.0)
    request = ExportTraceServiceRequest.FromString(corpus_bytes())
    assert ingestor.consume(request, "grpc").keys
    clock.advance(60)
    for closed in buffer.sweep():  # scored as a trace partition
        buffer.route(closed)
        buffer.done(closed)
    late = ExportTraceServiceRequest.FromString(corpus_bytes())
    spans = late.resource_spans[0].scope_spans[0].spans
    spans[0].span_id = b"\x5a" * 8  # a span of the same trace, never seen
    del spans[1:]
    result = ingestor.consume(late, "grpc")
    assert accounting.late == 1 and result.accepted == 1
    return result.keys


def test_a_late_span_holds_its_trace_only_while_a_revision_will_score_it() -> None:
    """A late span with no revision to come would pin its WAL segment / Kafka offset for good: no
    event would ever release it (segments then survived clean shutdowns and were re-scored)."""
    trace_id = (
        ExportTraceServiceRequest.FromString(corpus_bytes())
        .resource_spans[0]
        .scope_spans[0]
        .spans[0]
        .trace_id
    )
    assert _late_span_keys(max_retained_spans=100_000) == frozenset({trace_id})  # a revision follows
    assert _late_span_keys(max_retained_spans=0) == frozenset()  # not retained: nothing to wait for
