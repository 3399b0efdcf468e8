//! JSON → protobuf for a new version of an object, from its previous version's encoding, reading
//! the new JSON only where it differs. A watch event's object usually changes in a place or two
//! (its `resourceVersion`, a label, a container's status): the bytes before the first difference
//! (the head) and after the last one (the tail) are the same in both versions.
//!
//! Both texts are walked together, member by member, from the start of the top-level object:
//! - a member whose value is the same text in both keeps its encoding, copied from the previous
//!   one; a message field's object in the head is walked one level down instead, as the first
//!   difference may be in it;
//! - a member whose value differs is walked one level down when it is a message or a list of
//!   messages (element by element), else read and encoded again;
//! - members added, removed or reordered: the rest of that object is matched by name;
//! - a member of the new text that starts in the tail, where the old text has a member at the
//!   same distance from its end, starts the same bytes up to the end of both texts: it, the
//!   members after it and those of every enclosing object are the old ones, and are not read.
//!   Each field not met so far takes its encoding from the previous one (a field absent from
//!   both texts has the same encoding in both: its zero value, or nothing).
//!
//! Exact for the reasons the after module is (a field's encoding depends only on its member's
//! JSON; fields are written in number order, a repeated field's entries together). Where it
//! cannot tell (an escaped key, a message with inline fields, a member named twice, an old text
//! that named one twice, a trailing comma or anything after the object), it gives up and the
//! caller encodes from the whole texts. Long strings are shared with the new stored bytes as a
//! fresh encoding shares them.
//!
//! Pure; called by `proto::ProtoType::encode_edit` (a watch event's new version, when the version
//! it replaced was encoded).

use std::borrow::Cow;

use bytes::Bytes;

use super::after::{member_key, members, raw, run_of, value_end, ws, Ctx, Prior};
use super::schema::{Card, Field, Message, Schema};
use super::transcode::{encode_read, field_for, plain_message, Cx, FieldId, Member, Members, Out, Rope, Val};

/// The message `msg` of the object whose body (its JSON after the opening `{`, as the cache
/// stores a built-in object) is `new`, from `old`'s body and encoding. `None`: the walk gave up.
pub fn object_edit(
    schema: &Schema,
    msg: usize,
    new: &Bytes,
    old: &Bytes,
    minor: u32,
    prior: &Rope,
) -> Option<Rope> {
    if prior.repeated {
        return None;
    }
    let cx = Cx::new(schema, minor, new, Some((new, 0)));
    let p = Prior { json: old, stored: old, prefix_len: 0, rope: prior };
    let head = common_prefix(new, old);
    let tail = new.len() - common_suffix(&new[head..], &old[head..]);
    let walk = Walk { ctx: Ctx::new(&cx, &p), new, old, head, tail };
    let (out, end) = walk.object(msg, 0, 0, (0, prior.len()))?;
    if let End::Closed(n, _) = end {
        // Nothing but whitespace after the object (the tail, if reached, is the old text's).
        (ws(new, n) == new.len()).then_some(())?;
    }
    let mut rope = out.into_rope();
    rope.repeated = cx.repeated.get();
    Some(rope)
}

struct Walk<'c, 'a> {
    ctx: Ctx<'c, 'a>,
    new: &'a [u8],
    old: &'a [u8],
    /// Bytes equal at the start of both texts.
    head: usize,
    /// Where, in `new`, the bytes equal at the end of both texts start.
    tail: usize,
}

/// How an object's walk ended.
enum End {
    /// At its closing brace, just after it in each text.
    Closed(usize, usize),
    /// In the common tail, from `.0` in the new text and `.1` in the old one: the rest of both
    /// texts is the same.
    Tail(usize, usize),
}

