//! The ingest index: what `split_request` reads from an ExportTraceServiceRequest, in one pass
//! over its bytes: every span's extent, ids, parent, name and end time, and each span's origin
//! (its resource and scope, as bytes). Only the framing and those span fields are read.

use crate::validate::{Schema, MAX_DEPTH};
use crate::wire::{Fields, Value, WireError};

/// Concatenated occurrences of a singular message field: the wire form of their merge.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pieces(pub Vec<(usize, usize)>);

/// One ScopeSpans: its resource (index into `SpanIndex::resources`) and scope bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub resource: usize,
    pub scope: Pieces,
}

/// The fields ingest reads of one span; slices are absolute offsets into the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanEntry {
    pub origin: usize,
    pub extent: (usize, usize),
    pub trace_id: (usize, usize),
    pub span_id: (usize, usize),
    pub parent: (usize, usize),
    pub name: (usize, usize),
    pub end_time: u64,
}

#[derive(Debug, Default)]
pub struct SpanIndex {
    pub resources: Vec<Pieces>,
    pub origins: Vec<Origin>,
    pub spans: Vec<SpanEntry>,
}

const EMPTY: (usize, usize) = (0, 0);

/// Index every span of the request, in document order (resource_spans, scope_spans, spans).
pub fn index(data: &[u8]) -> Result<SpanIndex, WireError> {
    Walk { schema: None }.request(data)
}

/// `index`, in the same pass checking every field the way upb parses the request (`schema`,
/// validate.rs): Err unless upb is known to accept the bytes, as `schema.check(data)` would say.
pub fn index_checked(data: &[u8], schema: &Schema) -> Result<SpanIndex, WireError> {
    Walk { schema: Some(schema) }.request(data)
}

/// The index's walk, with the request check folded in when there is a schema: each level checks
/// its own fields and checks whole the nested messages the index does not walk into.
struct Walk<'s> {
    schema: Option<&'s Schema>,
}

/// Message indices in the schema of the levels the index walks (0 is the request).
#[derive(Clone, Copy)]
struct Level {
    message: usize,
    depth: usize,
}

impl Walk<'_> {
    fn next(&self, scan: &mut Fields<'_>) -> Result<Option<(u32, Value)>, WireError> {
        if self.schema.is_some() {
            scan.next_field_strict()
        } else {
            scan.next_field()
        }
    }

    /// Checks one field (with a schema); `walked` is the field the index walks into itself.
    fn check(
        &self,
        fields: &Fields<'_>,
        at: Level,
        number: u32,
        value: Value,
        walked: u32,
    ) -> Result<(), WireError> {
        match self.schema {
            Some(schema) => schema.check_field(fields, at.message, number, value, at.depth, number != walked),
            None => Ok(()),
        }
    }

    /// The level below `at` through field `number` (its message type in the schema).
    fn below(&self, at: Level, number: u32) -> Result<Level, WireError> {
        let message = match self.schema {
            Some(schema) => schema
                .nested_message(at.message, number)
                .ok_or(WireError::Unsupported)?,
            None => 0,
        };
        if at.depth + 1 > MAX_DEPTH {
            return Err(WireError::Unsupported);
        }
        Ok(Level {
            message,
            depth: at.depth + 1,
        })
    }

    fn request(&self, data: &[u8]) -> Result<SpanIndex, WireError> {
        let mut out = SpanIndex::default();
        let top = Level { message: 0, depth: 0 };
        let fields = Fields::new(data);
        let mut request = fields.nested_all();
        while let Some((number, value)) = self.next(&mut request)? {
            self.check(&fields, top, number, value, 1)?;
            if let (1, Value::Len(start, end)) = (number, value) {
                self.resource_spans(&fields.nested(start, end), self.below(top, 1)?, &mut out)?;
            }
        }
        Ok(out)
    }

    fn resource_spans(&self, fields: &Fields<'_>, at: Level, out: &mut SpanIndex) -> Result<(), WireError> {
        // the resource may follow its scope_spans on the wire: collect both, then index the spans
        let mut scan = fields.nested_all();
        let mut resource = Pieces::default();
        let mut scopes: Vec<(usize, usize)> = Vec::new();
        while let Some((number, value)) = self.next(&mut scan)? {
            self.check(fields, at, number, value, 2)?;
            match (number, value) {
                (1, Value::Len(start, end)) => resource.0.push((start, end)),
                (2, Value::Len(start, end)) => scopes.push((start, end)),
                _ => {}
            }
        }
        let resource_index = out.resources.len();
        out.resources.push(resource);
        let below = if scopes.is_empty() { at } else { self.below(at, 2)? };
        for (start, end) in scopes {
            self.scope_spans(&fields.nested(start, end), below, resource_index, out)?;
        }
        Ok(())
    }

    fn scope_spans(
        &self,
        fields: &Fields<'_>,
        at: Level,
        resource: usize,
        out: &mut SpanIndex,
    ) -> Result<(), WireError> {
        let mut scan = fields.nested_all();
        let mut scope = Pieces::default();
        let origin = out.origins.len();
        let first_span = out.spans.len();
        let mut span_level: Option<Level> = None;
        while let Some((number, value)) = self.next(&mut scan)? {
            self.check(fields, at, number, value, 2)?;
            match (number, value) {
                (1, Value::Len(start, end)) => scope.0.push((start, end)),
                (2, Value::Len(start, end)) => {
                    let level = match span_level {
                        Some(level) => level,
                        None => *span_level.insert(self.below(at, 2)?),
                    };
                    out.spans
                        .push(self.span(&fields.nested(start, end), level, origin, (start, end))?)
                }
                _ => {}
            }
        }
        debug_assert!(out.spans[first_span..].iter().all(|s| s.origin == origin));
        out.origins.push(Origin { resource, scope });
        Ok(())
    }

    fn span(
        &self,
        fields: &Fields<'_>,
        at: Level,
        origin: usize,
        extent: (usize, usize),
    ) -> Result<SpanEntry, WireError> {
        let mut entry = SpanEntry {
            origin,
            extent,
            trace_id: EMPTY,
            span_id: EMPTY,
            parent: EMPTY,
            name: EMPTY,
            end_time: 0,
        };
        let mut scan = fields.nested_all();
        // a repeated singular field keeps its last value; a field of the wrong wire type is unknown
        while let Some((number, value)) = self.next(&mut scan)? {
            self.check(fields, at, number, value, 0)?;
            match (number, value) {
                (1, Value::Len(s, e)) => entry.trace_id = (s, e),
                (2, Value::Len(s, e)) => entry.span_id = (s, e),
                (4, Value::Len(s, e)) => entry.parent = (s, e),
                (5, Value::Len(s, e)) => entry.name = (s, e),
                (8, Value::Fixed64(v)) => entry.end_time = v,
                _ => {}
            }
        }
        Ok(entry)
    }
}

