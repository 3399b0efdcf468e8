//! [`Header`]: the parsed part of a cached object (key, resourceVersion, uid, labels,
//! selectable fields), kept compact because every cached object carries one: the key is the
//! store's own [`ObjectKey`] (namespace and name are read out of it), and the uid, labels and
//! field values are packed after the key in the key's own allocation, read in place (a
//! canonical uid as its 16 bytes).
//!
//! Called by `resource` (`Object::parse` makes one), `selector` (label, field and shard
//! selectors read it), `cache` (filters, watcher indexes) and `consistency`.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;

use super::key::{put_len, read_len};
use super::{ObjectKey, Rv};

/// The parsed part of an object: enough to key, version, select and index it.
#[derive(Clone, Debug)]
pub struct Header {
    /// The key, with the packed strings as its allocation's tail.
    pub key: ObjectKey,
    pub rv: Rv,
    /// Bytes of `key` that are the namespace (0: cluster-scoped, `key` is the name).
    ns_len: u32,
    /// Labels in the packed strings start here, then fields at `fields_at`.
    labels_at: u32,
    fields_at: u32,
    /// The packed strings begin with the uid as 16 bytes (a canonical, lowercase UUID as the
    /// apiserver makes them) rather than as a string.
    uid_bytes: bool,
}

/// The packed strings (the key's tail): the uid (16 bytes, or a string), then each label's key
/// and value (sorted by key), then each field's name and value (sorted by name), every string
/// as a LEB128 length and its UTF-8 bytes.
impl Header {
    /// A header; `labels` and `fields` in any order (a repeated key keeps its last value, as
    /// a map built from them would).
    pub fn new<'a>(
        namespace: &str,
        name: &str,
        rv: Rv,
        uid: &str,
        labels: impl IntoIterator<Item = (&'a str, &'a str)>,
        fields: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Header {
        let labels: BTreeMap<&str, &str> = labels.into_iter().collect();
        let fields: BTreeMap<&str, &str> = fields.into_iter().collect();
        let uuid = uuid_bytes(uid);
        let pairs = labels.iter().chain(fields.iter()).map(|(k, v)| k.len() + v.len() + 4).sum::<usize>();
        let (mut labels_at, mut fields_at) = (0, 0);
        let key = ObjectKey::with_tail(namespace, name, uid.len() + 2 + pairs, |out| {
            let start = out.len();
            match uuid {
                Some(b) => out.extend_from_slice(&b),
                None => {
                    put_len(out, uid.len());
                    out.extend_from_slice(uid.as_bytes());
                }
            }
            labels_at = out.len() - start;
            fields_at = labels_at;
            let mut put = |s: &str| {
                put_len(out, s.len());
                out.extend_from_slice(s.as_bytes());
                out.len() - start
            };
            for (k, v) in &labels {
                put(k);
                fields_at = put(v);
            }
            for (k, v) in &fields {
                put(k);
                put(v);
            }
        });
        Header {
            key,
            rv,
            ns_len: if namespace.is_empty() { 0 } else { namespace.len() as u32 },
            labels_at: labels_at as u32,
            fields_at: fields_at as u32,
            uid_bytes: uuid.is_some(),
        }
    }

    fn packed(&self) -> &[u8] {
        self.key.tail()
    }

    /// `metadata.namespace` (empty for cluster-scoped objects).
    pub fn namespace(&self) -> &str {
        self.key_text(..self.ns_len as usize)
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        let after = if self.ns_len == 0 { 0 } else { self.ns_len as usize + 1 };
        self.key_text(after..)
    }

    /// Part of the key as text: only those bytes checked (the key is UTF-8, made from `&str`).
    fn key_text(&self, part: impl std::slice::SliceIndex<[u8], Output = [u8]>) -> &str {
        self.key.as_bytes().get(part).and_then(|b| std::str::from_utf8(b).ok()).unwrap_or_default()
    }