impl Walk<'_, '_> {
    /// The members of message `idx` from `n` in the new text and `o` in the old one (just after
    /// the object's `{`); `enc`: the range of the old encoding holding the message's fields.
    fn object(&self, idx: usize, mut n: usize, mut o: usize, enc: (usize, usize)) -> Option<(Out, End)> {
        let cx = self.ctx.cx;
        let m = &cx.s.messages[idx];
        walkable(m).then_some(())?;
        let runs = self.ctx.parts.runs(enc)?;
        let (new, old) = (self.new, self.old);
        let mut list = Vec::with_capacity(runs.len() + 2);
        let mut seen: Vec<u32> = Vec::with_capacity(runs.len() + 2);
        (n, o) = (ws(new, n), ws(old, o));
        // Whether `n` and `o` follow a comma (then a member must come, not the closing brace).
        let mut after_comma = false;
        let end = loop {
            if n >= self.tail && o + new.len() == n + old.len() {
                break End::Tail(n, o);
            }
            let pair = member_key(new, n).zip(member_key(old, o)).filter(|((k, _), (ko, _))| k == ko);
            let Some(((key, vn), (_, vo))) = pair else {
                // Members added, removed or moved: the rest of this object is matched by name.
                let (rest_n, rest_o) = ((n, after_comma), (o, after_comma));
                break self.by_name(m, &runs, &mut seen, &mut list, rest_n, rest_o)?;
            };
            let f = field_for(cx.s, m, key);
            seen.extend(f.map(|f| f.number));
            let (val, ends) = self.value(&runs, f, vn, vo, n == o && vn < self.head)?;
            list.push(member(key, val, f));
            let (en, eo) = match ends {
                End::Closed(en, eo) => (ws(new, en), ws(old, eo)),
                tail => break tail,
            };
            match (new.get(en), old.get(eo)) {
                (Some(b','), Some(b',')) => {
                    (n, o) = (ws(new, en + 1), ws(old, eo + 1));
                    after_comma = true;
                }
                (Some(b'}'), Some(b'}')) => break End::Closed(en + 1, eo + 1),
                (Some(b',' | b'}'), Some(b',' | b'}')) => {
                    // One object has more members than the other.
                    let next =
                        |t: &[u8], i: usize| if t[i] == b',' { (ws(t, i + 1), true) } else { (i, false) };
                    break self.by_name(m, &runs, &mut seen, &mut list, next(new, en), next(old, eo))?;
                }
                _ => return None,
            }
        };
        if let End::Tail(tn, to) = end {
            // The members not met are the old ones: each field not met keeps its encoding. Fields
            // next to each other in the old encoding, with no field met between them, are copied
            // at once: the first holds the bytes, the others are covered by them.
            let mut i = 0;
            while let Some(&(number, start, _)) = runs.get(i) {
                if seen.contains(&number) {
                    i += 1;
                    continue;
                }
                let mut last = i;
                while runs.get(last + 1).is_some_and(|r| !seen.iter().any(|&s| s > runs[last].0 && s <= r.0))
                {
                    last += 1;
                }
                let field = |n: u32| m.fields.iter().find(|f| f.number == n);
                let copied = self.ctx.copy_at((start, runs[last].2), to, tn);
                list.push(member(&field(number)?.json, Val::Encoded(copied), field(number)));
                for r in &runs[i + 1..=last] {
                    list.push(member(&field(r.0)?.json, Val::Covered, field(r.0)));
                }
                i = last + 1;
            }
        }
        let out = encode_read(cx, m, Members { list, used: 0 }).ok()?;
        Some((out, end))
    }

