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

use std::borrow::Cow;

use bytes::Bytes;
use serde_json::value::RawValue;

use super::schema::{Card, Schema};
use super::transcode::{
    encode_read, field_for, plain_message, read_object, Cx, FieldId, Member, Members, Out, Rope, Unsupported,
    Val, SHARE_MIN,
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
    let cx = Cx::new(schema, minor, json, Some((stored, prefix_len)));
    let new = std::str::from_utf8(json).map_err(|e| Unsupported(format!("not UTF-8: {e}")))?;
    let old = std::str::from_utf8(prior.json).map_err(|e| Unsupported(format!("not UTF-8: {e}")))?;
    let ctx = Ctx::new(&cx, prior);
    let mut rope = ctx.message(msg, new, old, (0, prior.rope.len()))?.into_rope();
    // What was copied comes from the prior: a repeated member there may be in it.
    rope.repeated = cx.repeated.get() || prior.rope.repeated;
    Ok(rope)
}

/// A transcode's context and the previous version (its JSON, its encoding's parts).
pub(super) struct Ctx<'c, 'a> {
    pub(super) cx: &'c Cx<'a>,
    prior: &'c Prior<'c>,
    pub(super) parts: Parts<'c>,
}

impl<'c, 'a> Ctx<'c, 'a> {
    pub(super) fn new(cx: &'c Cx<'a>, prior: &'c Prior<'c>) -> Ctx<'c, 'a> {
        Ctx { cx, prior, parts: Parts::of(prior.rope) }
    }

    /// Message `idx` of the JSON object `new`, whose previous JSON was `old` and previous
    /// encoding the range `enc` of the prior rope.
    fn message(&self, idx: usize, new: &str, old: &str, enc: (usize, usize)) -> R<Out> {
        let (cx, m) = (self.cx, &self.cx.s.messages[idx]);
        let split = (!m.fields.iter().any(|f| f.inline)).then(|| split(new)).flatten();
        // A member named twice here: read whole (the last one counts, wherever it is).
        let split = split
            .filter(|now| !now.iter().enumerate().any(|(i, (k, _))| now[..i].iter().any(|(p, _)| p == k)));
        let Some(now) = split else {
            // Inline fields mix members; an object the splitter does not take: read it whole.
            return encode_read(cx, m, read_object(cx, idx, new)?);
        };
        let runs =
            self.parts.runs(enc).ok_or_else(|| Unsupported("the prior encoding does not parse".into()))?;
        let old_of = Aligned::new(new, old, self.prior.rope.repeated);
        let mut list = Vec::with_capacity(now.len());
        for (key, v) in now {
            let f = field_for(cx.s, m, key).filter(|f| !f.inline);
            let was = match f {
                Some(_) => old_of.member(key, v),
                None => None,
            };
            let val = match (f, was) {
                (Some(f), Some(was)) if was == v => {
                    let run = run_of(&runs, f.number);
                    let at = |s: &str, base: &[u8]| s.as_ptr() as usize - base.as_ptr() as usize;
                    Val::Encoded(self.copy_at(run, at(was, self.prior.json), at(v, cx.json)))
                }
                (Some(f), Some(was)) if matches!(f.card, Card::One | Card::Opt) && !null(v) && !null(was) => {
                    let sub = plain_message(cx.s, f)
                        .zip(runs.iter().find(|r| r.0 == f.number).and_then(|r| self.parts.body(r.1, r.2)));
                    match sub {
                        Some((i, body)) => Val::Msg(Some(self.message(i, v, was, body)?)),
                        None => Val::Raw(raw(v)?),
                    }
                }
                _ => Val::Raw(raw(v)?),
            };
            list.push(Member { key: Cow::Borrowed(key), val, field: f.map(FieldId::of), used: false });
        }
        encode_read(cx, m, Members { list, used: 0 })
    }