const ZERO: [u8; 16] = [0; 16];

/// The checks of `span_rejection`: 16-byte non-zero trace id, 8-byte non-zero span id, parent
/// empty or 8 bytes, a name.
pub fn is_valid(data: &[u8], span: &SpanEntry) -> bool {
    let trace = &data[span.trace_id.0..span.trace_id.1];
    let id = &data[span.span_id.0..span.span_id.1];
    let parent_len = span.parent.1 - span.parent.0;
    trace.len() == 16
        && id.len() == 8
        && (parent_len == 0 || parent_len == 8)
        && trace != ZERO
        && id != &ZERO[..8]
        && span.name.1 > span.name.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn len(field: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![(field << 3) | 2, body.len() as u8];
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn indexes_spans_with_their_origin() {
        let mut span = len(1, &[7; 16]);
        span.extend(len(2, &[9; 8]));
        span.extend(len(5, b"root"));
        span.extend([0x41, 5, 0, 0, 0, 0, 0, 0, 0]); // end_time_unix_nano = 5
        let mut scope = len(1, &len(1, b"lib")); // scope after? here before its spans
        scope.extend(len(2, &span));
        let mut rs = len(2, &scope);
        rs.extend(len(1, &len(1, b"res"))); // resource after its scope_spans
        let request = len(1, &rs);
        let idx = index(&request).unwrap();
        assert_eq!(idx.spans.len(), 1);
        let entry = &idx.spans[0];
        assert_eq!(entry.end_time, 5);
        assert!(is_valid(&request, entry));
        assert_eq!(&request[entry.extent.0..entry.extent.1], &span[..]);
        let resource = &idx.resources[idx.origins[entry.origin].resource].0;
        assert_eq!(resource.len(), 1);
        assert_eq!(&request[resource[0].0..resource[0].1], &len(1, b"res")[..]);
    }

    #[test]
    fn truncated_requests_are_errors() {
        let mut span = len(1, &[7; 16]);
        span.extend(len(5, b"x"));
        let request = len(1, &len(2, &len(2, &span)));
        for cut in 1..request.len() {
            let _ = index(&request[..cut]); // must not panic
        }
        assert!(index(&request[..request.len() - 1]).is_err());
    }
}
