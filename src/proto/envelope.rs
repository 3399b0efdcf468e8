//! The frames around protobuf messages, as the apiserver's protobuf serializer writes them
//! (`k8s.io/apimachinery/pkg/runtime/serializer/protobuf`): the `k8s\0` magic and a
//! `runtime.Unknown` {TypeMeta, raw, contentEncoding "", contentType ""} for objects and lists;
//! 4-byte big-endian length-prefixed `meta/v1 WatchEvent`s {type, RawExtension{raw}} for watch
//! streams, whose raw is the object's own enveloped encoding.
//!
//! Pure; `proto` re-exports it for `resource`, `cache` and the server.

use bytes::{BufMut, Bytes, BytesMut};

use super::wire;

/// What precedes every protobuf object the apiserver sends.
pub const MAGIC: &[u8] = b"k8s\0";
/// `runtime.Unknown`'s contentEncoding and contentType, both empty, after its raw.
pub const UNKNOWN_TAIL: &[u8] = &[0x1a, 0, 0x22, 0];

/// `runtime.TypeMeta` {apiVersion, kind}.
pub fn type_meta(api_version: &str, kind: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(api_version.len() + kind.len() + 4);
    wire::len_field(&mut out, 1, api_version.as_bytes());
    wire::len_field(&mut out, 2, kind.as_bytes());
    out
}

/// The envelope up to a raw of `raw_len` bytes: magic, TypeMeta, raw's key and length.
pub fn head(type_meta: &[u8], raw_len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(head_len(type_meta, raw_len));
    put_head(&mut out, type_meta, raw_len);
    out
}

/// [`head`] appended to `out`.
fn put_head(out: &mut Vec<u8>, type_meta: &[u8], raw_len: usize) {
    out.extend_from_slice(MAGIC);
    wire::len_field(out, 1, type_meta);
    wire::tag(out, 2, wire::LEN);
    wire::varint(out, raw_len as u64);
}

/// The length of [`head`] (both keys are one byte).
fn head_len(type_meta: &[u8], raw_len: usize) -> usize {
    MAGIC.len()
        + 1
        + wire::varint_len(type_meta.len() as u64)
        + type_meta.len()
        + 1
        + wire::varint_len(raw_len as u64)
}

/// A whole enveloped object in one buffer.
pub fn object(type_meta: &[u8], msg: &[u8]) -> Bytes {
    let head = head(type_meta, msg.len());
    let mut out = BytesMut::with_capacity(head.len() + msg.len() + UNKNOWN_TAIL.len());
    out.put_slice(&head);
    out.put_slice(msg);
    out.put_slice(UNKNOWN_TAIL);
    out.freeze()
}

/// `meta/v1 ListMeta` {selfLink "", resourceVersion, continue, remainingItemCount when set}.
pub fn list_meta(rv: &str, cont: Option<&str>, remaining: Option<usize>) -> Vec<u8> {
    list_meta_sharded(rv, cont, remaining, None)
}

/// [`list_meta`] with `shardInfo` (field 5, `ShardInfo{selector = 1}`, 1.36) when set.
pub fn list_meta_sharded(
    rv: &str,
    cont: Option<&str>,
    remaining: Option<usize>,
    shard: Option<&str>,
) -> Vec<u8> {
    let mut out = Vec::new();
    wire::len_field(&mut out, 1, b"");
    wire::len_field(&mut out, 2, rv.as_bytes());
    wire::len_field(&mut out, 3, cont.unwrap_or("").as_bytes());
    if let Some(n) = remaining {
        wire::varint_field(&mut out, 4, n as u64);
    }
    if let Some(s) = shard {
        let mut info = Vec::with_capacity(s.len() + 4);
        wire::len_field(&mut info, 1, s.as_bytes());
        wire::len_field(&mut out, 5, &info);
    }
    out
}

/// A protobuf list's envelope up to its items: `k8s\0`, Unknown{`type_meta` (the list kind, or
/// PartialObjectMetadataList), raw: the list message}, whose ListMeta (field 1) precedes the
/// items (field 2, `items_len` bytes with their keys). [`UNKNOWN_TAIL`] follows the items.
pub fn list_head(
    type_meta: &[u8],
    rv: &str,
    cont: Option<&str>,
    remaining: Option<usize>,
    items_len: usize,
) -> Vec<u8> {
    list_head_sharded(type_meta, rv, cont, remaining, None, items_len)
}

