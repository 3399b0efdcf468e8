//! [`ObjectKey`]: an object's storage key (`namespace/name`, or `name` when cluster-scoped),
//! ordered by bytes as the apiserver's keys are. A cached object's key is shared by its store
//! entry and its [`Header`](super::Header), and its one allocation also carries the header's
//! packed strings after the key (`ObjectKey::with_tail`): one allocation per object for both.
//!
//! Called by `resource` (`Header` builds keys with tails), `cache` (store lookups and ranges) and
//! the sim (its store's keys).

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Storage key of an object: `namespace/name` (or `name` for cluster-scoped objects).
/// Ordered by bytes, like the apiserver's keys (`a-b/x` < `a/x`). Equality, order and hash are
/// the key's alone, never the tail's.
#[derive(Clone)]
pub struct ObjectKey(
    /// The key's length as LEB128, the key's UTF-8 bytes, then the tail (often empty).
    Arc<[u8]>,
);

impl ObjectKey {
    pub fn new(namespace: &str, name: &str) -> Self {
        Self::with_tail(namespace, name, 0, |_| {})
    }

    /// A key of any text: a range bound, a prefix, a key read back from elsewhere.
    pub fn of(key: &str) -> Self {
        Self::with_tail("", key, 0, |_| {})
    }

    /// The key `namespace/name` with, in the same allocation after it, the bytes `tail` writes
    /// (about `tail_len` of them), read back by [`ObjectKey::tail`].
    pub fn with_tail(namespace: &str, name: &str, tail_len: usize, tail: impl FnOnce(&mut Vec<u8>)) -> Self {
        let key_len = if namespace.is_empty() { name.len() } else { namespace.len() + 1 + name.len() };
        let mut buf = Vec::with_capacity(5 + key_len + tail_len);
        put_len(&mut buf, key_len);
        if !namespace.is_empty() {
            buf.extend_from_slice(namespace.as_bytes());
            buf.push(b'/');
        }
        buf.extend_from_slice(name.as_bytes());
        tail(&mut buf);
        ObjectKey(Arc::from(buf))
    }

    /// Where the key's bytes are in the allocation.
    fn span(&self) -> (usize, usize) {
        // Written by `with_tail`: the length is always there.
        let (n, i) = read_len(&self.0).unwrap_or((0, 0));
        (i, (i + n).min(self.0.len()))
    }

    pub fn as_bytes(&self) -> &[u8] {
        let (start, end) = self.span();
        &self.0[start..end]
    }

    pub fn as_str(&self) -> &str {
        // Written from `&str`s by `with_tail`: always UTF-8.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    /// The bytes written after the key by [`ObjectKey::with_tail`].
    pub fn tail(&self) -> &[u8] {
        &self.0[self.span().1..]
    }

    /// Whether the two are one allocation (two versions of an object sharing their key).
    pub fn same_allocation(&self, other: &ObjectKey) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The whole allocation's bytes (key and tail): what two headers compare equal by.
    pub(super) fn whole(&self) -> &[u8] {
        &self.0
    }

    /// Heap bytes of the allocation (its two counts, the key and the tail).
    pub fn heap_bytes(&self) -> usize {
        2 * std::mem::size_of::<usize>() + self.0.len()
    }
}

/// A LEB128 length, as the key's and `Header`'s packed strings write theirs.
pub(super) fn put_len(out: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// The LEB128 length at the start of `b` (written by [`put_len`]) and how many bytes it takes;
/// `None` if `b` ends inside it.
pub(super) fn read_len(b: &[u8]) -> Option<(usize, usize)> {
    let (mut n, mut shift) = (0usize, 0);
    for (i, &byte) in b.iter().enumerate() {
        n |= usize::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some((n, i + 1));
        }
        shift += 7;
    }
    None
}

impl From<String> for ObjectKey {
    fn from(key: String) -> Self {
        ObjectKey::of(&key)
    }
}

impl PartialEq for ObjectKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for ObjectKey {}

impl PartialOrd for ObjectKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ObjectKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl Hash for ObjectKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state)
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ObjectKey").field(&self.as_str()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;

    fn hash(k: &ObjectKey) -> u64 {
        let mut h = DefaultHasher::new();
        k.hash(&mut h);
        h.finish()
    }

    #[test]
    fn the_tail_never_takes_part_in_equality_order_or_hash() {
        let plain = ObjectKey::new("ns", "a");
        let tailed = ObjectKey::with_tail("ns", "a", 3, |b| b.extend_from_slice(b"\xffzz"));
        assert_eq!(plain, tailed);
        assert_eq!(plain.cmp(&tailed), Ordering::Equal);
        assert_eq!(hash(&plain), hash(&tailed));
        assert_eq!((tailed.as_str(), tailed.tail()), ("ns/a", &b"\xffzz"[..]));
        assert_eq!(plain.tail(), b"");
        assert_ne!(plain.whole(), tailed.whole());
        // A tail that sorts low does not pull its key below a longer one.
        let low = ObjectKey::with_tail("ns", "a", 1, |b| b.push(0));
        assert!(low < ObjectKey::new("ns", "a0") && low > ObjectKey::of("ns/"));
    }

    #[test]
    fn ordered_as_the_apiservers_keys() {
        let mut keys = [
            ObjectKey::new("a", "x"),
            ObjectKey::new("a-b", "x"),
            ObjectKey::new("", "a"),
            ObjectKey::of("a/"),
            ObjectKey::of("a0"),
        ];
        keys.sort();
        let texts: Vec<&str> = keys.iter().map(ObjectKey::as_str).collect();
        assert_eq!(texts, ["a", "a-b/x", "a/", "a/x", "a0"]);
    }

    #[test]
    fn long_keys_take_a_longer_length() {
        for len in [0, 1, 127, 128, 300, 16_384, 70_000] {
            let name = "n".repeat(len);
            let k = ObjectKey::with_tail("", &name, 2, |b| b.extend_from_slice(b"tt"));
            assert_eq!(k.as_str(), name);
            assert_eq!(k.tail(), b"tt");
            assert_eq!(k.heap_bytes(), 16 + k.whole().len());
        }
    }
}
