//! A MessagePack decoder for what code object metadata uses: maps, arrays, strings, integers,
//! booleans and nil (floats, binary and extension values are read and skipped over).
//!
//! Every length is checked against the bytes left before anything is taken or allocated, and
//! nesting is limited, so hostile input gives an [`Error`], never a panic, an out-of-bounds read,
//! an allocation larger than the input, or a deep recursion.

use crate::Error;

/// The deepest nesting of arrays and maps accepted (metadata nests four levels).
const MAX_DEPTH: usize = 32;
/// The most elements reserved at once for an array or map: a count is only a claim, and
/// elements are added as they are read (each takes at least one byte), so memory grows with
/// what the input really holds, never with what its counts say at every level of nesting.
const MAX_RESERVE: usize = 64;

/// One decoded value, borrowing its strings from the input.
#[derive(Clone, Debug, PartialEq)]
pub enum Value<'a> {
    Nil,
    Bool(bool),
    /// Any integer (negative ones as their two's complement).
    Int(i128),
    /// A string that is valid UTF-8.
    Str(&'a str),
    Array(Vec<Value<'a>>),
    Map(Vec<(Value<'a>, Value<'a>)>),
    /// A float, binary, extension value or a string that is not UTF-8: present, not used.
    Other,
}

impl<'a> Value<'a> {
    /// The value under string key `key` of a map.
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        match self {
            Value::Map(entries) => entries
                .iter()
                .find(|(k, _)| matches!(k, Value::Str(s) if *s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&'a str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value<'a>]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// Decodes one value that takes up all of `bytes`.
pub fn decode(bytes: &[u8]) -> Result<Value<'_>, Error> {
    let mut r = Cursor { bytes, at: 0 };
    let v = r.value(0)?;
    if r.at != bytes.len() {
        return Err(Error::Metadata(format!(
            "{} bytes after the metadata map",
            bytes.len() - r.at
        )));
    }
    Ok(v)
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

fn truncated() -> Error {
    Error::Metadata("truncated MessagePack".into())
}

impl<'a> Cursor<'a> {
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        let end = self.at.checked_add(n).ok_or_else(truncated)?;
        let s = self.bytes.get(self.at..end).ok_or_else(truncated)?;
        self.at = end;
        Ok(s)
    }

    fn uint(&mut self, n: usize) -> Result<u64, Error> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn len(&mut self, n: usize) -> Result<usize, Error> {
        usize::try_from(self.uint(n)?).map_err(|_| truncated())
    }

    /// `count` elements of at least `each` bytes must fit in what is left.
    fn check_count(&self, count: usize, each: usize) -> Result<(), Error> {
        if count
            .checked_mul(each)
            .is_none_or(|need| need > self.left())
        {
            return Err(truncated());
        }
        Ok(())
    }

    fn str(&mut self, n: usize) -> Result<Value<'a>, Error> {
        let bytes = self.take(n)?;
        Ok(std::str::from_utf8(bytes).map_or(Value::Other, Value::Str))
    }

    fn array(&mut self, count: usize, depth: usize) -> Result<Value<'a>, Error> {
        self.check_count(count, 1)?;
        let mut items = Vec::with_capacity(count.min(MAX_RESERVE));
        for _ in 0..count {
            items.push(self.value(depth + 1)?);
        }
        Ok(Value::Array(items))
    }

    fn map(&mut self, count: usize, depth: usize) -> Result<Value<'a>, Error> {
        self.check_count(count, 2)?;
        let mut entries = Vec::with_capacity(count.min(MAX_RESERVE));
        for _ in 0..count {
            let k = self.value(depth + 1)?;
            let v = self.value(depth + 1)?;
            entries.push((k, v));
        }
        Ok(Value::Map(entries))
    }

    fn skip(&mut self, n: usize) -> Result<Value<'a>, Error> {
        self.take(n)?;
        Ok(Value::Other)
    }

    fn value(&mut self, depth: usize) -> Result<Value<'a>, Error> {
        if depth > MAX_DEPTH {
            return Err(Error::Metadata("MessagePack nested too deeply".into()));
        }
        let tag = self.take(1)?[0];
        match tag {
            0x00..=0x7f => Ok(Value::Int(i128::from(tag))),
            0x80..=0x8f => self.map(usize::from(tag & 0x0f), depth),
            0x90..=0x9f => self.array(usize::from(tag & 0x0f), depth),
            0xa0..=0xbf => self.str(usize::from(tag & 0x1f)),
            0xc0 => Ok(Value::Nil),
            0xc2 => Ok(Value::Bool(false)),
            0xc3 => Ok(Value::Bool(true)),
            // bin 8/16/32
            0xc4 => {
                let n = self.len(1)?;
                self.skip(n)
            }
            0xc5 => {
                let n = self.len(2)?;
                self.skip(n)
            }
            0xc6 => {
                let n = self.len(4)?;
                self.skip(n)
            }
            // ext 8/16/32: length, type byte, data
            0xc7 => {
                let n = self.len(1)?;
                self.skip(n.checked_add(1).ok_or_else(truncated)?)
            }
            0xc8 => {
                let n = self.len(2)?;
                self.skip(n.checked_add(1).ok_or_else(truncated)?)
            }
            0xc9 => {
                let n = self.len(4)?;
                self.skip(n.checked_add(1).ok_or_else(truncated)?)
            }
            0xca => self.skip(4),
            0xcb => self.skip(8),
            0xcc => Ok(Value::Int(i128::from(self.uint(1)?))),
            0xcd => Ok(Value::Int(i128::from(self.uint(2)?))),
            0xce => Ok(Value::Int(i128::from(self.uint(4)?))),
            0xcf => Ok(Value::Int(i128::from(self.uint(8)?))),
            0xd0 => Ok(Value::Int(i128::from(self.uint(1)? as u8 as i8))),
            0xd1 => Ok(Value::Int(i128::from(self.uint(2)? as u16 as i16))),
            0xd2 => Ok(Value::Int(i128::from(self.uint(4)? as u32 as i32))),
            0xd3 => Ok(Value::Int(i128::from(self.uint(8)? as i64))),
            // fixext 1/2/4/8/16: type byte, data
            0xd4 => self.skip(2),
            0xd5 => self.skip(3),
            0xd6 => self.skip(5),
            0xd7 => self.skip(9),
            0xd8 => self.skip(17),
            0xd9 => {
                let n = self.len(1)?;
                self.str(n)
            }
            0xda => {
                let n = self.len(2)?;
                self.str(n)
            }
            0xdb => {
                let n = self.len(4)?;
                self.str(n)
            }
            0xdc => {
                let n = self.len(2)?;
                self.array(n, depth)
            }
            0xdd => {
                let n = self.len(4)?;
                self.array(n, depth)
            }
            0xde => {
                let n = self.len(2)?;
                self.map(n, depth)
            }
            0xdf => {
                let n = self.len(4)?;
                self.map(n, depth)
            }
            0xe0..=0xff => Ok(Value::Int(i128::from(tag as i8))),
            0xc1 => Err(Error::Metadata(
                "MessagePack byte 0xc1 is never used".into(),
            )),
        }
    }
}

