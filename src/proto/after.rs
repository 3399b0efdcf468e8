//! JSON → protobuf for a new version of an object whose previous version was already encoded:
//! the parts of the message whose JSON did not change are taken from the previous encoding
//! instead of being read and encoded again. A kubelet's pod changes in its status and
//! `resourceVersion`; its spec, most of its metadata and the status' unchanged members are
//! copied as encoded bytes (a memcpy), so a protobuf delivery costs little more than a JSON one.
//!
//! Exact by construction: a message field's encoding depends only on its JSON value (and the
//! schema and upstream version, the same for both versions), so equal JSON bytes give equal
//! protobuf bytes; everything that changed goes through [`super::transcode`]'s own reading
//! and encoding (field order, zero values, unknown members, duplicate keys: its rules). Only
//! singular message fields of plain messages are compared and descended into; a message with
//! inline fields (whose encoding mixes several JSON members) is encoded whole. The result shares
//! long strings with the new version's stored bytes as a fresh encoding does (the previous
//! version's buffers are not kept alive by it). The tests compare it with a fresh encoding.
//!
//! Pure; called by `proto::ProtoType::encode_after` when a watch event is framed in protobuf and
//! its previous version has its encoding.

use bytes::Bytes;
use serde_json::value::RawValue;

use super::schema::{Card, Schema};
use super::transcode::{
    encode_read, field_for, is_null, plain_message, read_object, Cx, FieldId, Member, Members, Out,
    RawMembers, Rope, Unsupported, Val, SHARE_MIN,
};

type R<T> = Result<T, Unsupported>;

/// The previous version: its JSON as encoded (`prefix_len` bytes of `kind`/`apiVersion`, then
/// `stored`), and its encoding.
pub struct Prior<'a> {
    pub json: &'a [u8],
    pub stored: &'a Bytes,
    pub prefix_len: usize,
    pub rope: &'a Rope,
}

/// The message `msg` of `json` (as [`super::transcode::object_shared`] takes it), the
/// unchanged parts copied from `prior`'s encoding.
pub fn object_after(
    schema: &Schema,
    msg: usize,
    json: &[u8],
    stored: &Bytes,
    prefix_len: usize,
    minor: u32,
    prior: &Prior,
) -> R<Rope> {
    let cx = Cx { s: schema, minor, json, stored: Some((stored, prefix_len)) };
    let new = std::str::from_utf8(json).map_err(|e| Unsupported(format!("not UTF-8: {e}")))?;
    let old = std::str::from_utf8(prior.json).map_err(|e| Unsupported(format!("not UTF-8: {e}")))?;
    let ctx = Ctx { cx: &cx, prior, parts: Parts::of(prior.rope) };
    Ok(ctx.message(msg, new, old, (0, prior.rope.len()))?.into_rope())
}

struct Ctx<'c, 'a> {
    cx: &'c Cx<'a>,
    prior: &'c Prior<'c>,
    parts: Parts<'c>,
}

