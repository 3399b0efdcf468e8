//! JSON → protobuf for a new version of an object whose JSON differs from the previous one's
//! only inside scalar values (a `resourceVersion`, a `restartCount`, a condition's time, a
//! label's or an annotation's value): the previous encoding with those fields' entries (a map's
//! entries) encoded again and the lengths of the messages holding them written again. Nothing
//! else is encoded, and nothing after the last difference is read but by one comparison of
//! bytes.
//!
//! The old text is read member by member from its start, as far as the last difference: a
//! member before the next difference is stepped over (its value delimited, not decoded); the one
//! holding it is entered when it is a message (or a list of messages, at the element holding
//! it), else it must be a scalar, whose new value (same start, delimited in the new text) is
//! encoded as a fresh encoding would encode it, or a map of strings, whose changed values' entries
//! are encoded again (the entries are its members one for one: Go writes both sorted by key; each
//! changed entry's key is checked, and their number). After it the texts are compared again to
//! the next difference. Any difference elsewhere (a key, a comma, a value that becomes an object
//! or null, a list of scalars) gives up, and the caller walks the versions (`proto::window`).
//!
//! Exact for the reasons `proto::window` is: a field's entries depend only on its member's JSON,
//! a message's encoding is its fields' entries in number order, and an enclosing entry's only
//! other bytes are its tag and its body's length. It gives up where those do not hold (a message
//! with inline fields, a previous JSON that named a member twice, a scalar field whose previous
//! encoding has no entry). The result is not copied together: it is the previous encoding's
//! ranges and the edits between them ([`Spliced`]), which the watch frame copies once.
//!
//! Pure; called by `proto::ProtoType::encode_edit` before the walk.

use bytes::Bytes;

use super::after::{member_key, raw, string_end, value_end, ws, Fields, Parts};
use super::schema::{Card, Field, Scalar, Schema, Ty};
use super::transcode::{field_for, plain_message, single, Cx, Out, Rope};
use super::window::{common_prefix, walkable};
use super::wire;

/// The message `msg` of the object whose body (its JSON after the opening `{`) is `new`, from
/// `old`'s body and encoding. `None`: a difference outside scalar values, or nothing changed.
pub fn object_splice<'p>(
    schema: &'p Schema,
    msg: usize,
    new: &'p Bytes,
    old: &'p Bytes,
    minor: u32,
    prior: &'p Rope,
) -> Option<Spliced<'p>> {
    if prior.repeated {
        return None;
    }
    let first = common_prefix(new, old);
    if first == new.len() && first == old.len() {
        return None;
    }
    let cx = Cx::new(schema, minor, new, Some((new, 0)));
    let mut s = Splice {
        cx: &cx,
        parts: Parts::of(prior),
        new,
        old,
        d: 0,
        next: Some(first),
        grown: 0,
        edits: Vec::with_capacity(4),
    };
    match s.object(msg, 0, (0, prior.len()))? {
        Step::Done => {}
        Step::Closed(_) => return None,
    }
    s.edits.sort_unstable_by_key(|e| e.0);
    let len = prior.len().checked_add_signed(s.grown)?;
    Some(Spliced { parts: s.parts, edits: s.edits, prior_len: prior.len(), len })
}

/// A new version's message as the previous version's encoding with some of its ranges
/// replaced: written out by its pieces, which a watch frame copies once (no buffer of its own).
pub struct Spliced<'p> {
    parts: Parts<'p>,
    /// Ranges of the previous encoding and what replaces them, in order, apart.
    edits: Vec<(usize, usize, Out)>,
    prior_len: usize,
    len: usize,
}

impl Spliced<'_> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The message's bytes in order, appended to `out`: the previous encoding's between the
    /// edits, and each edit's.
    pub fn pieces_into<'s>(&'s self, out: &mut Vec<&'s [u8]>) {
        let mut at = 0;
        for (start, end, edit) in &self.edits {
            out.extend(self.parts.slices((at, *start)));
            out.extend(edit.slices());
            at = *end;
        }
        out.extend(self.parts.slices((at, self.prior_len)));
    }

    /// Its bytes in one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut pieces = Vec::new();
        self.pieces_into(&mut pieces);
        pieces.concat()
    }
}

