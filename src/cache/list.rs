//! LIST bodies assembled from a snapshot: the stored bytes of each selected object between a
//! list envelope that matches the apiserver's encoding (docs/apiserver-watch-cache.md §9), with pagination
//! (`limit`, continue tokens in the apiserver's format, `remainingItemCount`, §6.2).
//!
//! Metadata-only lists (`Filter::repr`) are PartialObjectMetadataList envelopes around each
//! object's PartialObjectMetadata, made once per object version (`metadata_only`).
//!
//! A sharded LIST (`Filter::shard`) selects only the objects in the shard and echoes the
//! selector in `metadata.shardInfo` where a 1.36 apiserver does: on built-in kinds' lists in
//! JSON and protobuf, not on metadata-only lists (`asPartialObjectMetadataList` copies only
//! resourceVersion, continue and remainingItemCount) nor on custom resources' (an
//! `UnstructuredList` has no `SetShardInfo`).
//!
//! Pure. Called through `Reader::list` by `server::serve`. Objects are never decoded or
//! re-encoded: the body is the concatenation of their bytes.

use std::ops::Bound;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use super::{Filter, Snapshot};
use crate::metadata_only::{self, Repr};
use crate::params::ContinueToken;
use crate::proto::{self, envelope};
use crate::resource::{Object, ObjectKey, ResourceKind, Rv};

/// Pagination of one LIST request.
#[derive(Clone, Debug)]
pub struct Page {
    pub limit: usize,
    /// Start key relative to the request's prefix (from a continue token), inclusive.
    pub start: Option<String>,
    /// The RV written into the next continue token.
    pub token_rv: i64,
}

/// Small objects are coalesced into buffers of about this size (one copy, far fewer frames).
const CHUNK: usize = 64 * 1024;

/// A rendered list: the envelope around the selected objects, streamed lazily in chunks of
/// about `CHUNK` bytes (one copy into a buffer that the allocator recycles as soon as the chunk
/// is written, so a large LIST never holds a second copy of itself).
#[derive(Debug)]
pub struct ListBody {
    head: Bytes,
    objects: Vec<Arc<Object>>,
    tail: Bytes,
    repr: Repr,
    /// Number of items.
    pub items: usize,
    /// Objects examined to select them (the apiserver's "fetched" objects).
    pub fetched: usize,
    /// Total body length (for `Content-Length`).
    pub len: usize,
    pub continue_token: Option<String>,
    /// `metadata.remainingItemCount`, when set.
    pub remaining: Option<usize>,
}

impl ListBody {
    /// (namespace, name, resourceVersion) of each item, in order.
    pub fn versions(&self) -> impl Iterator<Item = (&str, &str, Rv)> {
        self.objects.iter().map(|o| (o.header.namespace(), o.header.name(), o.header.rv))
    }

    /// The body as a sequence of chunks, produced on demand.
    pub fn into_chunks(self) -> ListChunks {
        ListChunks {
            head: Some(self.head),
            objects: self.objects.into_iter(),
            repr: self.repr,
            first: true,
            tail: Some(self.tail),
            pending: None,
        }
    }

    /// The whole body in one buffer (tests, small lists).
    pub fn to_vec(self) -> Vec<u8> {
        self.into_chunks().flat_map(|c| c.to_vec()).collect()
    }
}

/// Iterator over the chunks of a `ListBody`.
#[derive(Debug)]
pub struct ListChunks {
    head: Option<Bytes>,
    objects: std::vec::IntoIter<Arc<Object>>,
    repr: Repr,
    first: bool,
    tail: Option<Bytes>,
    /// A large object's bytes to send as their own chunk after the current buffer.
    pending: Option<Bytes>,
}

impl Iterator for ListChunks {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if let Some(p) = self.pending.take() {
            return Some(p);
        }
        // Room for a full chunk plus the largest object that is copied (< CHUNK / 2).
        let mut buf = BytesMut::with_capacity(CHUNK + CHUNK / 2);
        if let Some(h) = self.head.take() {
            buf.put_slice(&h);
        }
        for obj in self.objects.by_ref() {
            if !self.first && !self.repr.is_proto() {
                buf.put_u8(b',');
            }
            self.first = false;
            if self.repr.is_proto() {
                // Made (and checked) by `render`: always there. Its parts (some shared with the
                // stored JSON) are copied once, into this chunk.
                let Some(msg) = obj.proto_message_as(self.repr) else { continue };
                // The `items` key and length, written in place (no buffer per item).
                buf.put_u8(0x12);
                proto::wire::put_varint(&mut buf, msg.len() as u64);
                msg.parts().iter().for_each(|p| buf.put_slice(p));
                if buf.len() >= CHUNK - 4096 {
                    return Some(buf.freeze());
                }
                continue;
            }
            // Always there in JSON.
            let Some((a, b)) = obj.item_parts_as(self.repr) else { continue };
            if b.len() >= CHUNK / 2 {
                // A big object goes out as it is stored, without a copy.
                buf.put_slice(a);
                self.pending = Some(b.clone());
                return Some(buf.freeze());
            }
            buf.put_slice(a);
            buf.put_slice(b);
            if buf.len() >= CHUNK - 4096 {
                return Some(buf.freeze());
            }
        }
        if let Some(t) = self.tail.take() {
            buf.put_slice(&t);
        }
        (!buf.is_empty()).then(|| buf.freeze())
    }
}