impl Ctx<'_, '_> {
    /// Message `idx` of the JSON object `new`, whose previous JSON was `old` and previous
    /// encoding the range `enc` of the prior rope.
    fn message(&self, idx: usize, new: &str, old: &str, enc: (usize, usize)) -> R<Out> {
        let (cx, m) = (self.cx, &self.cx.s.messages[idx]);
        if m.fields.iter().any(|f| f.inline) {
            return encode_read(cx, m, read_object(cx, idx, new)?);
        }
        let (now, before) = (members(new)?, members(old)?);
        let mut list = Vec::with_capacity(now.len());
        for (key, v) in now {
            let f = field_for(cx.s, m, &key);
            let sub = f.filter(|f| matches!(f.card, Card::One | Card::Opt) && !is_null(v));
            let val = match sub.and_then(|f| plain_message(cx.s, f).map(|i| (f, i))) {
                Some((f, i)) => {
                    // The last member of that name wins, as in Go's decoder (and `Members::find`).
                    let was =
                        before.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| *v).filter(|v| !is_null(v));
                    match was.zip(was.and_then(|_| self.parts.field(enc, f.number))) {
                        Some((was, range)) if was.get() == v.get() => {
                            Val::Msg(Some(self.copy(range, was, v)))
                        }
                        Some((was, range)) => Val::Msg(Some(self.message(i, v.get(), was.get(), range)?)),
                        None => Val::Raw(v),
                    }
                }
                None => Val::Raw(v),
            };
            list.push(Member { key, val, field: f.map(FieldId::of), used: false });
        }
        encode_read(cx, m, Members { list, used: 0 })
    }

    /// The previous encoding's bytes `range` (a message body whose JSON, `was` in the prior
    /// JSON, is equal to `now` in the new one): copied, except the long strings shared with the
    /// prior's stored bytes, which are shared with the new version's at the same place.
    fn copy(&self, range: (usize, usize), was: &RawValue, now: &RawValue) -> Out {
        let mut out = Out::default();
        let stored = self.prior.stored.as_ptr_range();
        let was_at = was.get().as_ptr() as usize - self.prior.json.as_ptr() as usize;
        let now_at = now.get().as_ptr() as usize - self.cx.json.as_ptr() as usize;
        for piece in self.parts.slices(range) {
            let shared = if stored.contains(&piece.as_ptr()) && piece.len() >= SHARE_MIN {
                // Where the string lies in the prior JSON, relative to `was`; the same place in `now`.
                let in_json = self.prior.prefix_len + (piece.as_ptr() as usize - stored.start as usize);
                in_json
                    .checked_sub(was_at)
                    .and_then(|rel| self.cx.json.get(now_at + rel..now_at + rel + piece.len()))
                    .filter(|moved| *moved == piece)
                    .and_then(|moved| self.cx.shared(moved))
            } else {
                None
            };
            match shared {
                Some(b) => out.share(b),
                None => out.extend_from_slice(piece),
            }
        }
        out
    }
}

/// The members of a JSON object, values unread.
fn members(text: &str) -> R<Vec<(std::borrow::Cow<'_, str>, &RawValue)>> {
    serde_json::from_str::<RawMembers>(text).map(|m| m.0).map_err(|e| Unsupported(format!("{e}")))
}

/// The prior rope's parts with their offsets, for reading its fields across part boundaries.
struct Parts<'a> {
    parts: &'a [Bytes],
    /// Where each part starts in the rope.
    starts: Vec<usize>,
}

