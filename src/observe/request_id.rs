//! Request ids: a valid inbound `X-Request-Id` is kept, otherwise one is generated. Ids live in
//! a fixed array, so neither path allocates.

use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// Longest inbound id kept; longer ones are replaced.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// One request's id.
#[derive(Clone, Copy)]
pub struct RequestId {
    bytes: [u8; MAX_REQUEST_ID_BYTES],
    len: u8,
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

impl RequestId {
    /// The id's bytes (printable ASCII).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        // invariant: only printable ASCII is ever stored.
        std::str::from_utf8(self.as_bytes()).unwrap_or("")
    }

    /// `value` as an id if it is 1 to 128 printable ASCII bytes.
    pub fn from_inbound(value: &[u8]) -> Option<RequestId> {
        if value.is_empty()
            || value.len() > MAX_REQUEST_ID_BYTES
            || !value.iter().all(|&b| (0x20..0x7f).contains(&b))
        {
            return None;
        }
        let mut bytes = [0u8; MAX_REQUEST_ID_BYTES];
        bytes[..value.len()].copy_from_slice(value);
        Some(RequestId {
            bytes,
            len: value.len() as u8,
        })
    }
}

/// A worker's id generator: a random 64-bit prefix (per worker, per process start) and a
/// counter, as 32 lowercase hex digits.
#[derive(Debug)]
pub struct RequestIds {
    /// The prefix, as the 16 hex digits every id starts with.
    prefix: [u8; 16],
    counter: Cell<u64>,
}

impl RequestIds {
    /// A generator for worker `worker`.
    pub fn new(worker: usize) -> Self {
        let mut h = RandomState::new().build_hasher();
        h.write_usize(worker);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        let mut prefix = [0; 16];
        hex(h.finish(), &mut prefix);
        RequestIds {
            prefix,
            counter: Cell::new(0),
        }
    }

    /// The next id.
    pub fn next(&self) -> RequestId {
        let n = self.counter.get().wrapping_add(1);
        self.counter.set(n);
        let mut bytes = [0u8; MAX_REQUEST_ID_BYTES];
        bytes[..16].copy_from_slice(&self.prefix);
        hex(n, &mut bytes[16..32]);
        RequestId { bytes, len: 32 }
    }
}

fn hex(mut v: u64, out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for slot in out.iter_mut().rev() {
        *slot = DIGITS[(v & 0xf) as usize];
        v >>= 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_unique_hex() {
        let ids = RequestIds::new(0);
        let a = ids.next();
        let b = ids.next();
        assert_ne!(a.as_bytes(), b.as_bytes());
        assert_eq!(a.as_bytes().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        let other = RequestIds::new(1).next();
        assert_ne!(a.as_bytes()[..16], other.as_bytes()[..16]);
    }

    #[test]
    fn inbound_validation() {
        assert_eq!(
            RequestId::from_inbound(b"abc-123").unwrap().as_str(),
            "abc-123"
        );
        assert!(RequestId::from_inbound(b"").is_none());
        assert!(RequestId::from_inbound(&[b'a'; 129]).is_none());
        assert!(RequestId::from_inbound(&[b'a'; 128]).is_some());
        assert!(RequestId::from_inbound(b"a\x01b").is_none());
        assert!(RequestId::from_inbound("é".as_bytes()).is_none());
    }
}