/// The LIST body of `snap` for `filter` and `page`; `None` when the representation is protobuf
/// and an item has no exact protobuf encoding (the request then goes upstream).
pub fn render(kind: &ResourceKind, snap: &Snapshot, filter: &Filter, page: Option<Page>) -> Option<ListBody> {
    // The key prefix of the request: `ns/` for a namespaced request, nothing cluster-wide.
    let prefix = match (&filter.namespace, kind.namespaced) {
        (Some(ns), true) => format!("{ns}/"),
        _ => String::new(),
    };
    let lower = match page.as_ref().and_then(|p| p.start.as_deref()) {
        Some(start) => Bound::Included(ObjectKey::from(format!("{prefix}{start}"))),
        None if prefix.is_empty() => Bound::Unbounded,
        None => Bound::Included(ObjectKey::of(&prefix)),
    };
    let upper = if prefix.is_empty() {
        Bound::Unbounded
    } else {
        // `ns/` … `ns0`: '0' is the byte after '/'.
        Bound::Excluded(ObjectKey::from(format!("{}0", &prefix[..prefix.len() - 1])))
    };
    let limit = page.as_ref().map(|p| p.limit).unwrap_or(usize::MAX);
    // A shard selector makes the apiserver's predicate non-empty too.
    let selective = !filter.labels.is_empty() || !filter.fields.is_empty() || filter.shard.is_some();

    // As the cacher's paginated list (staging/src/k8s.io/apiserver/pkg/storage/cacher,
    // `GetList`): stop at the `limit`-th selected item; `hasMore` is whether any item of the
    // range, selected or not, follows it (so a page may be followed by an empty one), and
    // `remainingItemCount` (`storage.PrepareContinueToken`) is the number of those items, only
    // without a label or field selector.
    let mut items = Vec::new();
    // JSON items' bytes, counted as they are selected (each object is touched once here).
    let mut items_len = 0;
    let json = !filter.repr.is_proto();
    let mut last_key: Option<&ObjectKey> = None;
    let mut iter = snap.store.range((lower, upper));
    let mut has_more = false;
    let mut fetched = 0usize;
    // A pods list by node read from the apiserver's `spec.nodeName` index: only that node's
    // pods follow the page (1.36 `listLatestRV`), so a page is continued only if one of them
    // comes after it.
    let on_node = |o: &Object, node: &str| o.header.fields().get("spec.nodeName").unwrap_or("") == node;
    let index_node = (filter.node_index && kind.group.is_empty() && kind.resource == "pods")
        .then(|| filter.fields.exact("spec.nodeName"))
        .flatten();
    for (k, obj) in iter.by_ref() {
        if items.len() == limit {
            has_more = match index_node {
                Some(node) => on_node(obj, node) || iter.by_ref().any(|(_, o)| on_node(o, node)),
                None => true,
            };
            fetched += 1;
            break;
        }
        fetched += 1;
        if filter.matches(obj) {
            if json {
                items_len += obj.item_len_as(filter.repr);
            }
            items.push(obj.clone());
            last_key = Some(k);
        }
    }
    // `metadata.name=X` on a namespace (or a cluster-scoped kind), without a continue token,
    // is a read of that single key (the registry's `MatchesSingle`): never a continuation.
    let single_key = filter.name.is_some()
        && page.as_ref().is_none_or(|p| p.start.is_none())
        && (filter.namespace.is_some() || !kind.namespaced);
    has_more &= !single_key;
    let mut remaining = None;
    if has_more && !selective {
        remaining = Some(1 + iter.count());
    }
    let continue_token = match (has_more, last_key, &page) {
        (true, Some(k), Some(p)) => {
            Some(ContinueToken::after(p.token_rv, &k.as_str()[prefix.len()..]).encode())
        }
        _ => None,
    };

    let rv = snap.rv;
    let repr = filter.repr;
    let shard_info = shard_info(kind, filter);
    let shard_info = shard_info.as_deref();
    let (head, tail) = match repr.keeping_managed_fields() {
        Repr::Full => (
            envelope_head(kind, rv, continue_token.as_deref(), remaining, shard_info),
            envelope_tail(kind, rv, continue_token.as_deref(), remaining),
        ),
        Repr::Metadata => metadata_envelope(rv, continue_token.as_deref(), remaining, items.is_empty()),
        _ => {
            for o in &items {
                let msg = o.proto_message_as(repr)?;
                items_len += envelope::item_prefix_len(msg.len()) + msg.len();
            }
            let meta = ListMeta { rv, cont: continue_token.as_deref(), remaining, shard: shard_info };
            proto_envelope(kind, repr, &meta, items_len)
        }
    };
    let (head, tail) = (Bytes::from(head), Bytes::from(tail));
    let separators = if repr.is_proto() { 0 } else { items.len().saturating_sub(1) };
    let len = head.len() + tail.len() + items_len + separators;
    Some(ListBody {
        head,
        items: items.len(),
        fetched,
        objects: items,
        tail,
        repr,
        len,
        continue_token,
        remaining,
    })
}