impl<'a> Parts<'a> {
    fn of(rope: &'a Rope) -> Parts<'a> {
        let parts = rope.parts();
        let mut starts = Vec::with_capacity(parts.len());
        let mut at = 0;
        for p in parts {
            starts.push(at);
            at += p.len();
        }
        Parts { parts, starts }
    }

    /// The byte at `pos`.
    fn byte(&self, pos: usize) -> Option<u8> {
        let i = self.starts.partition_point(|&s| s <= pos).checked_sub(1)?;
        self.parts[i].get(pos - self.starts[i]).copied()
    }

    /// The varint at `*pos`, moving past it.
    fn varint(&self, pos: &mut usize) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte(*pos)?;
            *pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Some(v);
            }
        }
        None
    }

    /// The body of field `number` (length-delimited, its last occurrence) among the fields in
    /// `range`.
    fn field(&self, range: (usize, usize), number: u32) -> Option<(usize, usize)> {
        let (mut pos, end) = range;
        let mut found = None;
        while pos < end {
            let tag = self.varint(&mut pos)?;
            match tag & 7 {
                0 => {
                    self.varint(&mut pos)?;
                }
                1 => pos += 8,
                2 => {
                    let len = usize::try_from(self.varint(&mut pos)?).ok()?;
                    if tag >> 3 == u64::from(number) {
                        found = Some((pos, pos + len));
                    }
                    pos += len;
                }
                5 => pos += 4,
                _ => return None,
            }
        }
        found.filter(|&(_, e)| e <= end)
    }

    /// The bytes of `range`, as slices of the parts.
    fn slices(&self, (start, end): (usize, usize)) -> impl Iterator<Item = &'a [u8]> + '_ {
        let first = self.starts.partition_point(|&s| s <= start).saturating_sub(1);
        (first..self.parts.len()).map_while(move |i| {
            let (s, p) = (self.starts[i], &self.parts[i]);
            (s < end).then(|| &p[start.saturating_sub(s).min(p.len())..(end - s).min(p.len())])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::transcode::object_shared;

    /// Equal to a fresh encoding of the new version, for changes at every depth.
    fn check(schema: &Schema, msg: usize, old: &str, new: &str) {
        let (old_b, new_b) = (Bytes::from(old.to_owned()), Bytes::from(new.to_owned()));
        // A version that cannot be encoded has no encoding to start from.
        let Ok(prior_rope) = object_shared(schema, msg, &old_b, &old_b, 0, 99) else { return };
        let prior = Prior { json: &old_b, stored: &old_b, prefix_len: 0, rope: &prior_rope };
        let fresh = object_shared(schema, msg, &new_b, &new_b, 0, 99);
        let after = object_after(schema, msg, &new_b, &new_b, 0, 99, &prior);
        match (fresh, after) {
            (Ok(f), Ok(a)) => {
                assert_eq!(a.to_vec(), f.to_vec(), "{new}");
                assert_eq!(a.own_bytes(&new_b), f.own_bytes(&new_b), "shares as much: {new}");
                let prior_range = old_b.as_ptr_range();
                assert!(
                    a.parts().iter().all(|p| !prior_range.contains(&p.as_ptr())),
                    "no part of the prior's JSON"
                );
            }
            (Err(_), Err(_)) => {}
            (f, a) => panic!("fresh {f:?} against after {a:?} for {new}"),
        }
    }

    fn schema() -> Schema {
        Schema::parse(
            "g core v1 t\n\
             m t.Meta\nf 1 name string one\nf 2 rv string one\nf 3 labels map<string,string> map\n\
             m t.Src\nf 1 path string one\n\
             m t.Vol\nf 1 name string one\nf 2 src t.Src one inline\n\
             m t.Spec\nf 1 node string one\nf 2 vols t.Vol rep\nf 3 inner t.Meta opt\nf 4 note string one\n\
             m t.Obj\nf 1 metadata t.Meta one\nf 2 spec t.Spec one\nf 3 status t.Meta opt\n",
        )
        .unwrap()
    }

    #[test]
    fn unchanged_parts_are_taken_from_the_previous_encoding_exactly() {
        let s = schema();
        let msg = s.message("t.Obj").unwrap();
        let long = "x".repeat(100);
        let base = format!(
            r#"{{"kind":"Obj","apiVersion":"v1","metadata":{{"name":"a","rv":"1","labels":{{"k":"{long}"}}}},"spec":{{"node":"n","vols":[{{"name":"v","path":"/p"}}],"inner":{{"name":"{long}"}},"note":"{long}"}},"status":{{"name":"s"}}}}"#
        );
        let variants = [
            base.replace(r#""rv":"1""#, r#""rv":"2""#),
            base.replace(r#""node":"n""#, r#""node":"m""#),
            base.replace(r#""status":{"name":"s"}"#, r#""status":null"#),
            base.replace(r#","status":{"name":"s"}"#, ""),
            base.replace(r#""note":"x"#, r#""note":"y"#),
            base.replace(r#""inner":{"name":"#, r#""inner":{"rv":"9","name":"#),
            base.replace(r#""path":"/p""#, r#""path":"/q""#),
            base.replace(r#""metadata":{"#, r#""metadata":{"unknown":1,"#),
            base.replace(r#""spec":{"#, r#""spec":{"node":"first","#),
            base.replace(r#""rv":"1""#, r#""rv":"\u0031""#),
            base.clone(),
        ];
        for v in &variants {
            check(&s, msg, &base, v);
            check(&s, msg, v, &base);
        }
        // Whole parts changing places.
        let moved = base.replace(r#""metadata":"#, r#""spec2":0,"metadata":"#);
        check(&s, msg, &base, &moved);
        check(&s, msg, &variants[2], &variants[3]);
    }
}