    /// The previous encoding's bytes `range` (fields whose JSON, at `was_at` in the prior JSON,
    /// is the same text as at `now_at` in the new one): copied, except the long strings shared
    /// with the prior's stored bytes, which are shared with the new version's at the same place.
    pub(super) fn copy_at(&self, range: (usize, usize), was_at: usize, now_at: usize) -> Out {
        let mut out = Out::default();
        let stored = self.prior.stored.as_ptr_range();
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

/// The old JSON of an object beside the new one: a member of the new one is found in the old
/// one where both texts start alike (the same bytes at the same place, found without reading
/// the old object), else by reading the old object's members once.
struct Aligned<'n, 'o> {
    new: &'n str,
    old: &'o str,
    /// Bytes equal at the start.
    prefix: usize,
    members: std::cell::OnceCell<Option<Vec<(&'o str, &'o str)>>>,
}

impl<'n, 'o> Aligned<'n, 'o> {
    /// `repeated`: the old JSON had a member twice somewhere (then members are looked up by
    /// name, the last one of a name being the one its encoding holds).
    fn new(new: &'n str, old: &'o str, repeated: bool) -> Aligned<'n, 'o> {
        let (a, b) = (new.as_bytes(), old.as_bytes());
        let prefix = if repeated { 0 } else { a.iter().zip(b).take_while(|(x, y)| x == y).count() };
        Aligned { new, old, prefix, members: Default::default() }
    }

    /// The old value of the member `key` whose new value is `v` (a slice of `new`): the last
    /// one of that name, as Go's decoder keeps the last.
    fn member(&self, key: &str, v: &str) -> Option<&'o str> {
        let start = v.as_ptr() as usize - self.new.as_ptr() as usize;
        let end = start + v.len();
        // A value entirely in the common start is the old one, at the same place: both texts
        // read the same up to there (neither object names a member twice: checked for the new
        // one, and the old one's encoding says so). A common end would not do: the same bytes
        // can be read differently after different ones (inside a string, at another depth).
        if end <= self.prefix {
            return self.old.get(start..end);
        }
        let members = self.members.get_or_init(|| split(self.old)).as_ref()?;
        members.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

fn null(v: &str) -> bool {
    v == "null"
}

/// A member's value as serde_json's raw value (a value the splitter delimited).
pub(super) fn raw(v: &str) -> R<&RawValue> {
    serde_json::from_str(v).map_err(|e| Unsupported(format!("{e}")))
}

/// The members of a compact JSON object: keys (without escapes) and values' text; `None` for
/// anything else (the caller then reads the object whole).
fn split(text: &str) -> Option<Vec<(&str, &str)>> {
    let b = text.as_bytes();
    let i = ws(b, 0);
    (b.get(i) == Some(&b'{')).then_some(())?;
    let (list, close) = members(b, i + 1, false)?;
    (ws(b, close + 1) == b.len()).then_some(())?;
    list.into_iter().map(|(key, start, end)| Some((key, text.get(start..end)?))).collect()
}

/// A member as [`members`] finds it: its key and where its value starts and ends.
pub(super) type Found<'a> = (&'a str, usize, usize);

/// The members from `i` (a member, or the closing brace unless `i` follows a comma) to the end
/// of their object: each key (without escapes, else `None`) and where its value starts and ends,
/// and where the closing brace is.
pub(super) fn members(text: &[u8], mut i: usize, after_comma: bool) -> Option<(Vec<Found<'_>>, usize)> {
    let mut out = Vec::with_capacity(16);
    i = ws(text, i);
    if text.get(i) == Some(&b'}') && !after_comma {
        return Some((out, i));
    }
    loop {
        let (key, v) = member_key(text, ws(text, i))?;
        let end = value_end(text, v)?;
        out.push((key, v, end));
        i = ws(text, end);
        match text.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => return Some((out, i)),
            _ => return None,
        }
    }
}

/// The key of the member starting at `text[i]` (unescaped) and where its value starts.
pub(super) fn member_key(text: &[u8], i: usize) -> Option<(&str, usize)> {
    (text.get(i) == Some(&b'"')).then_some(())?;
    let key_end = string_end(text, i)?;
    let key = std::str::from_utf8(text.get(i + 1..key_end - 1)?).ok()?;
    if key.contains('\\') {
        return None;
    }
    let colon = ws(text, key_end);
    (text.get(colon) == Some(&b':')).then_some(())?;
    Some((key, ws(text, colon + 1)))
}

/// Where field `number`'s entries are in `runs` (empty when the encoding has none).
pub(super) fn run_of(runs: &[(u32, usize, usize)], number: u32) -> (usize, usize) {
    runs.iter().find(|r| r.0 == number).map_or((0, 0), |r| (r.1, r.2))
}

pub(super) fn ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// After the string starting at `b[i]` (a quote). Strings in Kubernetes objects are short (a
/// name, a time): eight bytes at a time are looked at for a quote or a backslash, with no call
/// per string.
pub(super) fn string_end(b: &[u8], i: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // The high bit of each byte of `x` equal to `c` (and maybe of bytes above the first one).
    let eq = |x: u64, c: u8| {
        let y = x ^ (ONES * u64::from(c));
        y.wrapping_sub(ONES) & !y & HIGH
    };
    let mut j = i + 1;
    loop {
        match b.get(j..j + 8) {
            Some(w) => {
                let x = u64::from_le_bytes(w.try_into().ok()?);
                let m = eq(x, b'"') | eq(x, b'\\');
                if m == 0 {
                    j += 8;
                    continue;
                }
                j += (m.trailing_zeros() / 8) as usize;
            }
            None => j += b.get(j..)?.iter().position(|&c| c == b'"' || c == b'\\')?,
        }
        if b[j] == b'"' {
            return Some(j + 1);
        }
        j += 2;
    }
}

/// After the value starting at `b[i]`.
pub(super) fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let (mut depth, mut j) = (0usize, i);
            loop {
                match *b.get(j)? {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let n =
                b[i..].iter().position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'));
            Some(i + n.unwrap_or(b.len() - i)).filter(|&e| e > i)
        }
    }
}