/// Writes MessagePack (what [`crate::write`] puts in a metadata note).
#[derive(Default)]
pub(crate) struct Encoder {
    pub(crate) out: Vec<u8>,
}

impl Encoder {
    pub(crate) fn str(&mut self, s: &str) {
        let n = s.len();
        if n < 32 {
            self.out.push(0xa0 | n as u8);
        } else if n < 256 {
            self.out.push(0xd9);
            self.out.push(n as u8);
        } else if n < 65536 {
            self.out.push(0xda);
            self.out.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.out.push(0xdb);
            self.out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        self.out.extend_from_slice(s.as_bytes());
    }

    pub(crate) fn uint(&mut self, v: u64) {
        if v < 128 {
            self.out.push(v as u8);
        } else if v <= u64::from(u32::MAX) {
            self.out.push(0xce);
            self.out.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            self.out.push(0xcf);
            self.out.extend_from_slice(&v.to_be_bytes());
        }
    }

    fn header(&mut self, n: usize, fix: u8, b16: u8, b32: u8) {
        if n < 16 {
            self.out.push(fix | n as u8);
        } else if n < 65536 {
            self.out.push(b16);
            self.out.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.out.push(b32);
            self.out.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }

    pub(crate) fn array(&mut self, n: usize) {
        self.header(n, 0x90, 0xdc, 0xdd);
    }

    pub(crate) fn map(&mut self, n: usize) {
        self.header(n, 0x80, 0xde, 0xdf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_encoded_form_decodes() {
        let mut e = Encoder::default();
        e.map(3);
        e.str("a");
        e.uint(5);
        e.str(&"k".repeat(40));
        e.array(2);
        e.uint(300);
        e.uint(1 << 40);
        e.str("s");
        e.str(&"x".repeat(300));
        let v = decode(&e.out).unwrap();
        assert_eq!(v.get("a"), Some(&Value::Int(5)));
        assert_eq!(
            v.get(&"k".repeat(40)).and_then(Value::as_array),
            Some(&[Value::Int(300), Value::Int(1 << 40)][..])
        );
        assert_eq!(v.get("s").and_then(Value::as_str), Some(&*"x".repeat(300)));
        for cut in 0..e.out.len() {
            assert!(decode(&e.out[..cut]).is_err(), "truncated at {cut}");
        }
    }

    #[test]
    fn signed_floats_and_skipped_kinds() {
        // fixmap 1 { "n": -1 (0xff) }, then int8 -2, float64, bin8 of 2, fixext1, nil, true
        let bytes = [
            0x97, 0xff, 0xd0, 0xfe, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xc4, 2, 1, 2, 0xd4, 1, 9, 0xc0,
            0xc3,
        ];
        assert_eq!(
            decode(&bytes).unwrap(),
            Value::Array(vec![
                Value::Int(-1),
                Value::Int(-2),
                Value::Other,
                Value::Other,
                Value::Other,
                Value::Nil,
                Value::Bool(true)
            ])
        );
    }

    #[test]
    fn hostile_input_is_an_error() {
        // An array claiming 2^32-1 elements in 5 bytes: refused before any allocation.
        assert!(decode(&[0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
        // A map claiming 2^32-1 entries.
        assert!(decode(&[0xdf, 0xff, 0xff, 0xff, 0xff]).is_err());
        // A string longer than the input.
        assert!(decode(&[0xdb, 0xff, 0xff, 0xff, 0xff, b'a']).is_err());
        // ext 32 of length 2^32-1.
        assert!(decode(&[0xc9, 0xff, 0xff, 0xff, 0xff, 1]).is_err());
        // The reserved byte.
        assert!(decode(&[0xc1]).is_err());
        // Nested arrays each claiming as many elements as bytes are left: an error, having
        // reserved no more than a few elements at each level.
        let mut claims = Vec::new();
        for _ in 0..30 {
            claims.extend_from_slice(&[0xdd, 0x00, 0x10, 0x00, 0x00]);
        }
        claims.resize(1 << 20, 0xc0);
        assert!(decode(&claims).is_err());
        // Deep nesting: 1000 one-element arrays.
        let deep = vec![0x91u8; 1000];
        assert!(decode(&deep).is_err());
        // Trailing bytes.
        assert!(decode(&[0xc0, 0xc0]).is_err());
        assert!(decode(&[]).is_err());
        // A string that is not UTF-8 is kept as `Other`.
        assert_eq!(decode(&[0xa2, 0xff, 0xfe]).unwrap(), Value::Other);
    }
}