struct Splice<'c, 'a> {
    cx: &'c Cx<'a>,
    parts: Parts<'a>,
    new: &'a Bytes,
    old: &'a Bytes,
    /// Where the new text is ahead of the old one past the values replaced so far.
    d: isize,
    /// The next difference, in the old text; `None`: the rest of both texts is the same.
    next: Option<usize>,
    /// How many bytes the encoding grew by (negative: shrank) with the edits so far.
    grown: isize,
    /// Ranges of the previous encoding and what replaces them.
    edits: Vec<(usize, usize, Out)>,
}

/// What follows a member or an element.
enum Sep {
    /// A comma: the next one starts here.
    Next(usize),
    /// The end of the object or list: just after it.
    Close(usize),
}

/// How an object's reading ended.
enum Step {
    /// At its closing brace, just after it in the old text.
    Closed(usize),
    /// No difference is left: nothing more is read.
    Done,
}

impl<'a> Splice<'_, 'a> {
    /// The members of message `idx` from `o` in the old text (just after the object's `{`);
    /// `enc`: the range of the old encoding holding the message's fields.
    fn object(&mut self, idx: usize, mut o: usize, enc: (usize, usize)) -> Option<Step> {
        let old: &[u8] = self.old;
        let mut fields = Fields::new(enc);
        o = ws(old, o);
        if old.get(o) == Some(&b'}') {
            self.same_until(o + 1)?;
            return Some(Step::Closed(o + 1));
        }
        loop {
            let Some(next) = self.next else { return Some(Step::Done) };
            let (key, vo) = member_key(old, o)?;
            // The key is the same in both; an object's or a list's first byte too.
            (next >= vo).then_some(())?;
            let cx = self.cx;
            let m = &cx.s.messages[idx];
            let c = old[vo];
            (next > vo || !matches!(c, b'{' | b'[')).then_some(())?;
            let f = match c {
                b'{' | b'[' => field_for(cx.s, m, key),
                _ => None,
            };
            let sub = f.and_then(|f| plain_message(cx.s, f).map(|i| (f, i)));
            let end = match (c, sub) {
                (b'{', Some((f, i)))
                    if matches!(f.card, Card::One | Card::Opt) && walkable(&cx.s.messages[i]) =>
                {
                    // Entered: the next difference may be in it (if not, its end is found so).
                    let (start, end) = self.run(idx, &mut fields, f.number)?;
                    let body = self.parts.body(start, end)?;
                    match self.entry(i, vo + 1, (start, end), body)? {
                        Step::Closed(e) => e,
                        Step::Done => return Some(Step::Done),
                    }
                }
                (b'[', Some((f, i))) if f.card == Card::Rep && walkable(&cx.s.messages[i]) => {
                    let eo = value_end(old, vo)?;
                    if next >= eo {
                        eo
                    } else {
                        let run = self.run(idx, &mut fields, f.number)?;
                        match self.list(i, vo, run)? {
                            Step::Closed(e) => e,
                            Step::Done => return Some(Step::Done),
                        }
                    }
                }
                (b'{', None) if f.is_some_and(|f| f.card == Card::Map) => {
                    let eo = value_end(old, vo)?;
                    if next >= eo {
                        eo
                    } else {
                        let f = f?;
                        let run = self.run(idx, &mut fields, f.number)?;
                        self.map(f, vo, run)?;
                        if self.next.is_none() {
                            return Some(Step::Done);
                        }
                        eo
                    }
                }
                (b'{' | b'[', _) => {
                    let eo = value_end(old, vo)?;
                    (next >= eo).then_some(())?;
                    eo
                }
                _ => {
                    let eo = if c == b'"' { string_end(old, vo)? } else { value_end(old, vo)? };
                    // A number or a literal may go on in the new text where the old one ends.
                    let same = if c == b'"' { next >= eo } else { next > eo };
                    if same {
                        eo
                    } else {
                        self.scalar(idx, key, vo, eo, &mut fields)?;
                        if self.next.is_none() {
                            return Some(Step::Done);
                        }
                        eo
                    }
                }
            };
            match self.after_value(end, b'}')? {
                Sep::Next(member) => o = member,
                Sep::Close(after) => return Some(Step::Closed(after)),
            }
        }
    }

    /// The elements of the list of messages `idx` at `vo` in the old text, whose entries in the
    /// old encoding are `run`: the one holding the next difference is entered, the others
    /// stepped over.
    fn list(&mut self, idx: usize, vo: usize, run: (usize, usize)) -> Option<Step> {
        let old: &[u8] = self.old;
        let entries = self.parts.entries(run)?;
        let mut o = ws(old, vo + 1);
        for (k, &entry) in entries.iter().enumerate() {
            let Some(next) = self.next else { return Some(Step::Done) };
            (old.get(o) == Some(&b'{') && next > o).then_some(())?;
            let eo = value_end(old, o)?;
            let end = if next >= eo {
                eo
            } else {
                let body = self.parts.body(entry.0, entry.1)?;
                match self.entry(idx, o + 1, entry, body)? {
                    Step::Closed(e) => e,
                    Step::Done => return Some(Step::Done),
                }
            };
            match (self.after_value(end, b']')?, k + 1 == entries.len()) {
                (Sep::Next(element), false) => o = element,
                (Sep::Close(after), true) => return Some(Step::Closed(after)),
                _ => return None,
            }
        }
        None
    }

    /// Message `idx` held by the entry `entry` of the old encoding (its body `body`), from `o`
    /// in the old text: read, then the entry's length written again if its body changed size.
    fn entry(&mut self, idx: usize, o: usize, entry: (usize, usize), body: (usize, usize)) -> Option<Step> {
        let before = self.grown;
        let step = self.object(idx, o, body)?;
        let grown = self.grown - before;
        if grown != 0 {
            let len = u64::try_from(body.1 as isize - body.0 as isize + grown).ok()?;
            // The entry's tag, then its length, then its body.
            let mut at = entry.0;
            self.parts.varint(&mut at)?;
            let mut out = Out::default();
            wire::varint(&mut out, len);
            self.grown += out.len() as isize - (body.0 - at) as isize;
            self.edits.push((at, body.0, out));
        }
        Some(step)
    }

    /// The scalar member `key` of message `idx` whose old value is `vo..eo` and holds the next
    /// difference: its new value encoded in place of its old entry.
    fn scalar(&mut self, idx: usize, key: &str, vo: usize, eo: usize, fields: &mut Fields) -> Option<()> {
        let cx = self.cx;
        let f = field_for(cx.s, &cx.s.messages[idx], key)
            .filter(|f| matches!(f.card, Card::One | Card::Opt) && plain_message(cx.s, f).is_none())?;
        (self.old[vo] != b'n').then_some(())?;
        let (en, text) = self.new_value(vo)?;
        let (start, end) = self.run(idx, fields, f.number)?;
        (end > start).then_some(())?;
        let mut out = Out::default();
        single(cx, f.number, &f.ty, Some(raw(text).ok()?), &mut out).ok()?;
        self.replace((start, end), out, en, eo);
        Some(())
    }

    /// The map field `f` whose old value is the object at `vo` (its entries in the old encoding
    /// are `run`), holding the next difference: each entry whose value changed encoded again.
    /// Only values may differ, scalars both; the map's members and its entries are then the
    /// same keys in the same order (Go writes both sorted), which each changed entry's key
    /// confirms, and as many (no key twice).
    fn map(&mut self, f: &Field, vo: usize, run: (usize, usize)) -> Option<()> {
        let Ty::Map(Scalar::String, value_ty) = &f.ty else { return None };
        let (cx, old) = (self.cx, self.old);
        let entries = self.parts.entries(run)?;
        let mut o = ws(old, vo + 1);
        let mut i = 0;
        if old.get(o) == Some(&b'}') {
            return None;
        }
        loop {
            let (key, v) = member_key(old, o)?;
            let c = *old.get(v)?;
            (self.next.is_none_or(|n| n >= v) && !matches!(c, b'{' | b'[' | b'n')).then_some(())?;
            let ve = if c == b'"' { string_end(old, v)? } else { value_end(old, v)? };
            if self.next.is_some_and(|n| n < ve || (n == ve && c != b'"')) {
                let entry = *entries.get(i)?;
                self.entry_key(entry, key)?;
                let (en, text) = self.new_value(v)?;
                let mut body = Out::default();
                wire::len_field(&mut body, 1, key.as_bytes());
                single(cx, 2, value_ty, Some(raw(text).ok()?), &mut body).ok()?;
                let mut out = Out::default();
                out.message_field(f.number, body);
                self.replace(entry, out, en, ve);
            }
            i += 1;
            match self.after_value(ve, b'}')? {
                Sep::Next(member) => o = member,
                Sep::Close(_) => break,
            }
        }
        (i == entries.len()).then_some(())
    }

    /// The map entry `entry` of the old encoding has the key `key` (its field 1).
    fn entry_key(&self, entry: (usize, usize), key: &str) -> Option<()> {
        let (mut pos, end) = self.parts.body(entry.0, entry.1)?;
        (self.parts.varint(&mut pos)? == u64::from(1u32 << 3 | u32::from(wire::LEN))).then_some(())?;
        let len = usize::try_from(self.parts.varint(&mut pos)?).ok()?;
        (len == key.len() && pos + len <= end).then_some(())?;
        let mut rest = key.as_bytes();
        for piece in self.parts.slices((pos, pos + len)) {
            let (head, tail) = rest.split_at_checked(piece.len())?;
            (head == piece).then_some(())?;
            rest = tail;
        }
        rest.is_empty().then_some(())
    }

    /// The old encoding's `range` replaced by `out`, for a value that ended at `eo` in the old
    /// text and ends at `en` in the new one; then the next difference after it, if any.
    fn replace(&mut self, (start, end): (usize, usize), out: Out, en: usize, eo: usize) {
        let new = self.new;
        self.grown += out.total() as isize - (end - start) as isize;
        self.edits.push((start, end, out));
        self.d = en as isize - eo as isize;
        let k = common_prefix(&new[en..], &self.old[eo..]);
        self.next = (en + k < new.len() || eo + k < self.old.len()).then_some(eo + k);
    }

    /// The new text's value where the old one's starts at `vo` (they differ in it): where it
    /// ends, and its text. `None` unless it is a scalar (not an object, a list or null).
    fn new_value(&self, vo: usize) -> Option<(usize, &'a str)> {
        let new: &'a [u8] = self.new;
        let vn = vo.checked_add_signed(self.d)?;
        (!matches!(new.get(vn), Some(b'{' | b'[' | b'n'))).then_some(())?;
        let en = value_end(new, vn)?;
        Some((en, std::str::from_utf8(new.get(vn..en)?).ok()?))
    }

    /// What follows a value ending at `end` in the old text, the same in the new one: a comma
    /// or `close` (the object's or the list's end).
    fn after_value(&self, end: usize, close: u8) -> Option<Sep> {
        let o = ws(self.old, end);
        let c = *self.old.get(o)?;
        self.same_until(o + 1)?;
        match c {
            b',' => Some(Sep::Next(ws(self.old, o + 1))),
            c if c == close => Some(Sep::Close(o + 1)),
            _ => None,
        }
    }

    /// The old text's bytes before `end` are the new one's too.
    fn same_until(&self, end: usize) -> Option<()> {
        self.next.is_none_or(|n| n >= end).then_some(())
    }

    /// Where field `number` of message `idx` is in the old encoding (read as far as that).
    fn run(&self, idx: usize, fields: &mut Fields, number: u32) -> Option<(usize, usize)> {
        walkable(&self.cx.s.messages[idx]).then_some(())?;
        fields.run(&self.parts, number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::transcode::object_shared;
    use crate::proto::window::tests::{base, schema};

    /// The splice's result, when it gives one, is the fresh encoding (its bytes and length); whether
    /// it gave one is returned.
    fn check(s: &Schema, old: &str, new: &str) -> bool {
        let msg = s.message("t.Obj").unwrap();
        let body = |t: &str| Bytes::from(t.strip_prefix('{').unwrap().to_owned());
        let (old_b, new_b) = (body(old), body(new));
        let Ok(prior) = object_shared(s, msg, old.as_bytes(), &old_b, 1, 99) else { return false };
        let fresh = object_shared(s, msg, new.as_bytes(), &new_b, 1, 99);
        let Some(edit) = object_splice(s, msg, &new_b, &old_b, 99, &prior) else { return false };
        let fresh = fresh.unwrap_or_else(|e| panic!("spliced what a fresh encoding refuses ({e}): {new}"));
        assert_eq!(edit.to_vec(), fresh.to_vec(), "{old}\n→ {new}");
        assert_eq!(edit.len(), fresh.len(), "its length: {new}");
        true
    }

    #[test]
    fn scalars_changed_anywhere_give_the_fresh_encoding() {
        let s = schema();
        let base = base();
        let long = "x".repeat(100);
        let longer = "1".repeat(300);
        // (from, to, whether it is spliced, both ways).
        let edits = [
            (r#""rv":"10""#, r#""rv":"11""#, true),
            (r#""rv":"10""#, r#""rv":"9""#, true),
            (r#""rv":"10""#, r#""rv":"1000""#, true),
            // The bodies of metadata and of the top level cross a varint's size.
            (r#""rv":"10""#, &format!(r#""rv":"{longer}""#), true),
            (r#""rv":"10""#, r#""rv":"\u0031""#, true),
            (r#""gen":3"#, r#""gen":4"#, true),
            // A number that goes on where the old one ends.
            (r#""gen":3"#, r#""gen":30"#, true),
            (r#""node":"n""#, r#""node":"m""#, true),
            (r#""rv":"1"}"#, r#""rv":"2"}"#, true),
            (r#","gen":1}}"#, r#","gen":2}}"#, true),
            // Long strings, changed and moved.
            (&format!(r#""note":"{long}""#), &format!(r#""note":"y{long}""#), true),
            (&format!(r#""name":"{long}","rv""#), &format!(r#""name":"{long}z","rv""#), true),
            // In a list of messages: its first element, one in the middle.
            (r#""name":"i1""#, r#""name":"j1""#, true),
            (r#""gen":2}"#, r#""gen":3}"#, true),
            // A map's value (a long one).
            (r#""k":"x"#, r#""k":"y"#, true),
            // Not scalars: a list of strings, values that become null or an object, members added
            // or removed, an element added.
            (r#""list":["a","b"]"#, r#""list":["a","c"]"#, false),
            (r#""list":["a","b"]"#, r#""list":["a"]"#, false),
            (r#""status":{"name":"s","gen":1}"#, r#""status":null"#, false),
            (r#""node":"n""#, r#""node":null"#, false),
            (r#""node":"n""#, r#""node":{}"#, false),
            (r#""name":"s","#, "", false),
            (r#""rv":"10","labels""#, r#""labels""#, false),
            (r#"{"name":"i3"}"#, r#"{"name":"i3","rv":"4"}"#, false),
            (r#",{"name":"i3"}"#, "", false),
        ];
        for (from, to, spliced) in edits {
            let v = base.replacen(from, to, 1);
            assert_ne!(v, base, "{from}");
            assert_eq!((check(&s, &base, &v), check(&s, &v, &base)), (spliced, spliced), "{from} → {to}");
        }
        // Changes far apart, at three depths, growing and shrinking.
        let three = base
            .replacen(r#""rv":"10""#, r#""rv":"123456""#, 1)
            .replacen(r#""rv":"1"}"#, r#""rv":"2"}"#, 1)
            .replacen(r#""gen":2}"#, r#""gen":20000}"#, 1)
            .replacen(r#""gen":1}"#, r#""gen":5}"#, 1);
        assert!(check(&s, &base, &three));
        assert!(check(&s, &three, &base));
        // Nothing changed: left to the walk.
        assert!(!check(&s, &base, &base));
    }

    #[test]
    fn a_maps_values_are_spliced_by_their_keys() {
        let s = schema();
        let base = r#"{"metadata":{"name":"a","labels":{"a":"1","b":"2","c":"3"},"gen":1}}"#;
        for (from, to, spliced) in [
            (r#""b":"2""#, r#""b":"22""#, true),
            (r#""a":"1""#, r#""a":"0""#, true),
            (r#""c":"3"}"#, r#""c":""}"#, true),
            (r#""a":"1","b":"2""#, r#""a":"9","b":"8""#, true),
            // A key changed, added, removed; a value null.
            (r#""b":"2""#, r#""bb":"2""#, false),
            (r#""b":"2""#, r#""b":"2","ba":"x""#, false),
            (r#""b":"2","#, "", false),
            (r#""b":"2""#, r#""b":null"#, false),
        ] {
            let v = base.replacen(from, to, 1);
            assert_eq!((check(&s, base, &v), check(&s, &v, base)), (spliced, spliced), "{from} → {to}");
        }
        // Members not in Go's order, or a key twice: the entries are not the members one for one.
        let unsorted = r#"{"metadata":{"labels":{"b":"2","a":"1"}}}"#;
        assert!(!check(&s, unsorted, &unsorted.replace(r#""a":"1""#, r#""a":"0""#)));
        let twice = r#"{"metadata":{"labels":{"a":"1","a":"2"}}}"#;
        assert!(!check(&s, twice, &twice.replace(r#""a":"1""#, r#""a":"0""#)));
        assert!(!check(&s, twice, &twice.replace(r#""a":"2""#, r#""a":"0""#)));
    }

    #[test]
    fn gives_up_where_a_difference_is_not_in_a_scalar() {
        let s = schema();
        let base = r#"{"metadata":{"name":"a","rv":"1"},"spec":{"node":"n"}}"#;
        // A key changed, an escaped key.
        assert!(!check(&s, base, &base.replace(r#""rv":"1""#, r#""gen":1"#)));
        assert!(!check(&s, base, &base.replace(r#""node":"n""#, r#""no\u0064e":"m""#)));
        // The old text named a member twice: its encoding holds the later one.
        let twice = base.replace(r#""rv":"1""#, r#""rv":"1","name":"b""#);
        assert!(!check(&s, &twice, &twice.replace(r#""rv":"1""#, r#""rv":"2""#)));
        // A trailing comma, something after the object.
        assert!(!check(&s, base, &base.replace(r#""rv":"1"}"#, r#""rv":"2",}"#)));
        assert!(!check(&s, base, &format!("{}x", base.replace(r#""rv":"1""#, r#""rv":"2""#))));
        assert!(!check(&s, base, &format!("{base} ")));
        // A value that is not JSON, a number that is not the field's type.
        assert!(!check(&s, base, &base.replace(r#""rv":"1""#, r#""rv":"1\x""#)));
        let gen = r#"{"metadata":{"name":"a","gen":1}}"#;
        assert!(!check(&s, gen, &gen.replace(r#""gen":1"#, r#""gen":1.5"#)));
        assert!(!check(&s, gen, &gen.replace(r#""gen":1"#, r#""gen":1x"#)));
    }
}
