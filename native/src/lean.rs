//! The close-time view of one encoded span: the fields the canonical Span holds, read the way
//! upb reads receiver/otlp_selective.py's LeanSpan (attributes as map<string, bytes>, a repeated
//! singular field keeps its last value, status occurrences merge, kind and status code are int32,
//! a field of the wrong wire type is unknown, declared strings must be UTF-8).

use std::ops::Range;

use crate::wire::{utf8, Fields, Value, WireError};

#[derive(Debug, Default, Clone, PartialEq)]
pub struct LeanSpan<'a> {
    pub trace_id: &'a [u8],
    pub span_id: &'a [u8],
    pub parent_span_id: &'a [u8],
    pub name: &'a str,
    pub kind: i32,
    pub start_time: u64,
    pub end_time: u64,
    pub status_code: i32,
    pub status_message: &'a str,
    /// Where its attribute entries are in the `entries` it was parsed into (`Parsed::attributes`).
    pub attributes: Range<usize>,
}

/// (key, encoded AnyValue) of one attribute entry.
pub type Entry<'a> = (&'a str, &'a [u8]);

/// A partition's spans, parsed; their attribute entries share one vector, so a partition costs a
/// few allocations rather than one or two a span (the per-span vector had been ~8% of the read).
#[derive(Debug, Default)]
pub struct Parsed<'a> {
    pub spans: Vec<LeanSpan<'a>>,
    entries: Vec<Entry<'a>>,
}

impl<'a> Parsed<'a> {
    pub fn with_capacity(spans: usize) -> Self {
        // loadgen and framework spans carry a dozen or two attributes
        Parsed {
            spans: Vec::with_capacity(spans),
            entries: Vec::with_capacity(spans * 16),
        }
    }

    /// Parses one more span; on an error nothing of it is kept.
    pub fn push(&mut self, data: &'a [u8]) -> Result<(), WireError> {
        let start = self.entries.len();
        match parse(data, &mut self.entries) {
            Ok(span) => {
                self.spans.push(span);
                Ok(())
            }
            Err(error) => {
                self.entries.truncate(start);
                Err(error)
            }
        }
    }

    /// Every attribute entry of `span` (one of `spans`), in wire order, repeats included.
    pub fn attributes(&self, span: &LeanSpan<'a>) -> &[Entry<'a>] {
        &self.entries[span.attributes.clone()]
    }
}

/// One span; its attribute entries are appended to `entries` (`attributes` says where).
pub fn parse<'a>(data: &'a [u8], entries: &mut Vec<Entry<'a>>) -> Result<LeanSpan<'a>, WireError> {
    let start = entries.len();
    let mut span = LeanSpan::default();
    let mut fields = Fields::new(data);
    while let Some((number, value)) = fields.next_field()? {
        match (number, value) {
            (1, Value::Len(s, e)) => span.trace_id = fields.bytes(s, e),
            (2, Value::Len(s, e)) => span.span_id = fields.bytes(s, e),
            (4, Value::Len(s, e)) => span.parent_span_id = fields.bytes(s, e),
            (5, Value::Len(s, e)) => span.name = utf8(fields.bytes(s, e))?,
            (6, Value::Varint(v)) => span.kind = v as i32, // int32 keeps the low 32 bits
            (7, Value::Fixed64(v)) => span.start_time = v,
            (8, Value::Fixed64(v)) => span.end_time = v,
            (9, Value::Len(s, e)) => entries.extend(entry(&fields.nested(s, e))?),
            (15, Value::Len(s, e)) => status(&fields.nested(s, e), &mut span)?,
            _ => {}
        }
    }
    span.attributes = start..entries.len();
    Ok(span)
}

/// A map entry; None when it holds any other field: upb then keeps the whole entry among the
/// span's unknown fields instead of in the map (found by tests/native/fuzz_native.py).
fn entry<'a>(fields: &Fields<'a>) -> Result<Option<(&'a str, &'a [u8])>, WireError> {
    let mut scan = fields.nested_all();
    let (mut key, mut value): (&str, &[u8]) = ("", b"");
    let mut known = true;
    while let Some((number, field)) = scan.next_field()? {
        match (number, field) {
            (1, Value::Len(s, e)) => key = utf8(fields.bytes(s, e))?,
            (2, Value::Len(s, e)) => value = fields.bytes(s, e),
            _ => known = false,
        }
    }
    Ok(known.then_some((key, value)))
}

fn status<'a>(fields: &Fields<'a>, span: &mut LeanSpan<'a>) -> Result<(), WireError> {
    let mut scan = fields.nested_all();
    while let Some((number, field)) = scan.next_field()? {
        match (number, field) {
            (2, Value::Len(s, e)) => span.status_message = utf8(fields.bytes(s, e))?,
            (3, Value::Varint(v)) => span.status_code = v as i32,
            _ => {}
        }
    }
    Ok(())
}