/// `metadata.shardInfo.selector` of a sharded list, where the apiserver sets it (module doc).
fn shard_info(kind: &ResourceKind, filter: &Filter) -> Option<String> {
    let shard = filter.shard.as_ref()?;
    (kind.builtin && !filter.repr.is_metadata()).then(|| shard.to_string())
}

/// A list's ListMeta members.
struct ListMeta<'a> {
    rv: Rv,
    cont: Option<&'a str>,
    remaining: Option<usize>,
    shard: Option<&'a str>,
}

/// A protobuf list's envelope (`envelope::list_head_sharded`) and tail.
fn proto_envelope(kind: &ResourceKind, repr: Repr, m: &ListMeta<'_>, items_len: usize) -> (Vec<u8>, Vec<u8>) {
    let type_meta = proto::list_type_meta(&kind.api_version(), &kind.list_kind(), repr.is_metadata());
    (
        envelope::list_head_sharded(&type_meta, &m.rv.to_string(), m.cont, m.remaining, m.shard, items_len),
        envelope::UNKNOWN_TAIL.to_vec(),
    )
}

/// A PartialObjectMetadataList's envelope (the same for every kind): typed ListMeta, and
/// `"items":null` when there is no item, as the apiserver encodes it.
fn metadata_envelope(
    rv: Rv,
    cont: Option<&str>,
    remaining: Option<usize>,
    empty: bool,
) -> (Vec<u8>, Vec<u8>) {
    let meta = typed_meta(rv, cont, remaining, None);
    if empty {
        (format!("{}{meta}{}", metadata_only::LIST_HEAD, metadata_only::EMPTY_ITEMS).into_bytes(), Vec::new())
    } else {
        (format!("{}{meta},\"items\":[", metadata_only::LIST_HEAD).into_bytes(), b"]}\n".to_vec())
    }
}

/// `{"kind":"PodList","apiVersion":"v1","metadata":{…},"items":[` for built-ins;
/// `{"apiVersion":"g/v","items":[` for custom resources (unstructured lists sort their keys).
fn envelope_head(
    kind: &ResourceKind,
    rv: Rv,
    cont: Option<&str>,
    remaining: Option<usize>,
    shard: Option<&str>,
) -> Vec<u8> {
    if kind.builtin {
        format!(
            "{{\"kind\":{},\"apiVersion\":{},\"metadata\":{},\"items\":[",
            json_str(&kind.list_kind()),
            json_str(&kind.api_version()),
            typed_meta(rv, cont, remaining, shard)
        )
        .into_bytes()
    } else {
        format!("{{\"apiVersion\":{},\"items\":[", json_str(&kind.api_version())).into_bytes()
    }
}

fn envelope_tail(kind: &ResourceKind, rv: Rv, cont: Option<&str>, remaining: Option<usize>) -> Vec<u8> {
    if kind.builtin {
        b"]}\n".to_vec()
    } else {
        // Unstructured list metadata always carries `continue` (empty when there is no next page).
        let mut meta = format!("{{\"continue\":{}", json_str(cont.unwrap_or("")));
        if let Some(n) = remaining {
            meta.push_str(&format!(",\"remainingItemCount\":{n}"));
        }
        meta.push_str(&format!(",\"resourceVersion\":\"{rv}\"}}"));
        format!("],\"kind\":{},\"metadata\":{}}}\n", json_str(&kind.list_kind()), meta).into_bytes()
    }
}

/// Typed `ListMeta` in Go's member order: resourceVersion, continue, remainingItemCount,
/// shardInfo.
fn typed_meta(rv: Rv, cont: Option<&str>, remaining: Option<usize>, shard: Option<&str>) -> String {
    let mut m = format!("{{\"resourceVersion\":\"{rv}\"");
    if let Some(c) = cont {
        m.push_str(&format!(",\"continue\":{}", json_str(c)));
    }
    if let Some(n) = remaining {
        m.push_str(&format!(",\"remainingItemCount\":{n}"));
    }
    if let Some(s) = shard {
        m.push_str(&format!(",\"shardInfo\":{{\"selector\":{}}}", json_str(s)));
    }
    m.push('}');
    m
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

#[cfg(test)]
mod tests;
