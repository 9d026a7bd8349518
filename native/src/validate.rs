//! Whether upb would parse an encoded message, decided without parsing it into Python objects:
//! a walk of every field against the message's schema (built by receiver/spancore.py from the
//! generated protobuf descriptors, so it is the schema upb parses with).
//!
//! The answer is conservative: `Ok(())` only where upb is known to accept the bytes (well-formed
//! wire format, declared strings UTF-8, shallow nesting); anything else (malformed, a field of the
//! wrong wire type, a group, deep nesting) is an error, and the caller lets upb parse the bytes,
//! which gives today's message or today's DecodeError.

use crate::wire::{is_utf8, Fields, Value, WireError};

/// What a declared field must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Varint,
    Fixed64,
    Fixed32,
    /// `bytes`: any length-delimited value.
    Bytes,
    /// `string`: length-delimited UTF-8 (upb refuses the message otherwise).
    Str,
    /// A nested message, by index into `Schema::messages`.
    Message(usize),
}

/// Message nesting upb is sure to accept (it refuses past 100 levels): deeper input is left to it.
pub const MAX_DEPTH: usize = 32;

/// The declared fields of each message type; message 0 is the top-level type.
#[derive(Debug, Default, Clone)]
pub struct Schema {
    /// `messages[m][n]`: field number `n` of message `m`; None or out of range: unknown.
    pub messages: Vec<Vec<Option<Kind>>>,
}

impl Schema {
    /// From (message index, field number, kind code, nested message index) rows; kind codes:
    /// 0 varint, 1 fixed64, 2 bytes, 3 string, 4 message, 5 fixed32. None: a row is out of range.
    pub fn from_rows(count: usize, rows: &[(usize, u32, u8, usize)]) -> Option<Schema> {
        let mut messages: Vec<Vec<Option<Kind>>> = vec![Vec::new(); count];
        for &(message, number, code, nested) in rows {
            let kind = match code {
                0 => Kind::Varint,
                1 => Kind::Fixed64,
                2 => Kind::Bytes,
                3 => Kind::Str,
                4 if nested < count => Kind::Message(nested),
                5 => Kind::Fixed32,
                _ => return None,
            };
            let number = number as usize;
            if message >= count || number == 0 || number > 1 << 16 {
                return None;
            }
            let fields = &mut messages[message];
            if fields.len() <= number {
                fields.resize(number + 1, None);
            }
            fields[number] = Some(kind);
        }
        (count > 0).then_some(Schema { messages })
    }

    fn kind(&self, message: usize, number: u32) -> Option<Kind> {
        self.messages[message].get(number as usize).copied().flatten()
    }

    /// `Ok(())` when upb accepts `data` as message 0.
    pub fn check(&self, data: &[u8]) -> Result<(), WireError> {
        self.check_message(&Fields::new(data), 0, 0)
    }

    fn check_message(&self, fields: &Fields<'_>, message: usize, depth: usize) -> Result<(), WireError> {
        if depth > MAX_DEPTH {
            return Err(WireError::Unsupported);
        }
        let mut scan = fields.nested_all();
        while let Some((number, value)) = scan.next_field_strict()? {
            self.check_field(fields, message, number, value, depth, true)?;
        }
        Ok(())
    }

    /// One field of message `message` (at `depth`) as upb takes it; a nested message is checked
    /// whole unless `descend` is false (the caller walks it itself: the ingest index).
    pub fn check_field(
        &self,
        fields: &Fields<'_>,
        message: usize,
        number: u32,
        value: Value,
        depth: usize,
        descend: bool,
    ) -> Result<(), WireError> {
        let Some(kind) = self.kind(message, number) else {
            return Ok(()); // unknown: kept as bytes by upb, whatever it holds
        };
        match (kind, value) {
            (Kind::Varint, Value::Varint(_))
            | (Kind::Fixed64, Value::Fixed64(_))
            | (Kind::Fixed32, Value::Fixed32(_))
            | (Kind::Bytes, Value::Len(..)) => Ok(()),
            (Kind::Str, Value::Len(start, end)) => {
                if is_utf8(fields.bytes(start, end)) {
                    Ok(())
                } else {
                    Err(WireError::Malformed)
                }
            }
            (Kind::Message(nested), Value::Len(start, end)) => {
                if descend {
                    self.check_message(&fields.nested(start, end), nested, depth + 1)
                } else {
                    Ok(())
                }
            }
            // packed scalars, or a declared field of another wire type: upb decides
            _ => Err(WireError::Unsupported),
        }
    }

    /// The message type field `number` of message `message` holds, if it is a message field.
    pub fn nested_message(&self, message: usize, number: u32) -> Option<usize> {
        match self.kind(message, number) {
            Some(Kind::Message(nested)) => Some(nested),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn len(field: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![(field << 3) | 2, body.len() as u8];
        out.extend_from_slice(body);
        out
    }

    /// message 0 { 1: message 1 }, message 1 { 1: string, 2: varint, 3: message 1 }
    fn schema() -> Schema {
        Schema::from_rows(2, &[(0, 1, 4, 1), (1, 1, 3, 0), (1, 2, 0, 0), (1, 3, 4, 1)]).unwrap()
    }

    #[test]
    fn accepts_well_formed_and_unknown_fields() {
        let mut inner = len(1, b"text");
        inner.extend([0x10, 7]); // 2: varint
        inner.extend(len(9, b"\xff unknown bytes are not checked"));
        assert_eq!(schema().check(&len(1, &inner)), Ok(()));
    }

    #[test]
    fn refuses_what_upb_refuses_or_leaves_it_to_upb() {
        let s = schema();
        assert_eq!(s.check(&len(1, &len(1, b"\xff"))), Err(WireError::Malformed)); // bad UTF-8
        assert_eq!(s.check(&len(1, &[0x10])), Err(WireError::Malformed)); // truncated varint
        assert_eq!(s.check(&len(1, &len(2, b"x"))), Err(WireError::Unsupported)); // packed / wrong type
        assert_eq!(s.check(&len(1, &[0x0B, 0x0C])), Err(WireError::Unsupported)); // a group
                                                                                  // a tag of 6 bytes: upb refuses tags over 5
        assert_eq!(
            s.check(&len(1, &[0x90, 0x80, 0x80, 0x80, 0x80, 0x00, 1])),
            Err(WireError::Malformed)
        );
        let mut deep = len(1, b"x");
        for _ in 0..MAX_DEPTH + 1 {
            deep = len(3, &deep);
        }
        assert_eq!(s.check(&len(1, &deep)), Err(WireError::Unsupported));
    }

    #[test]
    fn schema_rows_are_checked() {
        assert!(Schema::from_rows(1, &[(0, 1, 4, 5)]).is_none());
        assert!(Schema::from_rows(1, &[(0, 0, 0, 0)]).is_none());
        assert!(Schema::from_rows(1, &[(0, 1, 9, 0)]).is_none());
        assert!(Schema::from_rows(0, &[]).is_none());
    }
}