/// The entry `start..end` of field `number` added to `runs`: joined to the last run if it is the
/// same field's.
fn join_run(runs: &mut Vec<(u32, usize, usize)>, number: u32, start: usize, end: usize) {
    match runs.last_mut() {
        Some(last) if last.0 == number => last.2 = end,
        _ => runs.push((number, start, end)),
    }
}

/// A message's fields in the prior encoding, read only as far as asked: fields are written in
/// number order, so finding field 6 reads the entries of fields 1 to 6 and the tag after them
/// (each entry's tag and length are a read of memory the previous one's length points to).
pub(super) struct Fields {
    pos: usize,
    end: usize,
    runs: Vec<(u32, usize, usize)>,
}

impl Fields {
    /// The fields of the message in the prior encoding's range `enc`.
    pub(super) fn new((pos, end): (usize, usize)) -> Fields {
        // Room for a pod's metadata's runs read as far as its resourceVersion (grown from empty,
        // it was reallocated three times).
        Fields { pos, end, runs: Vec::with_capacity(8) }
    }

    /// Where field `number`'s entries are (empty when it has none); `None`: the encoding does
    /// not parse.
    pub(super) fn run(&mut self, parts: &Parts, number: u32) -> Option<(usize, usize)> {
        while self.pos < self.end && self.runs.last().is_none_or(|r| r.0 <= number) {
            let start = self.pos;
            let n = parts.skip_entry(&mut self.pos)?;
            join_run(&mut self.runs, n, start, self.pos);
        }
        (self.pos <= self.end).then(|| run_of(&self.runs, number))
    }
}

/// The prior rope's parts with their offsets, for reading its fields across part boundaries.
pub(super) struct Parts<'a> {
    parts: &'a [Bytes],
    /// Where each part starts in the rope; empty for a rope of one part (which starts at 0: no
    /// list to allocate for the common case, a message kept as one buffer).
    starts: Vec<usize>,
    /// The part read last.
    hint: std::cell::Cell<usize>,
}