    /// The value of field `f` (`None`: a member the schema does not have) at `vn` in the new
    /// text and `vo` in the old one, and where each ends (or that the walk reached the tail in
    /// it). `in_head`: the member starts at the same place in both, before the first difference.
    fn value<'a>(
        &self,
        runs: &[(u32, usize, usize)],
        f: Option<&Field>,
        vn: usize,
        vo: usize,
        in_head: bool,
    ) -> Option<(Val<'a>, End)>
    where
        Self: 'a,
    {
        let (cx, new, old) = (self.ctx.cx, self.new, self.old);
        let run = |f: &Field| run_of(runs, f.number);
        let sub = f
            .filter(|f| matches!(f.card, Card::One | Card::Opt))
            .and_then(|f| plain_message(cx.s, f).map(|i| (f, i)))
            .filter(|&(_, i)| walkable(&cx.s.messages[i]))
            .filter(|_| new.get(vn) == Some(&b'{') && old.get(vo) == Some(&b'{'));
        // A message in the head is walked rather than delimited: the first difference may be in
        // it, and then its walk reads only what it must.
        if let (Some((f, i)), true) = (sub, in_head) {
            let (out, end) = self.object(i, vn + 1, vo + 1, self.body(run(f))?)?;
            return Some((Val::Msg(Some(out)), end));
        }
        let en = value_end(new, vn)?;
        if let Some(f) = f.filter(|_| same_value(new, old, vn, vo, en - vn)) {
            let copied = self.ctx.copy_at(run(f), vo, vn);
            return Some((Val::Encoded(copied), End::Closed(en, vo + (en - vn))));
        }
        if let Some((f, i)) = sub {
            return match self.object(i, vn + 1, vo + 1, self.body(run(f))?)? {
                (out, End::Closed(_, eo)) => Some((Val::Msg(Some(out)), End::Closed(en, eo))),
                (out, tail) => Some((Val::Msg(Some(out)), tail)),
            };
        }
        let list = f
            .filter(|f| f.card == Card::Rep)
            .and_then(|f| plain_message(cx.s, f).map(|i| (f, i)))
            .filter(|&(_, i)| walkable(&cx.s.messages[i]));
        if let Some((f, i)) = list {
            if let Some((bodies, end)) = self.list(i, run(f), vn, vo, en) {
                return Some((Val::Msgs(Some(bodies)), end));
            }
        }
        let text = std::str::from_utf8(new.get(vn..en)?).ok()?;
        Some((Val::Raw(raw(text).ok()?), End::Closed(en, value_end(old, vo)?)))
    }

    /// A list of messages `idx` at `vn` (ending at `en`) in the new text and `vo` in the old
    /// one, whose entries in the old encoding are `run`: element by element, each unchanged one
    /// copied and each changed one walked. `None` (read whole) unless both are lists of objects
    /// of one length.
    fn list(
        &self,
        idx: usize,
        run: (usize, usize),
        vn: usize,
        vo: usize,
        en: usize,
    ) -> Option<(Vec<Option<Out>>, End)> {
        let (new, old) = (self.new, self.old);
        (new.get(vn) == Some(&b'[') && old.get(vo) == Some(&b'[')).then_some(())?;
        let entries = self.ctx.parts.entries(run)?;
        let mut bodies = Vec::with_capacity(entries.len());
        let (mut n, mut o) = (ws(new, vn + 1), ws(old, vo + 1));
        if new.get(n) == Some(&b']') || old.get(o) == Some(&b']') {
            return None;
        }
        for (k, &entry) in entries.iter().enumerate() {
            (new.get(n) == Some(&b'{') && old.get(o) == Some(&b'{')).then_some(())?;
            let body = self.ctx.parts.body(entry.0, entry.1)?;
            let e = value_end(new, n)?;
            let (out, eo) = if same_value_in_list(new, old, n, o, e - n) {
                (self.ctx.copy_at(body, o, n), o + (e - n))
            } else {
                match self.object(idx, n + 1, o + 1, body)? {
                    (out, End::Closed(_, eo)) => (out, eo),
                    (out, End::Tail(tn, to)) => {
                        // The elements after this one are the old ones.
                        bodies.push(Some(out));
                        for &later in &entries[k + 1..] {
                            bodies.push(Some(self.ctx.copy_at(
                                self.ctx.parts.body(later.0, later.1)?,
                                to,
                                tn,
                            )));
                        }
                        return Some((bodies, End::Tail(tn, to)));
                    }
                }
            };
            bodies.push(Some(out));
            (n, o) = (ws(new, e), ws(old, eo));
            match (new.get(n), old.get(o), k + 1 == entries.len()) {
                (Some(b','), Some(b','), false) => (n, o) = (ws(new, n + 1), ws(old, o + 1)),
                (Some(b']'), Some(b']'), true) => return Some((bodies, End::Closed(en, o + 1))),
                _ => return None,
            }
        }
        None
    }

    /// The rest of an object's members, from `n` in the new text and `o` in the old one (each at
    /// a member or at the closing brace, with whether it follows a comma), each new one with the
    /// old one of its name.
    fn by_name<'a>(
        &self,
        m: &Message,
        runs: &[(u32, usize, usize)],
        seen: &mut Vec<u32>,
        list: &mut Vec<Member<'a>>,
        n: (usize, bool),
        o: (usize, bool),
    ) -> Option<End>
    where
        Self: 'a,
    {
        let (rest_new, close_n) = members(self.new, n.0, n.1)?;
        let (rest_old, close_o) = members(self.old, o.0, o.1)?;
        for &(key, vn, en) in &rest_new {
            let f = field_for(self.ctx.cx.s, m, key);
            if let Some(f) = f {
                // A field named twice in the new object: read whole by the caller.
                (!seen.contains(&f.number)).then_some(())?;
                seen.push(f.number);
            }
            let was = rest_old.iter().find(|(k, ..)| *k == key);
            let val = match was {
                Some(&(_, vo, _)) => self.value(runs, f, vn, vo, false)?.0,
                None => Val::Raw(raw(std::str::from_utf8(self.new.get(vn..en)?).ok()?).ok()?),
            };
            list.push(member(key, val, f));
        }
        Some(End::Closed(close_n + 1, close_o + 1))
    }

    /// The body of the old encoding's one entry `run` (a message field's).
    fn body(&self, run: (usize, usize)) -> Option<(usize, usize)> {
        self.ctx.parts.body(run.0, run.1)
    }
}

