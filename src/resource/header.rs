//! [`Header`]: the parsed part of a cached object (key, resourceVersion, uid, labels,
//! selectable fields), kept compact because every cached object carries one: the key is the
//! store's own `Arc<str>` (namespace and name are read out of it), and the uid, labels and
//! field values are length-prefixed strings in one allocation, read in place.
//!
//! Called by `resource` (`Object::parse` makes one), `selector` (label, field and shard
//! selectors read it), `cache` (filters, watcher indexes) and `consistency`.

use std::collections::BTreeMap;

use super::{ObjectKey, Rv};

/// The parsed part of an object: enough to key, version, select and index it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub key: ObjectKey,
    pub rv: Rv,
    /// Bytes of `key` that are the namespace (0: cluster-scoped, `key` is the name).
    ns_len: u32,
    /// Labels in `packed` start here, then fields at `fields_at`.
    labels_at: u32,
    fields_at: u32,
    /// The uid, then each label's key and value (sorted by key), then each field's name and
    /// value (sorted by name), every string as a LEB128 length and its UTF-8 bytes.
    packed: Box<[u8]>,
}

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
        let strings = std::iter::once(uid)
            .chain(labels.iter().flat_map(|(k, v)| [*k, *v]))
            .chain(fields.iter().flat_map(|(k, v)| [*k, *v]));
        let mut packed = Vec::with_capacity(strings.clone().map(|s| s.len() + 2).sum());
        let mut put = |s: &str| {
            let mut n = s.len();
            while n >= 0x80 {
                packed.push((n as u8) | 0x80);
                n >>= 7;
            }
            packed.push(n as u8);
            packed.extend_from_slice(s.as_bytes());
            packed.len()
        };
        let labels_at = put(uid);
        let mut fields_at = labels_at;
        for (k, v) in &labels {
            put(k);
            fields_at = put(v);
        }
        for (k, v) in &fields {
            put(k);
            put(v);
        }
        Header {
            key: ObjectKey::new(namespace, name),
            rv,
            ns_len: if namespace.is_empty() { 0 } else { namespace.len() as u32 },
            labels_at: labels_at as u32,
            fields_at: fields_at as u32,
            packed: packed.into_boxed_slice(),
        }
    }

    /// `metadata.namespace` (empty for cluster-scoped objects).
    pub fn namespace(&self) -> &str {
        &self.key.as_str()[..self.ns_len as usize]
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        let key = self.key.as_str();
        if self.ns_len == 0 {
            key
        } else {
            &key[self.ns_len as usize + 1..]
        }
    }

    /// `metadata.uid` (empty when absent): what a `shardSelector` by uid hashes.
    pub fn uid(&self) -> &str {
        Strings(&self.packed[..self.labels_at as usize]).next().unwrap_or("")
    }

    /// `metadata.labels`.
    pub fn labels(&self) -> Pairs<'_> {
        Pairs(&self.packed[self.labels_at as usize..self.fields_at as usize])
    }

    /// Selectable field values (docs/apiserver-watch-cache.md §7.2), only the ones this
    /// resource supports; `metadata.name` / `metadata.namespace` are not repeated here.
    pub fn fields(&self) -> Pairs<'_> {
        Pairs(&self.packed[self.fields_at as usize..])
    }

    /// Heap bytes the header keeps besides its struct (the key's string and the packed ones).
    pub fn heap_bytes(&self) -> usize {
        self.key.as_str().len() + 16 + self.packed.len()
    }
}

/// Length-prefixed strings, read in order.
#[derive(Clone)]
struct Strings<'a>(&'a [u8]);

impl<'a> Iterator for Strings<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let (mut n, mut shift, mut i) = (0usize, 0, 0);
        loop {
            let b = *self.0.get(i)?;
            n |= usize::from(b & 0x7f) << shift;
            i += 1;
            if b < 0x80 {
                break;
            }
            shift += 7;
        }
        let s = self.0.get(i..i + n)?;
        self.0 = &self.0[i + n..];
        // Written from `&str` by `Header::new`: always UTF-8.
        std::str::from_utf8(s).ok()
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

    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
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
        assert_eq!((h.namespace(), h.name(), h.uid()), ("ns-1", "pod/with-slash", "0b4c-uid"));
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
        assert_eq!((h.namespace(), h.name(), h.uid()), ("", "node-0", ""));
        assert!(h.labels().is_empty() && h.fields().is_empty());
        assert_eq!(h.labels().iter().count(), 0);
        // The empty uid is one byte (its length); nothing else.
        assert_eq!(h.heap_bytes(), "node-0".len() + 16 + 1);
    }
}