    /// `metadata.uid` (empty when absent): what a `shardSelector` by uid hashes.
    pub fn uid(&self) -> Uid<'_> {
        let at = &self.packed()[..self.labels_at as usize];
        match <[u8; 16]>::try_from(at) {
            Ok(b) if self.uid_bytes => Uid::Canonical(uuid_text(&b)),
            _ => Uid::Text(Strings(at).next().unwrap_or("")),
        }
    }

    /// `metadata.labels`.
    pub fn labels(&self) -> Pairs<'_> {
        Pairs(&self.packed()[self.labels_at as usize..self.fields_at as usize])
    }

    /// Selectable field values (docs/apiserver-watch-cache.md §7.2), only the ones this
    /// resource supports; `metadata.name` / `metadata.namespace` are not repeated here.
    pub fn fields(&self) -> Pairs<'_> {
        Pairs(&self.packed()[self.fields_at as usize..])
    }

    /// Whether the two have the same key, uid, labels and fields. The key's own equality is the
    /// key's alone: its tail (the packed strings) and how it is read are compared here too.
    fn same_strings(&self, other: &Header) -> bool {
        self.key.whole() == other.key.whole()
            && (self.ns_len, self.labels_at, self.fields_at, self.uid_bytes)
                == (other.ns_len, other.labels_at, other.fields_at, other.uid_bytes)
    }

    /// Takes `prev`'s key allocation when it holds the same key and strings (uid, labels,
    /// fields) as this header's: two versions of an object then share one. Returns whether it
    /// did.
    pub fn share_key(&mut self, prev: &Header) -> bool {
        let same = self.same_strings(prev);
        if same {
            self.key = prev.key.clone();
        }
        same
    }

    /// Heap bytes the header keeps besides its struct (the key's allocation, which holds the
    /// packed strings too).
    pub fn heap_bytes(&self) -> usize {
        self.key.heap_bytes()
    }
}

impl PartialEq for Header {
    fn eq(&self, other: &Self) -> bool {
        self.rv == other.rv && self.same_strings(other)
    }
}

impl Eq for Header {}

/// An object's uid as [`Header::uid`] reads it back: text kept as it came, or a canonical UUID
/// kept as 16 bytes and written out again.
#[derive(Clone, Copy)]
pub enum Uid<'a> {
    Text(&'a str),
    Canonical([u8; 36]),
}

impl Uid<'_> {
    pub fn as_str(&self) -> &str {
        match self {
            Uid::Text(s) => s,
            // Lowercase hex digits and hyphens (`uuid_text`): always UTF-8.
            Uid::Canonical(b) => std::str::from_utf8(b).unwrap_or_default(),
        }
    }
}

impl Deref for Uid<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq<&str> for Uid<'_> {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Debug for Uid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Where a canonical UUID's hyphens are (8-4-4-4-12).
const HYPHENS: [usize; 4] = [8, 13, 18, 23];

/// The 16 bytes of a UUID written as the apiserver writes uids (36 characters, lowercase hex,
/// hyphens at 8-4-4-4-12), so that [`uuid_text`] gives the same text back; `None` for any
/// other text, which is then kept as it is.
fn uuid_bytes(uid: &str) -> Option<[u8; 16]> {
    let s = uid.as_bytes();
    if s.len() != 36 || HYPHENS.iter().any(|&i| s[i] != b'-') {
        return None;
    }
    let mut digits = s.iter().enumerate().filter(|(i, _)| !HYPHENS.contains(i)).map(|(_, &c)| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    });
    let mut out = [0u8; 16];
    for byte in &mut out {
        *byte = (digits.next()?? << 4) | digits.next()??;
    }
    Some(out)
}

/// The text of a UUID kept by [`uuid_bytes`].
fn uuid_text(b: &[u8; 16]) -> [u8; 36] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut nibbles = b.iter().flat_map(|byte| [byte >> 4, byte & 0xf]);
    let mut out = [b'-'; 36];
    for (i, c) in out.iter_mut().enumerate() {
        if !HYPHENS.contains(&i) {
            *c = HEX[usize::from(nibbles.next().unwrap_or(0))];
        }
    }
    out
}

/// Length-prefixed strings, read in order.
#[derive(Clone)]
struct Strings<'a>(&'a [u8]);

impl<'a> Iterator for Strings<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        // Written from `&str` by `Header::new`: always UTF-8.
        self.next_bytes().and_then(|s| std::str::from_utf8(s).ok())
    }
}

impl<'a> Strings<'a> {
    fn next_bytes(&mut self) -> Option<&'a [u8]> {
        let (n, i) = read_len(self.0)?;
        let s = self.0.get(i..i + n)?;
        self.0 = &self.0[i + n..];
        Some(s)
    }
}

/// Key/value pairs of a [`Header`] (labels or fields), sorted by key.
#[derive(Clone, Copy)]
pub struct Pairs<'a>(&'a [u8]);

impl<'a> Pairs<'a> {
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        let mut s = Strings(self.0);
        std::iter::from_fn(move || Some((s.next()?, s.next()?)))
    }

    /// The value of `key`: the keys compared as bytes, in order until one is past it, and
    /// only the value found read as text (a pod's node is looked up per event and watcher).
    pub fn get(&self, key: &str) -> Option<&'a str> {
        let mut s = Strings(self.0);
        loop {
            let (k, v) = (s.next_bytes()?, s.next_bytes()?);
            match k.cmp(key.as_bytes()) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => return std::str::from_utf8(v).ok(),
                std::cmp::Ordering::Greater => return None,
            }
        }
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.iter().count()
    }
}