/// A message whose JSON members are its own fields, one each (inline fields mix members of
/// several messages: such a message's value is read whole).
pub(super) fn walkable(m: &Message) -> bool {
    !m.fields.iter().any(|f| f.inline) && m.special.is_none() && !m.array
}

fn member<'a>(key: &'a str, val: Val<'a>, f: Option<&Field>) -> Member<'a> {
    Member { key: Cow::Borrowed(key), val, field: f.map(FieldId::of), used: false }
}

/// The value `new[vn..vn + len]` (whole) is also the old text's value at `vo`: the same bytes,
/// followed by the end of the value there too.
fn same_value(new: &[u8], old: &[u8], vn: usize, vo: usize, len: usize) -> bool {
    old.get(vo..vo + len) == new.get(vn..vn + len) && matches!(old.get(ws(old, vo + len)), Some(b',' | b'}'))
}

/// [`same_value`] for a list's element (followed by `,` or `]`).
fn same_value_in_list(new: &[u8], old: &[u8], vn: usize, vo: usize, len: usize) -> bool {
    old.get(vo..vo + len) == new.get(vn..vn + len) && matches!(old.get(ws(old, vo + len)), Some(b',' | b']'))
}

/// How many bytes `a` and `b` start with alike: compared a block of [`BLOCK`] bytes at a time
/// (one `memcmp` each; a kubelet's pod event compares ~4 KB, most of it alike), then the block
/// that differs 16 bytes and a byte at a time.
pub(super) fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut i = 0;
    for w in [BLOCK, 16] {
        while i + w <= n && a[i..i + w] == b[i..i + w] {
            i += w;
        }
    }
    i + a[i..].iter().zip(&b[i..]).take_while(|(x, y)| x == y).count()
}

/// How many bytes `a` and `b` end with alike ([`common_prefix`] from the end).
fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[a.len() - n..], &b[b.len() - n..]);
    let mut k = 0;
    for w in [BLOCK, 16] {
        while k + w <= n && a[n - k - w..n - k] == b[n - k - w..n - k] {
            k += w;
        }
    }
    k + a[..n - k].iter().rev().zip(b[..n - k].iter().rev()).take_while(|(x, y)| x == y).count()
}