impl<'a> Parts<'a> {
    pub(super) fn of(rope: &'a Rope) -> Parts<'a> {
        let parts = rope.parts();
        if parts.len() == 1 {
            return Parts { parts, starts: Vec::new(), hint: Default::default() };
        }
        let mut starts = Vec::with_capacity(parts.len());
        let mut at = 0;
        for p in parts {
            starts.push(at);
            at += p.len();
        }
        Parts { parts, starts, hint: Default::default() }
    }

    /// Where each part starts.
    fn starts(&self) -> &[usize] {
        if self.starts.is_empty() && self.parts.len() == 1 {
            &[0]
        } else {
            &self.starts
        }
    }

    /// The part holding `pos`: the last one found (fields are read forward), else searched.
    fn part_of(&self, pos: usize) -> Option<usize> {
        let h = self.hint.get();
        if self.starts().get(h).is_some_and(|&s| s <= pos && pos < s + self.parts[h].len()) {
            return Some(h);
        }
        let i = self.starts().partition_point(|&s| s <= pos).checked_sub(1)?;
        self.hint.set(i);
        Some(i)
    }

    /// The byte at `pos`.
    fn byte(&self, pos: usize) -> Option<u8> {
        let i = self.starts().partition_point(|&s| s <= pos).checked_sub(1)?;
        self.parts[i].get(pos - self.starts()[i]).copied()
    }

    /// The varint at `*pos`, moving past it.
    pub(super) fn varint(&self, pos: &mut usize) -> Option<u64> {
        // Within one part (nearly always): read from its slice.
        let i = self.part_of(*pos)?;
        let here = self.parts[i].get(*pos - self.starts()[i]..)?;
        let mut v = 0u64;
        for (k, &b) in here.iter().take(10).enumerate() {
            v |= u64::from(b & 0x7f) << (7 * k);
            if b < 0x80 {
                *pos += k + 1;
                return Some(v);
            }
        }
        self.varint_across(pos)
    }

    /// [`Parts::varint`] byte by byte, across parts.
    fn varint_across(&self, pos: &mut usize) -> Option<u64> {
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

    /// The fields in `range`, consecutive entries of one number together: (number, start,
    /// end) of each run, tags included (fields are written in number order, so a field's
    /// entries are one run).
    pub(super) fn runs(&self, (mut pos, end): (usize, usize)) -> Option<Vec<(u32, usize, usize)>> {
        let mut out: Vec<(u32, usize, usize)> = Vec::with_capacity(16);
        while pos < end {
            let start = pos;
            let number = self.skip_entry(&mut pos)?;
            join_run(&mut out, number, start, pos);
        }
        (pos == end).then_some(out)
    }

    /// The field number of the entry at `*pos`, moving past the entry.
    fn skip_entry(&self, pos: &mut usize) -> Option<u32> {
        let tag = self.varint(pos)?;
        match tag & 7 {
            0 => {
                self.varint(pos)?;
            }
            1 => *pos += 8,
            2 => *pos += usize::try_from(self.varint(pos)?).ok()?,
            5 => *pos += 4,
            _ => return None,
        }
        u32::try_from(tag >> 3).ok()
    }

    /// Each entry of `range` (a repeated field's run): its start and end, tag included.
    pub(super) fn entries(&self, (mut pos, end): (usize, usize)) -> Option<Vec<(usize, usize)>> {
        let mut out = Vec::with_capacity(4);
        while pos < end {
            let start = pos;
            let tag = self.varint(&mut pos)?;
            (tag & 7 == 2).then_some(())?;
            pos += usize::try_from(self.varint(&mut pos)?).ok()?;
            out.push((start, pos));
        }
        (pos == end).then_some(out)
    }

    /// The body of the one length-delimited entry `start..end` (its tag and length skipped).
    pub(super) fn body(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let mut pos = start;
        let tag = self.varint(&mut pos)?;
        let len = usize::try_from(self.varint(&mut pos)?).ok()?;
        (tag & 7 == 2 && pos + len == end).then_some((pos, end))
    }

    /// The bytes of `range`, as slices of the parts.
    pub(super) fn slices(&self, (start, end): (usize, usize)) -> impl Iterator<Item = &'a [u8]> + '_ {
        let first = self.starts().partition_point(|&s| s <= start).saturating_sub(1);
        (first..self.parts.len()).map_while(move |i| {
            let (s, p) = (self.starts()[i], &self.parts[i]);
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

    /// The eight-bytes-at-a-time string scan ends strings where a byte-by-byte reading does:
    /// quotes and escapes at every offset, near the end of the text, non-ASCII bytes.
    #[test]
    fn strings_end_where_a_byte_by_byte_reading_ends_them() {
        fn naive(b: &[u8], i: usize) -> Option<usize> {
            let mut j = i + 1;
            loop {
                match *b.get(j)? {
                    b'"' => return Some(j + 1),
                    b'\\' => j += 2,
                    _ => j += 1,
                }
            }
        }
        let pieces = ["a", "\\\"", "\\\\", "é", "\\u0041", "xxxxxxx", "\"", "\\"];
        let mut texts = Vec::new();
        for a in pieces {
            for b in pieces {
                for pad in 0..10 {
                    texts.push(format!("\"{}{a}{b}\",1", "y".repeat(pad)));
                    texts.push(format!("\"{}{a}{b}", "y".repeat(pad)));
                }
            }
        }
        for t in &texts {
            assert_eq!(string_end(t.as_bytes(), 0), naive(t.as_bytes(), 0), "{t:?}");
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
        // The old version names `metadata` twice (the later one was encoded); the new one drops
        // the later: its first `metadata`, the same bytes at the same place, is not the one the
        // old encoding holds.
        let twice = base.replace(r#","status":"#, r#","metadata":{"name":"late"},"status":"#);
        check(&s, msg, &twice, &base);
        check(&s, msg, &base, &twice);
        // Whole parts changing places.
        let moved = base.replace(r#""metadata":"#, r#""spec2":0,"metadata":"#);
        check(&s, msg, &base, &moved);
        check(&s, msg, &variants[2], &variants[3]);
    }
}