/// How many distinct keys (what the map's len() counts).
pub fn distinct_keys(attributes: &[(&str, &[u8])]) -> usize {
    let mut seen: std::collections::HashSet<&str> =
        std::collections::HashSet::with_capacity(attributes.len());
    attributes.iter().filter(|(key, _)| seen.insert(key)).count()
}

/// A scalar AnyValue written as one field, as `any_value_bytes` reads it without protobuf.
#[derive(Debug, Clone, PartialEq)]
pub enum Simple<'a> {
    None,
    Str(&'a str),
    Int(i64),
    Bool(bool),
    Double(f64),
}

fn varint_at(data: &[u8], mut i: usize) -> Option<(u64, usize)> {
    let mut value: u64 = 0;
    for n in 0..10 {
        let byte = *data.get(i)?;
        i += 1;
        if n == 9 && byte > 1 {
            return None; // over 64 bits: Python's arithmetic differs, let it decide
        }
        value |= u64::from(byte & 0x7F) << (7 * n);
        if byte < 0x80 {
            return Some((value, i));
        }
    }
    None
}

/// `Some` where any_value_bytes would take its fast path and succeed; `None` sends the value to
/// the Python function (arrays, kvlists, bytes, several fields, anything malformed).
pub fn simple(data: &[u8]) -> Option<Simple<'_>> {
    let (&tag, _) = data.split_first()?;
    match tag {
        0x0A if data.len() > 1 => {
            let (size, start) = varint_at(data, 1)?;
            if (start as u64).checked_add(size)? == data.len() as u64 {
                std::str::from_utf8(&data[start..]).ok().map(Simple::Str)
            } else {
                None
            }
        }
        0x18 | 0x10 => {
            let (value, end) = varint_at(data, 1)?;
            if end != data.len() {
                return None;
            }
            Some(if tag == 0x10 {
                Simple::Bool(value != 0)
            } else {
                Simple::Int(value as i64)
            })
        }
        0x21 if data.len() == 9 => {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&data[1..9]);
            Some(Simple::Double(f64::from_le_bytes(raw)))
        }
        _ => None,
    }
}

/// The empty AnyValue (no field) is None in Python; kept apart so `simple` stays about tags.
pub fn is_empty(data: &[u8]) -> bool {
    data.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_simple_values_like_any_value_bytes() {
        assert_eq!(simple(b"\x0a\x02hi"), Some(Simple::Str("hi")));
        assert_eq!(simple(b"\x0a\x03hi"), None); // length mismatch: the parsed message decides
        assert_eq!(simple(b"\x18\x7f"), Some(Simple::Int(127)));
        assert_eq!(
            simple(b"\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"),
            Some(Simple::Int(-1))
        );
        assert_eq!(simple(b"\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02"), None);
        assert_eq!(simple(b"\x10\x00"), Some(Simple::Bool(false)));
        assert_eq!(simple(b"\x18"), None); // truncated: Python raises, so Python must run
        assert_eq!(
            simple(b"\x21\x00\x00\x00\x00\x00\x00\xf0\x3f"),
            Some(Simple::Double(1.0))
        );
        assert_eq!(simple(b"\x0a\x01\xff"), None); // not UTF-8
    }

    #[test]
    fn status_merges_and_last_value_wins() {
        // name "a" then "b"; status {code 2} then status {message "m"}
        let data = b"\x2a\x01a\x2a\x01b\x7a\x02\x18\x02\x7a\x03\x12\x01m";
        let span = parse(data, &mut Vec::new()).unwrap();
        assert_eq!(span.name, "b");
        assert_eq!((span.status_code, span.status_message), (2, "m"));
    }

    #[test]
    fn never_panics_on_prefixes() {
        let data = b"\x0a\x10AAAAAAAAAAAAAAAA\x4a\x08\x0a\x01k\x12\x03\x0a\x01v\x7a\x02\x18\x01";
        for cut in 0..data.len() {
            let mut parsed = Parsed::default();
            if parsed.push(&data[..cut]).is_err() {
                assert!(parsed.spans.is_empty() && parsed.entries.is_empty()); // nothing half-kept
            }
        }
        let mut parsed = Parsed::default();
        parsed.push(b"\x4a\x03\x0a\x01j").unwrap(); // one span before, its entry kept
        parsed.push(data).unwrap();
        assert_eq!(parsed.attributes(&parsed.spans[1]), &[("k", &b"\x0a\x01v"[..])]);
        assert_eq!(parsed.attributes(&parsed.spans[0]), &[("j", &b""[..])]);
    }
}