/// [`list_head`] whose ListMeta carries `shardInfo` when `shard` is set.
pub fn list_head_sharded(
    type_meta: &[u8],
    rv: &str,
    cont: Option<&str>,
    remaining: Option<usize>,
    shard: Option<&str>,
    items_len: usize,
) -> Vec<u8> {
    let list_meta = list_meta_sharded(rv, cont, remaining, shard);
    let mut meta_field = Vec::with_capacity(list_meta.len() + 4);
    wire::len_field(&mut meta_field, 1, &list_meta);
    let mut out = head(type_meta, meta_field.len() + items_len);
    out.extend_from_slice(&meta_field);
    out
}

/// The key and length that precede one list item (`items`, field 2 of every list).
pub fn item_prefix(len: usize) -> Bytes {
    let mut out = Vec::with_capacity(6);
    wire::tag(&mut out, 2, wire::LEN);
    wire::varint(&mut out, len as u64);
    Bytes::from(out)
}

/// The length of [`item_prefix`] for an item of `len` bytes.
pub fn item_prefix_len(len: usize) -> usize {
    1 + wire::varint_len(len as u64)
}

/// One watch stream frame: the length, then WatchEvent {type, object: RawExtension{raw:
/// `object` (an enveloped object, possibly in parts)}}.
pub fn watch_event(event_type: &str, object: &[&[u8]]) -> Bytes {
    let obj_len: usize = object.iter().map(|p| p.len()).sum();
    let (mut out, whole) = event_head(event_type, obj_len);
    for p in object {
        out.extend_from_slice(p);
    }
    debug_assert_eq!(out.len(), whole);
    Bytes::from(out)
}

/// [`watch_event`] of the object enveloped with `type_meta` around the message `msg` (its
/// pieces, in order): the envelope's head written in place, the frame one buffer and one
/// allocation (a kubelet's pod event pays this per delivery).
pub fn watch_event_enveloped(event_type: &str, type_meta: &[u8], msg: &[&[u8]]) -> Bytes {
    let msg_len: usize = msg.iter().map(|p| p.len()).sum();
    let obj_len = head_len(type_meta, msg_len) + msg_len + UNKNOWN_TAIL.len();
    let (mut out, whole) = event_head(event_type, obj_len);
    put_head(&mut out, type_meta, msg_len);
    for p in msg {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(UNKNOWN_TAIL);
    debug_assert_eq!(out.len(), whole);
    Bytes::from(out)
}

/// A watch frame's bytes before its object of `obj_len` bytes, in a buffer with room for the
/// whole frame, and the whole frame's length.
fn event_head(event_type: &str, obj_len: usize) -> (Vec<u8>, usize) {
    let raw_ext_len = 1 + wire::varint_len(obj_len as u64) + obj_len;
    let event_len = 1
        + wire::varint_len(event_type.len() as u64)
        + event_type.len()
        + 1
        + wire::varint_len(raw_ext_len as u64)
        + raw_ext_len;
    let mut out = Vec::with_capacity(4 + event_len);
    out.extend_from_slice(&(event_len as u32).to_be_bytes());
    wire::len_field(&mut out, 1, event_type.as_bytes());
    wire::tag(&mut out, 2, wire::LEN);
    wire::varint(&mut out, raw_ext_len as u64);
    wire::tag(&mut out, 1, wire::LEN);
    wire::varint(&mut out, obj_len as u64);
    (out, 4 + event_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_enveloped_status_as_the_apiserver_sends_it() {
        // The first bytes of a recorded 406 Status (crd-accept-protobuf.json): k8s\0,
        // Unknown{TypeMeta{"v1","Status"}, raw (153 bytes) …}.
        let tm = type_meta("v1", "Status");
        let h = head(&tm, 153);
        assert_eq!(h, b"k8s\0\x0a\x0c\x0a\x02v1\x12\x06Status\x12\x99\x01");
        assert_eq!(head_len(&tm, 153), h.len());
    }

    #[test]
    fn watch_frames_are_length_prefixed() {
        let f = watch_event("ADDED", &[b"k8s\0", b"xy"]);
        assert_eq!(&f[..4], &[0, 0, 0, 17]);
        assert_eq!(&f[4..], b"\x0a\x05ADDED\x12\x08\x0a\x06k8s\0xy");
    }

    #[test]
    fn an_enveloped_frame_is_the_frame_of_the_envelope_and_the_message() {
        let tm = type_meta("v1", "Pod");
        let msg: [&[u8]; 3] = [b"\x0a\x03abc", &[7u8; 200], b"\x12\x00"];
        let whole = msg.concat();
        let expected = watch_event("MODIFIED", &[&head(&tm, whole.len()), &whole, UNKNOWN_TAIL]);
        assert_eq!(watch_event_enveloped("MODIFIED", &tm, &msg), expected);
        assert_eq!(
            watch_event_enveloped("ADDED", &tm, &[]),
            watch_event("ADDED", &[&head(&tm, 0), UNKNOWN_TAIL])
        );
    }
}
