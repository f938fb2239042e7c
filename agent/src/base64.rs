//! Standard-alphabet base64 (RFC 4648 §4) with required padding.
//!
//! Used for binary bundle files on the wire and by the controller's `b64encode`/`b64decode`
//! template filters. Decoding is strict: wrong length, characters outside the alphabet, misplaced
//! padding and non-zero trailing bits are errors, so a value has exactly one accepted encoding.

use std::fmt;

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Why a base64 text could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The length is not a multiple of four (padding is required).
    Length(usize),
    /// A byte outside the standard alphabet, at this offset.
    InvalidByte { offset: usize, byte: u8 },
    /// `=` somewhere other than the last one or two positions.
    Padding { offset: usize },
    /// The last symbol carries bits that the padding says do not exist.
    TrailingBits,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Length(n) => {
                write!(
                    f,
                    "invalid base64: length {n} is not a multiple of 4 (padding is required)"
                )
            }
            DecodeError::InvalidByte { offset, byte } => {
                write!(
                    f,
                    "invalid base64: byte {:?} at offset {offset} is not in the standard alphabet",
                    *byte as char
                )
            }
            DecodeError::Padding { offset } => {
                write!(f, "invalid base64: misplaced padding at offset {offset}")
            }
            DecodeError::TrailingBits => {
                write!(f, "invalid base64: non-zero bits after the last byte")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Encodes bytes as padded standard base64.
pub fn encode(input: &[u8]) -> String {
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let symbols = [(n >> 18) & 63, (n >> 12) & 63, (n >> 6) & 63, n & 63];
        for (i, s) in symbols.iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[*s as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn symbol_value(byte: u8) -> Option<u32> {
    let v = match byte {
        b'A'..=b'Z' => byte - b'A',
        b'a'..=b'z' => byte - b'a' + 26,
        b'0'..=b'9' => byte - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    };
    Some(u32::from(v))
}

/// Decodes padded standard base64. Whitespace is not accepted (strip it first if the source
/// wraps lines).
pub fn decode(input: &str) -> Result<Vec<u8>, DecodeError> {
    let bytes = input.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return Err(DecodeError::Length(bytes.len()));
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let quads = bytes.len() / 4;
    for (q, quad) in bytes.chunks(4).enumerate() {
        let last = q + 1 == quads;
        let pad = quad.iter().rev().take_while(|&&b| b == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            let first_pad = quad.iter().position(|&b| b == b'=').unwrap_or(0);
            return Err(DecodeError::Padding {
                offset: q * 4 + first_pad,
            });
        }
        let mut n: u32 = 0;
        for (i, &b) in quad.iter().enumerate() {
            let offset = q * 4 + i;
            let v = if i >= 4 - pad {
                0
            } else if b == b'=' {
                return Err(DecodeError::Padding { offset });
            } else {
                symbol_value(b).ok_or(DecodeError::InvalidByte { offset, byte: b })?
            };
            n = (n << 6) | v;
        }
        let decoded = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        let keep = 3 - pad;
        if decoded[keep..].iter().any(|&b| b != 0) {
            return Err(DecodeError::TrailingBits);
        }
        out.extend_from_slice(&decoded[..keep]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4648_vectors_round_trip() {
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in vectors {
            assert_eq!(encode(plain.as_bytes()), encoded);
            assert_eq!(decode(encoded).unwrap(), plain.as_bytes());
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&all)).unwrap(), all);
    }

    #[test]
    fn rejects_malformed_input_with_clear_errors() {
        assert_eq!(decode("Zg"), Err(DecodeError::Length(2)));
        assert_eq!(decode("Zg=a"), Err(DecodeError::Padding { offset: 2 }));
        assert_eq!(decode("Zg==Zm9v"), Err(DecodeError::Padding { offset: 2 }));
        assert_eq!(decode("Z==="), Err(DecodeError::Padding { offset: 1 }));
        assert_eq!(
            decode("Zm9v-A=="),
            Err(DecodeError::InvalidByte {
                offset: 4,
                byte: b'-'
            })
        );
        assert_eq!(decode("Zh=="), Err(DecodeError::TrailingBits));
        assert!(decode("Zm 9")
            .unwrap_err()
            .to_string()
            .contains("not in the standard alphabet"));
    }
}