/// The bytes [`common_prefix`] compares at once before it narrows down (16-byte comparisons
/// were a `memcmp` call per 16 bytes: 256 calls for a pod).
const BLOCK: usize = 256;

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::proto::transcode::object_shared;

    #[test]
    fn common_ends() {
        assert_eq!(common_prefix(b"abcdefghijklmnopqrstu", b"abcdefghijklmnopqrsXu"), 19);
        assert_eq!(common_prefix(b"ab", b"abc"), 2);
        assert_eq!(common_suffix(b"xbcdefghijklmnopqrstu", b"abcdefghijklmnopqrstu"), 20);
        assert_eq!(common_suffix(b"bc", b"abc"), 2);
        assert_eq!(common_suffix(b"", b"abc"), 0);
        // Across the blocks: a difference at every place of a text longer than two of them.
        let a: Vec<u8> = (0..700u32).map(|i| (i % 251) as u8).collect();
        for at in [0, 1, 15, 16, 17, 255, 256, 257, 511, 512, 600, 699] {
            let mut b = a.clone();
            b[at] ^= 0xff;
            assert_eq!(common_prefix(&a, &b), at, "prefix, difference at {at}");
            assert_eq!(common_suffix(&a, &b), 699 - at, "suffix, difference at {at}");
            assert_eq!(common_prefix(&a[..at], &a), at, "prefix of a shorter text");
        }
        assert_eq!(common_prefix(&a, &a), 700);
        assert_eq!(common_suffix(&a, &a), 700);
    }

    /// A schema with a message in a message, a list of messages, a map and a list of strings.
    pub(in crate::proto) fn schema() -> Schema {
        Schema::parse(
            "g core v1 t\n\
             m t.Meta\nf 1 name string one\nf 2 rv string one\nf 3 labels map<string,string> map\nf 4 gen int64 opt\n\
             m t.Spec\nf 1 node string one\nf 2 inner t.Meta opt\nf 3 note string one\nf 4 list string rep\nf 5 items t.Meta rep\n\
             m t.Obj\nf 1 metadata t.Meta one\nf 2 spec t.Spec one\nf 3 status t.Meta opt\n",
        )
        .unwrap()
    }

    /// The walk's result, when it gives one, is the fresh encoding (bytes and sharing); whether
    /// it gave one is returned.
    fn check(s: &Schema, old: &str, new: &str) -> bool {
        let msg = s.message("t.Obj").unwrap();
        let body = |t: &str| Bytes::from(t.strip_prefix('{').unwrap().to_owned());
        let (old_b, new_b) = (body(old), body(new));
        let Ok(prior) = object_shared(s, msg, old.as_bytes(), &old_b, 1, 99) else { return false };
        let fresh = object_shared(s, msg, new.as_bytes(), &new_b, 1, 99);
        let Some(edit) = object_edit(s, msg, &new_b, &old_b, 99, &prior) else { return false };
        let fresh =
            fresh.unwrap_or_else(|e| panic!("the walk encoded what a fresh encoding refuses ({e}): {new}"));
        assert_eq!(edit.to_vec(), fresh.to_vec(), "{old}\n→ {new}");
        assert_eq!(edit.own_bytes(&new_b), fresh.own_bytes(&new_b), "shares as much: {new}");
        let prior_range = old_b.as_ptr_range();
        assert!(edit.parts().iter().all(|p| !prior_range.contains(&p.as_ptr())), "no part of the old JSON");
        true
    }

    /// An object of [`schema`] with every kind of member, long strings among them.
    pub(in crate::proto) fn base() -> String {
        let long = "x".repeat(100);
        format!(
            r#"{{"metadata":{{"name":"a","rv":"10","labels":{{"k":"{long}"}},"gen":3}},"spec":{{"node":"n","inner":{{"name":"{long}","rv":"1"}},"note":"{long}","list":["a","b"],"items":[{{"name":"i1","rv":"1"}},{{"name":"{long}","gen":2}},{{"name":"i3"}}]}},"status":{{"name":"s","gen":1}}}}"#
        )
    }

    #[test]
    fn an_edit_anywhere_gives_the_fresh_encoding() {
        let s = schema();
        let base = base();
        // (from, to, whether the walk proves it, both ways).
        let edits = [
            (r#""rv":"10""#, r#""rv":"11""#, true),
            (r#""rv":"10""#, r#""rv":"9""#, true),
            (r#""rv":"10""#, r#""rv":"1000""#, true),
            (r#""gen":3"#, r#""gen":4"#, true),
            (r#""gen":3"#, r#""gen":30"#, true),
            (r#""node":"n""#, r#""node":"m""#, true),
            (r#""rv":"1"}"#, r#""rv":"2"}"#, true),
            (r#""list":["a","b"]"#, r#""list":["a"]"#, true),
            (r#""status":{"name":"s","gen":1}"#, r#""status":null"#, true),
            (r#""rv":"10""#, r#""rv":"\u0031""#, true),
            (r#""k":"x"#, r#""k":"y"#, true),
            (r#","gen":1}}"#, r#","gen":2}}"#, true),
            // In a list of messages: an element changed, its first or last one, the list's length.
            (r#""name":"i1""#, r#""name":"j1""#, true),
            (r#""gen":2}"#, r#""gen":3}"#, true),
            (r#"{"name":"i3"}"#, r#"{"name":"i3","rv":"4"}"#, true),
            (r#",{"name":"i3"}"#, "", true),
            (r#"{"name":"i1","rv":"1"}"#, "null", true),
            (r#""items":[{"name":"i1","rv":"1"},"#, r#""items":["#, true),
            // Members removed or added: the rest of their object is matched by name.
            (r#","status":{"name":"s","gen":1}"#, "", true),
            (r#""name":"s","#, "", true),
            (r#""metadata":{"name":"a","#, r#""metadata":{"#, true),
            (r#""rv":"10","labels""#, r#""labels""#, true),
            (r#""node":"n","inner":{"name":"x"#, r#""inner":{"name":"x"#, true),
            // A member named twice (the new one here, the old one back).
            (r#""spec":{"#, r#""spec":{"note":"first","#, false),
            // What the schema does not have: neither encodes.
            (r#""gen":3}"#, r#""gen":3,"unknown":1}"#, false),
        ];
        for (from, to, walks) in edits {
            let v = base.replacen(from, to, 1);
            assert_ne!(v, base, "{from}");
            assert_eq!((check(&s, &base, &v), check(&s, &v, &base)), (walks, walks), "{from} → {to}");
        }
        // Two changes far apart, and none at all.
        let two = base.replacen(r#""rv":"10""#, r#""rv":"12""#, 1).replacen(r#""gen":1}"#, r#""gen":5}"#, 1);
        assert!(check(&s, &base, &two));
        assert!(check(&s, &base, &base));
    }

    #[test]
    fn gives_up_where_it_cannot_tell() {
        let s = schema();
        let base = r#"{"metadata":{"name":"a","rv":"1"},"spec":{"node":"n"}}"#;
        // An escaped key.
        assert!(!check(&s, base, &base.replace(r#""node":"n""#, r#""no\u0064e":"m""#)));
        // The old text named a member twice: its encoding holds the later one.
        let twice = base.replace(r#""rv":"1""#, r#""rv":"1","name":"b""#);
        assert!(!check(&s, &twice, &twice.replace(r#""rv":"1""#, r#""rv":"2""#)));
        // A trailing comma (JSON has none), at the end of an object, of the top level, of a list's
        // element.
        assert!(!check(&s, base, &base.replace(r#""rv":"1"}"#, r#""rv":"1",}"#)));
        assert!(!check(&s, base, &base.replace(r#""rv":"1"}"#, r#""rv":"2",}"#)));
        assert!(!check(&s, base, &base.replace(r#""node":"n"}}"#, r#""node":"n"},}"#)));
        let listed = r#"{"spec":{"items":[{"name":"a","rv":"1"}]}}"#;
        assert!(!check(&s, listed, &listed.replace(r#""rv":"1""#, "")));
        // Something after the object.
        assert!(!check(&s, base, &format!("{base}x")));
        assert!(!check(&s, base, &format!("{} }}", base.replace(r#""rv":"1""#, r#""rv":"2""#))));
        // Not an object where the schema has one.
        assert!(!check(&s, base, &base.replace(r#"{"node":"n"}"#, "[]")));
    }
}