impl std::fmt::Debug for Pairs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_back_what_it_was_made_of() {
        let long = "v".repeat(300);
        let h = Header::new(
            "ns-1",
            "pod/with-slash",
            Rv(7),
            "0b4c-uid",
            [("b", "2"), ("a", "1"), ("long", long.as_str()), ("a", "again"), ("", "")],
            [("spec.nodeName", "node-1"), ("status.phase", "")],
        );
        assert_eq!(h.key.as_str(), "ns-1/pod/with-slash");
        assert_eq!((h.namespace(), h.name(), h.uid().as_str()), ("ns-1", "pod/with-slash", "0b4c-uid"));
        let labels: Vec<_> = h.labels().iter().collect();
        assert_eq!(labels, vec![("", ""), ("a", "again"), ("b", "2"), ("long", long.as_str())]);
        assert_eq!(h.labels().get("long"), Some(long.as_str()));
        assert_eq!(h.labels().get("c"), None);
        assert!(h.labels().contains_key(""));
        assert_eq!(h.labels().len(), 4);
        assert_eq!(h.fields().get("spec.nodeName"), Some("node-1"));
        assert_eq!(h.fields().get("status.phase"), Some(""));
        assert_eq!(h.fields().get("a"), None);
    }

    #[test]
    fn a_cluster_scoped_object_without_uid_labels_or_fields() {
        let none: [(&str, &str); 0] = [];
        let h = Header::new("", "node-0", Rv(1), "", none, none);
        assert_eq!((h.namespace(), h.name(), h.uid().as_str()), ("", "node-0", ""));
        assert!(h.labels().is_empty() && h.fields().is_empty());
        assert_eq!(h.labels().iter().count(), 0);
        // The key's length, the key, the empty uid's length; nothing else.
        assert_eq!(h.heap_bytes(), 16 + 1 + "node-0".len() + 1);
    }

    #[test]
    fn a_canonical_uid_is_kept_as_16_bytes_and_read_back_as_it_came() {
        let canonical = "6a3f5e3c-93a1-4a7e-9f0e-2b7d0c1e4f55";
        let none: [(&str, &str); 0] = [];
        let h = Header::new("ns", "p", Rv(1), canonical, [("app", "a")], none);
        assert!(matches!(h.uid(), Uid::Canonical(_)));
        assert_eq!(h.uid(), canonical);
        assert_eq!(h.labels().get("app"), Some("a"));
        // Counts, the key (length and text), the uid, the label ("app", "a") with their lengths.
        assert_eq!(h.heap_bytes(), 16 + (1 + 4) + 16 + (1 + 3) + (1 + 1));
        for (i, c) in ["00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"]
            .iter()
            .enumerate()
        {
            let h = Header::new("", &format!("n{i}"), Rv(1), c, none, none);
            assert!(matches!(h.uid(), Uid::Canonical(_)));
            assert_eq!(h.uid(), *c);
        }
        // Anything else is kept as text, exactly.
        for other in [
            "6A3F5E3C-93A1-4A7E-9F0E-2B7D0C1E4F55",
            "6a3f5e3c93a14a7e9f0e2b7d0c1e4f55",
            "6a3f5e3c-93a1-4a7e-9f0e-2b7d0c1e4f5g",
            "6a3f5e3c-93a1-4a7e-9f0e-2b7d0c1e4f5-",
            "6a3f5e3c093a1-4a7e-9f0e-2b7d0c1e4f5",
            "6a3f5e3c-93a1-4a7e-9f0e-2b7d0c1e4f55 ",
            "0123456789abcde",
            "é3f5e3c-93a1-4a7e-9f0e-2b7d0c1e4f55",
            "",
        ] {
            let h = Header::new("ns", "p", Rv(1), other, [("k", "v")], [("spec.nodeName", "n")]);
            assert!(matches!(h.uid(), Uid::Text(_)), "{other}");
            assert_eq!(h.uid(), other);
            assert_eq!(h.labels().get("k"), Some("v"), "{other}");
            assert_eq!(h.fields().get("spec.nodeName"), Some("n"), "{other}");
        }
    }

    #[test]
    fn headers_differing_only_in_their_packed_strings_are_not_equal() {
        let none: [(&str, &str); 0] = [];
        let a = Header::new("ns", "p", Rv(1), "u", [("k", "v")], none);
        let b = Header::new("ns", "p", Rv(1), "u", [("k", "w")], none);
        assert_eq!(a.key, b.key);
        assert_ne!(a, b);
        assert_eq!(a, a.clone());
        assert_ne!(a, Header::new("ns", "p", Rv(1), "v", [("k", "v")], none));
    }

    #[test]
    fn a_version_takes_the_key_of_the_one_before_only_when_its_strings_are_the_same() {
        let none: [(&str, &str); 0] = [];
        let uid = "6a3f5e3c-93a1-4a7e-9f0e-2b7d0c1e4f55";
        let v1 = Header::new("ns", "p", Rv(1), uid, [("app", "a")], [("spec.nodeName", "n1")]);
        let mut v2 = Header::new("ns", "p", Rv(2), uid, [("app", "a")], [("spec.nodeName", "n1")]);
        assert_ne!(v1.key.whole().as_ptr(), v2.key.whole().as_ptr());
        assert!(v2.share_key(&v1));
        assert_eq!(v1.key.whole().as_ptr(), v2.key.whole().as_ptr(), "one allocation for both");
        assert_eq!((v2.rv, v2.labels().get("app"), v2.uid().as_str()), (Rv(2), Some("a"), uid));
        for mut other in [
            Header::new("ns", "p", Rv(3), uid, [("app", "b")], [("spec.nodeName", "n1")]),
            Header::new("ns", "p", Rv(3), uid, [("app", "a")], [("spec.nodeName", "n2")]),
            Header::new("ns", "p", Rv(3), "another", [("app", "a")], [("spec.nodeName", "n1")]),
            Header::new("ns", "q", Rv(3), uid, [("app", "a")], [("spec.nodeName", "n1")]),
        ] {
            let own = other.key.whole().as_ptr();
            assert!(!other.share_key(&v1));
            assert_eq!(other.key.whole().as_ptr(), own);
        }
        // The same bytes read as a 16-byte uid in one and as a 15-character uid in the other:
        // not the same strings.
        let text: String = (0..15).map(|i| char::from(b'a' + i)).collect();
        let bytes = uuid_text(&std::array::from_fn(|i| if i == 0 { 15 } else { b'a' + i as u8 - 1 }));
        let raw = Header::new("", "n", Rv(1), std::str::from_utf8(&bytes).unwrap(), none, none);
        let mut plain = Header::new("", "n", Rv(2), &text, none, none);
        assert_eq!(raw.key.whole(), plain.key.whole());
        assert!(!plain.share_key(&raw));
        assert_eq!(plain.uid().as_str(), text);
    }

    /// Uids near the canonical form (hex digits, hyphens, other characters at any place) and
    /// any text.
    fn uids() -> impl Strategy<Value = String> {
        prop_oneof![
            "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "[0-9a-fA-F-]{34,38}",
            "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-gA-G-]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            ".{0,40}",
        ]
    }

    fn pairs() -> impl Strategy<Value = Vec<(String, String)>> {
        proptest::collection::vec((".{0,12}", prop_oneof![".{0,8}", ".{120,140}"]), 0..6)
    }

    proptest! {
        #[test]
        fn a_header_reads_back_exactly_what_it_was_made_of(
            namespace in "[a-z0-9-]{0,12}",
            name in prop_oneof![".{1,20}", ".{120,300}"],
            rv in 1u64..u64::MAX,
            uid in uids(),
            labels in pairs(),
            fields in pairs(),
            probes in proptest::collection::vec(".{0,12}", 0..4),
        ) {
            let h = Header::new(
                &namespace,
                &name,
                Rv(rv),
                &uid,
                labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                fields.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            );
            let map = |ps: &[(String, String)]| -> BTreeMap<String, String> { ps.iter().cloned().collect() };
            let back = |p: Pairs<'_>| -> BTreeMap<String, String> {
                p.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
            };
            prop_assert_eq!((h.namespace(), h.name(), h.rv), (namespace.as_str(), name.as_str(), Rv(rv)));
            let read = h.uid();
            prop_assert_eq!(read.as_str(), uid.as_str());
            prop_assert_eq!(back(h.labels()), map(&labels));
            prop_assert_eq!(back(h.fields()), map(&fields));
            // `get` finds every key (and no other) as the map does: present keys, the other
            // set's, arbitrary ones.
            for (p, want) in [(h.labels(), map(&labels)), (h.fields(), map(&fields))] {
                let keys = labels.iter().chain(&fields).map(|(k, _)| k).chain(&probes);
                for k in keys {
                    prop_assert_eq!(p.get(k), want.get(k).map(String::as_str), "key {:?}", k);
                }
            }
            prop_assert_eq!(&h.key, &ObjectKey::new(&namespace, &name));
            prop_assert_eq!(h.key.as_str().len(), name.len() + if namespace.is_empty() { 0 } else { namespace.len() + 1 });
        }
    }
}
