//! Checked reading of the protobuf wire format: every length and index is bounds-checked, so
//! untrusted bytes end in `WireError`, never in a panic or an out-of-bounds read.

/// Why bytes could not be read; either way the caller falls back to the pure-Python path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// Not valid protobuf (truncated, a varint over 10 bytes, field number 0, wire type 6/7,
    /// invalid UTF-8 in a string field).
    Malformed,
    /// Valid but not handled here (groups): the Python path reads it.
    Unsupported,
}

/// One field's value as it appears on the wire. `Len` holds absolute offsets into the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    Varint(u64),
    Fixed64(u64),
    Len(usize, usize),
    Fixed32(u32),
}

/// The fields of one message, `data[pos..end]`, in wire order.
pub struct Fields<'a> {
    data: &'a [u8],
    pos: usize,
    end: usize,
}

impl<'a> Fields<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Fields {
            data,
            pos: 0,
            end: data.len(),
        }
    }

    /// The fields of the length-delimited value at `start..end` of the same buffer.
    pub fn nested(&self, start: usize, end: usize) -> Fields<'a> {
        debug_assert!(start <= end && end <= self.data.len());
        Fields {
            data: self.data,
            pos: start,
            end,
        }
    }

    /// The same message from its start again (a second pass over its fields).
    pub fn nested_all(&self) -> Fields<'a> {
        Fields {
            data: self.data,
            pos: self.pos,
            end: self.end,
        }
    }

    pub fn bytes(&self, start: usize, end: usize) -> &'a [u8] {
        &self.data[start..end]
    }

    /// One varint; one or two bytes (tags, lengths under 16 KiB) without entering the loop.
    #[inline(always)]
    fn varint(&mut self) -> Result<u64, WireError> {
        let bytes = &self.data[..self.end];
        if let Some(&byte) = bytes.get(self.pos) {
            if byte < 0x80 {
                self.pos += 1;
                return Ok(u64::from(byte));
            }
            if let Some(&next) = bytes.get(self.pos + 1) {
                if next < 0x80 {
                    self.pos += 2;
                    return Ok(u64::from(byte & 0x7F) | (u64::from(next) << 7));
                }
            }
        }
        self.long_varint()
    }

    #[inline(never)]
    fn long_varint(&mut self) -> Result<u64, WireError> {
        let mut value: u64 = 0;
        for i in 0..10 {
            if self.pos >= self.end {
                return Err(WireError::Malformed);
            }
            let byte = self.data[self.pos];
            self.pos += 1;
            value |= u64::from(byte & 0x7F) << (7 * i);
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(WireError::Malformed)
    }

    fn take(&mut self, n: usize) -> Result<usize, WireError> {
        if self.end - self.pos < n {
            return Err(WireError::Malformed);
        }
        let start = self.pos;
        self.pos += n;
        Ok(start)
    }

    /// The next (field number, value), `Ok(None)` at the end of the message.
    #[inline]
    pub fn next_field(&mut self) -> Result<Option<(u32, Value)>, WireError> {
        self.field(false)
    }

    /// `next_field` that also refuses what only upb refuses: a tag written in more than 5 bytes, a
    /// length of 2^31 - 1 or more (upb's limits; `next_field` reads those as well-formed).
    #[inline]
    pub fn next_field_strict(&mut self) -> Result<Option<(u32, Value)>, WireError> {
        self.field(true)
    }

    #[inline(always)]
    fn field(&mut self, strict: bool) -> Result<Option<(u32, Value)>, WireError> {
        if self.pos >= self.end {
            return Ok(None);
        }
        let at = self.pos;
        let key = self.varint()?;
        if strict && self.pos - at > 5 {
            return Err(WireError::Malformed);
        }
        let number = key >> 3;
        if number == 0 || number > 0x1FFF_FFFF {
            return Err(WireError::Malformed);
        }
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                let at = self.take(8)?;
                let mut raw = [0u8; 8];
                raw.copy_from_slice(&self.data[at..at + 8]);
                Value::Fixed64(u64::from_le_bytes(raw))
            }
            2 => {
                let size = self.varint()?;
                let room = (self.end - self.pos) as u64;
                if size > room || (strict && size >= i32::MAX as u64) {
                    return Err(WireError::Malformed);
                }
                let start = self.take(size as usize)?;
                Value::Len(start, self.pos)
            }
            5 => {
                let at = self.take(4)?;
                let mut raw = [0u8; 4];
                raw.copy_from_slice(&self.data[at..at + 4]);
                Value::Fixed32(u32::from_le_bytes(raw))
            }
            3 | 4 => return Err(WireError::Unsupported),
            _ => return Err(WireError::Malformed),
        };
        Ok(Some((number as u32, value)))
    }
}

/// A proto3 string field's bytes as text; upb refuses the message when they are not UTF-8.
pub fn utf8(bytes: &[u8]) -> Result<&str, WireError> {
    std::str::from_utf8(bytes).map_err(|_| WireError::Malformed)
}

/// Whether `bytes` are UTF-8; ASCII (most text on the wire) is checked a word at a time first.
#[inline]
pub fn is_utf8(bytes: &[u8]) -> bool {
    bytes.is_ascii() || std::str::from_utf8(bytes).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(data: &[u8]) -> Result<Vec<(u32, Value)>, WireError> {
        let mut fields = Fields::new(data);
        let mut out = Vec::new();
        while let Some(field) = fields.next_field()? {
            out.push(field);
        }
        Ok(out)
    }

    #[test]
    fn reads_each_wire_type() {
        let data = [
            0x08, 0x96, 0x01, 0x11, 1, 0, 0, 0, 0, 0, 0, 0, 0x1A, 2, b'h', b'i', 0x25, 2, 0, 0, 0,
        ];
        assert_eq!(
            all(&data).unwrap(),
            vec![
                (1, Value::Varint(150)),
                (2, Value::Fixed64(1)),
                (3, Value::Len(14, 16)),
                (4, Value::Fixed32(2))
            ]
        );
    }

    #[test]
    fn refuses_truncation_and_bad_keys() {
        assert_eq!(all(&[0x0A, 5, 1]), Err(WireError::Malformed)); // length past the end
        assert_eq!(all(&[0x08]), Err(WireError::Malformed)); // varint missing
        assert_eq!(all(&[0x09, 1, 2]), Err(WireError::Malformed)); // fixed64 cut
        assert_eq!(all(&[0x00, 1]), Err(WireError::Malformed)); // field number 0
        assert_eq!(all(&[0x0E]), Err(WireError::Malformed)); // wire type 6
        assert_eq!(all(&[0x0B, 0x0C]), Err(WireError::Unsupported)); // a group
        assert_eq!(
            all(&[0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]),
            Err(WireError::Malformed)
        );
        // a length near u64::MAX must not overflow
        assert_eq!(
            all(&[0x0A, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]),
            Err(WireError::Malformed)
        );
    }
}
