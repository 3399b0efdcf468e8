//! JSON → protobuf, as the apiserver would have encoded the same object: the JSON it sent is
//! read against the schema and written the way gogo's generated `MarshalToSizedBuffer` writes
//! the Go struct it came from (fields in ascending number order, non-pointer fields always —
//! zero values included —, pointers only when set, map keys sorted, repeated fields unpacked).
//! The special types (Time, MicroTime, Quantity, IntOrString, raw JSON, …) follow their
//! hand-written Marshal.
//!
//! Anything the schema does not know (a member of a newer API version, a value of the wrong
//! JSON type) is [`Unsupported`]: the caller then does not serve protobuf for it, it never
//! guesses. Pure; called by `proto::Encoder` once per object version (`proto::after` encodes a new
//! version with its predecessor's encoding, through this file's reading and encoding).

use std::borrow::Cow;
use std::fmt;

use base64::Engine;
use bytes::{Bytes, BytesMut};
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::schema::{Card, Field, Message, Scalar, Schema, Special, Ty};
use super::wire;

/// Why an object cannot be transcoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported(pub String);

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

type R<T> = Result<T, Unsupported>;

fn unsupported<T>(what: impl Into<String>) -> R<T> {
    Err(Unsupported(what.into()))
}

/// The encoded message `msg` of the JSON object `json` (a whole object as the apiserver sent
/// it: `kind` and `apiVersion` are TypeMeta, which protobuf carries in its envelope, or not at
/// all for an embedded object).
/// Fields added after Kubernetes 1.`minor` are not written ([`super::NEWEST`]: all).
pub fn object(schema: &Schema, msg: usize, json: &[u8], minor: u32) -> R<Vec<u8>> {
    let cx = Cx::new(schema, minor, json, None);
    Ok(encode_object(&cx, msg)?.into_rope().to_vec())
}

/// The same, as a [`Rope`] whose long strings and raw JSON (managedFields' `fieldsV1`, large
/// annotations, ConfigMap data) are shared with `stored` instead of copied: `json` is
/// `prefix_len` bytes followed by `stored` (the object's bytes as the cache keeps them).
pub fn object_shared(
    schema: &Schema,
    msg: usize,
    json: &[u8],
    stored: &Bytes,
    prefix_len: usize,
    minor: u32,
) -> R<Rope> {
    let cx = Cx::new(schema, minor, json, Some((stored, prefix_len)));
    let mut rope = encode_object(&cx, msg)?.into_rope();
    rope.repeated = cx.repeated.get();
    Ok(rope)
}

fn encode_object(cx: &Cx, msg: usize) -> R<Out> {
    let json = std::str::from_utf8(cx.json).map_err(|e| Unsupported(format!("not UTF-8: {e}")))?;
    let members = read_object(cx, msg, json)?;
    encode_read(cx, &cx.s.messages[msg], members)
}

/// Strings at least this long are shared with the stored JSON rather than copied (a part costs
/// a `Bytes`, 32 bytes).
pub(super) const SHARE_MIN: usize = 64;

/// What a transcoding reads: the schema, the upstream's version, the JSON and, when the result
/// may share bytes with it, the stored bytes the JSON ends with.
pub(super) struct Cx<'a> {
    pub(super) s: &'a Schema,
    pub(super) minor: u32,
    pub(super) json: &'a [u8],
    pub(super) stored: Option<(&'a Bytes, usize)>,
    /// Set when an object had a member twice ([`Rope::repeated`]).
    pub(super) repeated: std::cell::Cell<bool>,
    /// Messages being encoded, one inside the other ([`MAX_DEPTH`]).
    pub(super) depth: std::cell::Cell<usize>,
}

/// Messages nested deeper than this are Unsupported (the object is then forwarded in protobuf,
/// as any the transcoder cannot encode). Each level reads its members with a
/// `serde_json::Deserializer` of its own, taking map values and slice elements as `RawValue`s,
/// which serde_json scans without its recursion limit: without this bound a CRD whose schema
/// nests `properties` thousands deep would recurse until the worker's stack overflows, which
/// aborts the process. Real objects nest a few dozen deep (a CRD's schema).
pub(super) const MAX_DEPTH: usize = 100;

impl<'a> Cx<'a> {
    pub(super) fn new(
        s: &'a Schema,
        minor: u32,
        json: &'a [u8],
        stored: Option<(&'a Bytes, usize)>,
    ) -> Cx<'a> {
        Cx { s, minor, json, stored, repeated: Default::default(), depth: Default::default() }
    }
}

impl Cx<'_> {
    /// `part` (a slice of `self.json`) as a slice of the stored bytes, if it lies in them.
    pub(super) fn shared(&self, part: &[u8]) -> Option<Bytes> {
        let (stored, prefix) = self.stored?;
        let base = self.json.as_ptr() as usize;
        let at = (part.as_ptr() as usize).checked_sub(base + prefix)?;
        stored.get(at..at + part.len())?;
        Some(stored.slice(at..at + part.len()))
    }
}

/// Protobuf bytes in parts (see [`object_shared`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rope {
    parts: RopeParts,
    len: usize,
    /// Some object of the JSON had a member twice (the last one was encoded, as Go's decoder
    /// keeps it): `proto::after` then does not take members from it by their place.
    pub(super) repeated: bool,
}

impl Rope {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn parts(&self) -> &[Bytes] {
        match &self.parts {
            RopeParts::One(one) => std::slice::from_ref(one),
            RopeParts::Many(many) => many,
        }
    }

    /// Bytes of the rope's own list of parts (none when it has one part).
    pub fn list_bytes(&self) -> usize {
        match &self.parts {
            RopeParts::One(_) => 0,
            RopeParts::Many(many) => many.capacity() * std::mem::size_of::<Bytes>(),
        }
    }

    /// The bytes in one buffer (one part: no copy).
    pub fn to_bytes(&self) -> Bytes {
        match self.parts() {
            [] => Bytes::new(),
            [one] => one.clone(),
            parts => Bytes::from(parts.concat()),
        }
    }

    /// A message kept as `one`, a buffer holding exactly its bytes (a slice of the watch frame
    /// it was written into); `repeated` as [`Rope::repeated`].
    pub fn in_one(one: Bytes, repeated: bool) -> Rope {
        Rope { len: one.len(), parts: RopeParts::One(one), repeated }
    }

    /// Some object of the JSON had a member twice.
    pub fn repeated(&self) -> bool {
        self.repeated
    }

    pub fn to_vec(&self) -> Vec<u8> {
        self.parts().concat()
    }

    /// Bytes kept by this rope itself (the shared parts belong to the stored JSON).
    pub fn own_bytes(&self, stored: &Bytes) -> usize {
        let range = stored.as_ptr() as usize..stored.as_ptr() as usize + stored.len();
        self.parts().iter().filter(|p| !range.contains(&(p.as_ptr() as usize))).map(Bytes::len).sum()
    }
}

/// A rope's parts: one buffer (a message kept as the slice of its watch frame, or copied
/// whole) is held in place, not in a list of its own — one allocation fewer to make and, when
/// the version leaves the history, to free.
#[derive(Clone, Debug, PartialEq, Eq)]
enum RopeParts {
    One(Bytes),
    Many(Vec<Bytes>),
}

impl Default for RopeParts {
    fn default() -> RopeParts {
        RopeParts::Many(Vec::new())
    }
}

/// A message being written: copied bytes in `cur` (what the wire functions write into, through
/// `DerefMut`), finished parts before it — copied runs and shared slices alternating, so that a
/// rope has 2k+1 parts for k shared strings however deep they sit.
///
/// Its buffers come from a per-thread pool and go back to it when the message has been copied
/// into its parent (see [`pool`]): a transcode allocates its result, not a buffer per nested
/// message.
pub(super) struct Out {
    parts: Vec<Part>,
    parts_len: usize,
    cur: Vec<u8>,
}

impl Default for Out {
    fn default() -> Out {
        Out { parts: pool::parts(), parts_len: 0, cur: pool::bytes() }
    }
}

impl Drop for Out {
    fn drop(&mut self) {
        for p in self.parts.drain(..) {
            if let Part::Owned(v) = p {
                pool::give_bytes(v);
            }
        }
        pool::give_parts(std::mem::take(&mut self.parts));
        pool::give_bytes(std::mem::take(&mut self.cur));
    }
}

/// Buffers reused by the transcodes of one thread. A nested message's body is written into one,
/// copied into its parent's, and the buffer is given back: after the first transcodes a thread
/// allocates no output buffer per nested message (each object's list of members, and the rope
/// returned, still are allocations). Bounded: at most [`pool::KEEP`] buffers of each
/// kind, none larger than [`pool::MAX_BYTES`] (about 1 MiB per thread at the very most; a pod
/// keeps a dozen small ones).
mod pool {
    use std::cell::RefCell;

    use super::Part;

    /// Buffers kept per thread, of each kind (a message's nesting depth needs about as many).
    pub const KEEP: usize = 32;
    /// A larger byte buffer (a big object's top level) is freed, not kept.
    pub const MAX_BYTES: usize = 16 * 1024;

    thread_local! {
        pub(super) static BYTES: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
        static PARTS: RefCell<Vec<Vec<Part>>> = const { RefCell::new(Vec::new()) };
    }

    pub fn bytes() -> Vec<u8> {
        BYTES.with_borrow_mut(Vec::pop).unwrap_or_default()
    }

    pub fn give_bytes(mut v: Vec<u8>) {
        if v.capacity() == 0 || v.capacity() > MAX_BYTES {
            return;
        }
        v.clear();
        BYTES.with_borrow_mut(|p| {
            if p.len() < KEEP {
                p.push(v);
            }
        });
    }

    pub fn parts() -> Vec<Part> {
        PARTS.with_borrow_mut(Vec::pop).unwrap_or_default()
    }

    pub fn give_parts(mut v: Vec<Part>) {
        if v.capacity() == 0 || v.capacity() > MAX_BYTES / 32 {
            return;
        }
        v.clear();
        PARTS.with_borrow_mut(|p| {
            if p.len() < KEEP {
                p.push(v);
            }
        });
    }
}

enum Part {
    Owned(Vec<u8>),
    Shared(Bytes),
}

impl std::ops::Deref for Out {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.cur
    }
}

impl std::ops::DerefMut for Out {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.cur
    }
}

impl Out {
    pub(super) fn total(&self) -> usize {
        self.parts_len + self.cur.len()
    }

    /// The bytes written so far, in order, as slices of its parts.
    pub(super) fn slices(&self) -> impl Iterator<Item = &[u8]> {
        let parts = self.parts.iter().map(|p| match p {
            Part::Owned(v) => &v[..],
            Part::Shared(b) => &b[..],
        });
        parts.chain(std::iter::once(&self.cur[..]))
    }

    fn flush(&mut self) {
        if !self.cur.is_empty() {
            let cur = std::mem::replace(&mut self.cur, pool::bytes());
            self.parts_len += cur.len();
            self.parts.push(Part::Owned(cur));
        }
    }

    pub(super) fn share(&mut self, b: Bytes) {
        self.flush();
        self.parts_len += b.len();
        self.parts.push(Part::Shared(b));
    }

    /// Field `number`, length-delimited, holding `child` (its copied runs join ours).
    pub(super) fn message_field(&mut self, number: u32, child: Out) {
        wire::tag(self, number, wire::LEN);
        wire::varint(self, child.total() as u64);
        self.append(child);
    }

    /// `child`'s bytes, as they are (fields already encoded).
    pub(super) fn append(&mut self, mut child: Out) {
        for p in child.parts.drain(..) {
            match p {
                Part::Owned(v) => {
                    self.cur.extend_from_slice(&v);
                    pool::give_bytes(v);
                }
                Part::Shared(b) => self.share(b),
            }
        }
        self.cur.extend_from_slice(&child.cur);
        // `child`'s buffers go back to the pool.
    }

    /// Field `number`, length-delimited, holding `data` (a slice of the JSON): shared when
    /// long and in the stored bytes, else copied.
    fn bytes_field(&mut self, cx: &Cx, number: u32, data: &[u8]) {
        match cx.shared(data).filter(|_| data.len() >= SHARE_MIN) {
            Some(b) => {
                wire::tag(self, number, wire::LEN);
                wire::varint(self, b.len() as u64);
                self.share(b);
            }
            None => wire::len_field(self, number, data),
        }
    }

    /// The finished message. Copied runs are copied once more, all into one buffer of their
    /// total size (the pooled ones are larger, and a rope is kept with its object version): one
    /// allocation to make and to free per rope, however many strings it shares.
    pub(super) fn into_rope(mut self) -> Rope {
        self.flush();
        let (mut runs, mut copied) = (0, 0);
        for p in &self.parts {
            if let Part::Owned(v) = p {
                runs += 1;
                copied += v.len();
            }
        }
        let mut all = BytesMut::with_capacity(copied);
        for p in &self.parts {
            if let Part::Owned(v) = p {
                all.extend_from_slice(v);
            }
        }
        let parts = self
            .parts
            .drain(..)
            .map(|p| match p {
                Part::Owned(v) => {
                    // The only run takes the buffer whole (no shared header to allocate).
                    let b = if runs == 1 { std::mem::take(&mut all) } else { all.split_to(v.len()) };
                    pool::give_bytes(v);
                    b.freeze()
                }
                Part::Shared(b) => b,
            })
            .collect::<Vec<Bytes>>();
        let parts = if parts.len() == 1 {
            RopeParts::One(parts.into_iter().next().unwrap_or_default())
        } else {
            RopeParts::Many(parts)
        };
        Rope { len: self.parts_len, parts, repeated: false }
    }
}

/// A member's value: as found (`Raw`), or already encoded when its field is a message or a list
/// of messages (read in the same pass as its parent: no object is scanned twice).
pub(super) enum Val<'a> {
    Raw(&'a RawValue),
    /// A message field's body (`None`: JSON null).
    Msg(Option<Out>),
    /// A repeated message field's bodies (`None`: a null list; a `None` element: a null one).
    Msgs(Option<Vec<Option<Out>>>),
    /// The field's whole encoding (tags included), taken from an earlier version whose member
    /// had the same JSON (`proto::after`).
    Encoded(Out),
    /// Written already: its encoding is in an earlier field's `Encoded` bytes (`proto::window`
    /// copies consecutive fields at once).
    Covered,
    Taken,
}

impl Val<'_> {
    fn is_null(&self) -> bool {
        match self {
            Val::Raw(r) => is_null(r),
            Val::Msg(m) => m.is_none(),
            Val::Msgs(m) => m.is_none(),
            Val::Encoded(_) | Val::Covered => false,
            Val::Taken => true,
        }
    }
}

/// The members of a JSON object, values borrowed from the input or encoded; with each, the
/// schema field it sets (found once, as it is read), if any, and whether a field took it.
pub(super) struct Members<'a> {
    pub(super) list: Vec<Member<'a>>,
    /// How many are `used`.
    pub(super) used: usize,
}

pub(super) struct Member<'a> {
    pub(super) key: Cow<'a, str>,
    pub(super) val: Val<'a>,
    pub(super) field: Option<FieldId>,
    pub(super) used: bool,
}

/// A schema field's identity (its address in the schema), compared instead of its JSON name.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct FieldId(usize);

impl FieldId {
    pub(super) fn of(f: &Field) -> FieldId {
        FieldId(std::ptr::from_ref(f) as usize)
    }
}

impl<'a> Members<'a> {
    /// The last member setting `f` (Go's decoder keeps the last), marking every one used.
    /// Sets `repeated` when more than one member sets `f`.
    fn find(&mut self, f: &Field, repeated: &std::cell::Cell<bool>) -> Option<Val<'a>> {
        if self.used == self.list.len() {
            // Every member has found its field: the rest of the message's fields are absent.
            return None;
        }
        let id = Some(FieldId::of(f));
        let mut found = None;
        for (i, m) in self.list.iter_mut().enumerate() {
            if m.field == id {
                if !m.used {
                    m.used = true;
                    self.used += 1;
                }
                if found.is_some() {
                    repeated.set(true);
                }
                found = Some(i);
            }
        }
        found.map(|i| std::mem::replace(&mut self.list[i].val, Val::Taken))
    }
}

/// The field of `m` (or of a message inline in it) that a JSON member `key` sets.
pub(super) fn field_for<'s>(s: &'s Schema, m: &'s Message, key: &str) -> Option<&'s Field> {
    for f in &m.fields {
        if f.inline {
            if let Ty::Message(i) = f.ty {
                if let Some(x) = field_for(s, &s.messages[i], key) {
                    return Some(x);
                }
            }
        } else if f.json == key {
            return Some(f);
        }
    }
    None
}

/// The message a field holds, when it is read as an object (not special, not a JSON array).
pub(super) fn plain_message(s: &Schema, f: &Field) -> Option<usize> {
    match f.ty {
        Ty::Message(i) if s.messages[i].special.is_none() && !s.messages[i].array => Some(i),
        _ => None,
    }
}

/// Reads an object's members for message `m`, encoding the message-valued ones as they come.
fn read_members<'de, A: MapAccess<'de>>(cx: &Cx, m: &Message, mut map: A) -> Result<Members<'de>, A::Error> {
    let mut list = Vec::with_capacity(8);
    while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
        let f = field_for(cx.s, m, &k);
        let val = match f.and_then(|f| plain_message(cx.s, f).map(|i| (f.card, i))) {
            Some((Card::One | Card::Opt, idx)) => Val::Msg(map.next_value_seed(MsgSeed { cx, idx })?),
            Some((Card::Rep, idx)) => Val::Msgs(map.next_value_seed(MsgsSeed { cx, idx })?),
            _ => Val::Raw(map.next_value::<&'de RawValue>()?),
        };
        list.push(Member { key: k, val, field: f.map(FieldId::of), used: false });
    }
    Ok(Members { list, used: 0 })
}

/// Encodes `members` as message `m`; every member must be one of its fields (or TypeMeta).
pub(super) fn encode_read(cx: &Cx, m: &Message, mut members: Members) -> R<Out> {
    let mut out = Out::default();
    encode_members(cx, m, &mut members, &mut out)?;
    // Embedded objects keep their TypeMeta too (a StatefulSet's volumeClaimTemplates).
    if members.used < members.list.len() {
        let unknown = members.list.iter().find(|x| !x.used && x.key != "kind" && x.key != "apiVersion");
        if let Some(x) = unknown {
            return unsupported(format!("{}: unknown member {:?}", m.name, x.key));
        }
    }
    Ok(out)
}

/// A message field's value: its body, `None` for null.
struct MsgSeed<'c, 'a> {
    cx: &'c Cx<'a>,
    idx: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for MsgSeed<'_, '_> {
    type Value = Option<Out>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<Out>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MsgSeed<'_, '_> {
    type Value = Option<Out>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object or null")
    }
    fn visit_unit<E>(self) -> Result<Option<Out>, E> {
        Ok(None)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<Out>, A::Error> {
        let m = &self.cx.s.messages[self.idx];
        let members = read_members(self.cx, m, map)?;
        encode_read(self.cx, m, members).map(Some).map_err(|e| serde::de::Error::custom(e.0))
    }
}

/// A repeated message field's value.
struct MsgsSeed<'c, 'a> {
    cx: &'c Cx<'a>,
    idx: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for MsgsSeed<'_, '_> {
    type Value = Option<Vec<Option<Out>>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MsgsSeed<'_, '_> {
    type Value = Option<Vec<Option<Out>>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array or null")
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(e) = seq.next_element_seed(MsgSeed { cx: self.cx, idx: self.idx })? {
            out.push(e);
        }
        Ok(Some(out))
    }
}

/// A whole object read in one pass as message `msg`.
struct ObjectSeed<'c, 'a> {
    cx: &'c Cx<'a>,
    msg: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for ObjectSeed<'_, '_> {
    type Value = Members<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Members<'de>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ObjectSeed<'_, '_> {
    type Value = Members<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Members<'de>, A::Error> {
        read_members(self.cx, &self.cx.s.messages[self.msg], map)
    }
}

/// Reads `json` (a slice of `cx.json`, checked as UTF-8 once, whole) as message `msg` in one
/// pass.
pub(super) fn read_object<'a>(cx: &Cx, msg: usize, json: &'a str) -> R<Members<'a>> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_str(json);
    let members = ObjectSeed { cx, msg }.deserialize(&mut de).map_err(|e| Unsupported(format!("{e}")))?;
    de.end().map_err(|e| Unsupported(format!("{e}")))?;
    Ok(members)
}

/// The members of a JSON object, values unparsed (map entries); `managed_fields` reads
/// `metadata` with it too.
pub(crate) struct RawMembers<'a>(pub(crate) Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for RawMembers<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = RawMembers<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(Key(k)) = m.next_key::<Key<'de>>()? {
                    out.push((k, m.next_value::<&'de RawValue>()?));
                }
                Ok(RawMembers(out))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// An object key, borrowed when it has no escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Key<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Key<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

/// A value's JSON text (JSON's whitespace is ASCII).
fn text(v: &RawValue) -> &str {
    v.get().trim_ascii()
}

fn is_null(v: &RawValue) -> bool {
    text(v) == "null"
}

fn elements(v: &RawValue) -> R<Vec<&RawValue>> {
    struct Seq<'a>(Vec<&'a RawValue>);
    impl<'de: 'a, 'a> Deserialize<'de> for Seq<'a> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V<'a>(std::marker::PhantomData<&'a ()>);
            impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
                type Value = Seq<'a>;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a JSON array")
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
                    let mut out = Vec::new();
                    while let Some(e) = s.next_element::<&'de RawValue>()? {
                        out.push(e);
                    }
                    Ok(Seq(out))
                }
            }
            d.deserialize_seq(V(std::marker::PhantomData))
        }
    }
    serde_json::from_str::<Seq>(v.get()).map(|s| s.0).map_err(|e| Unsupported(format!("not an array: {e}")))
}

/// Whether `f` holds a meta/v1 `Time` or `MicroTime`, whose zero value Go's JSON writes as
/// `null`.
fn zero_is_null(s: &Schema, f: &Field) -> bool {
    matches!(f.ty, Ty::Message(i) if matches!(s.messages[i].special, Some(Special::Time | Special::MicroTime)))
}

/// Whether the JSON text holds the escape `\ufffd` (any case) — not the text after an escaped
/// backslash (`\\ufffd`, a review: such an annotation turned a resource's protobuf reads
/// upstream for good).
fn escapes_ufffd(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(at) = b[i..].iter().position(|&c| c == b'\\') {
        let e = i + at;
        if b.get(e + 1) == Some(&b'u') && b.get(e + 2..e + 6).is_some_and(|h| h.eq_ignore_ascii_case(b"fffd"))
        {
            return true;
        }
        // Past the escape: `\\`, `\"` and the like are two bytes, `\uXXXX` six (the four are hex).
        i = e + 2;
        if i >= b.len() {
            return false;
        }
    }
    false
}

fn string(v: &RawValue) -> R<Cow<'_, str>> {
    #[derive(Deserialize)]
    struct S<'a>(#[serde(borrow)] Cow<'a, str>);
    // Go's JSON writes a byte that is not UTF-8 as `\ufffd` (a real U+FFFD it writes as is):
    // the string's protobuf holds the byte itself, which the JSON no longer says (a review).
    if escapes_ufffd(v.get()) {
        return Err(Unsupported("a string holding bytes that are not UTF-8".into()));
    }
    serde_json::from_str::<S>(v.get())
        .map(|s| s.0)
        .map_err(|_| Unsupported(format!("not a string: {}", v.get())))
}

/// Writes the fields of `m` read from `members` (an inline field reads the same members).
fn encode_members(cx: &Cx, m: &Message, members: &mut Members, out: &mut Out) -> R<()> {
    if m.special.is_some() || m.array {
        return unsupported(format!("{} as a JSON object", m.name));
    }
    let minor = cx.minor;
    for f in &m.fields {
        if f.inline {
            let Ty::Message(idx) = f.ty else { return unsupported("inline scalar") };
            let before = members.used;
            let mut buf = Out::default();
            encode_members(cx, &cx.s.messages[idx], members, &mut buf)?;
            let absent = members.used == before;
            if absent && (f.card == Card::Opt || f.since > minor) {
                continue;
            }
            out.message_field(f.number, buf);
            continue;
        }
        let v = members.find(f, &cx.repeated);
        if f.card == Card::Opt && matches!(&v, Some(Val::Raw(r)) if is_null(r)) && zero_is_null(cx.s, f) {
            // A pointer to the zero time: Go's JSON writes it `null` (every such field is
            // `omitempty`, so a nil one is absent), its protobuf an empty message (a review).
            out.message_field(f.number, Out::default());
            continue;
        }
        let v = v.filter(|v| !v.is_null());
        if v.is_none() && f.since > minor {
            // A field the upstream's version does not have: it writes nothing for it.
            continue;
        }
        if v.is_none() && f.omitempty {
            // Nil or empty: Go's protobuf writes an empty one (`12 00`), its JSON neither.
            return unsupported(format!("{}.{}: absent, so nil or empty", m.name, f.json));
        }
        match (f.card, v) {
            (Card::One, None) => single(cx, f.number, &f.ty, None, out)?,
            (_, None) => {}
            (_, Some(Val::Msg(Some(body)))) => out.message_field(f.number, body),
            (_, Some(Val::Encoded(encoded))) => out.append(encoded),
            (_, Some(Val::Covered)) => {}
            (Card::Rep, Some(Val::Msgs(Some(list)))) => {
                for body in list {
                    match body {
                        Some(body) => out.message_field(f.number, body),
                        None => single(cx, f.number, &f.ty, None, out)?,
                    }
                }
            }
            (Card::One | Card::Opt, Some(Val::Raw(v))) => single(cx, f.number, &f.ty, Some(v), out)?,
            (Card::Rep, Some(Val::Raw(v))) => {
                for e in elements(v)? {
                    single(cx, f.number, &f.ty, Some(e).filter(|e| !is_null(e)), out)?;
                }
            }
            (Card::Map, Some(Val::Raw(v))) => map(cx, f.number, &f.ty, v, out)?,
            (_, Some(_)) => return unsupported(format!("{}.{}: unexpected value", m.name, f.json)),
        }
    }
    Ok(())
}

fn map(cx: &Cx, number: u32, ty: &Ty, v: &RawValue, out: &mut Out) -> R<()> {
    let Ty::Map(key_ty, value_ty) = ty else { return unsupported("a map field of a non-map type") };
    if *key_ty != Scalar::String {
        return unsupported("a map with non-string keys");
    }
    let mut entries: Vec<(Cow<str>, &RawValue)> = serde_json::from_str::<RawMembers>(v.get())
        .map_err(|e| Unsupported(format!("not a JSON object: {e}")))?
        .0;
    // Go: sort.Strings of the keys (byte order). Duplicate keys: the last one wins.
    entries.reverse();
    entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    entries.dedup_by(|a, b| a.0 == b.0);
    for (k, val) in entries {
        let mut entry = Out::default();
        wire::len_field(&mut entry, 1, k.as_bytes());
        match Some(val).filter(|v| !is_null(v)) {
            // A nil `[]byte` value (JSON `null`): gogo writes the key alone (`if v != nil`).
            None if **value_ty == Ty::Scalar(Scalar::Bytes) => {}
            v => single(cx, 2, value_ty, v, &mut entry)?,
        }
        out.message_field(number, entry);
    }
    Ok(())
}

/// One value of field `number` (`None`: absent or null, written as the zero value).
pub(super) fn single(cx: &Cx, number: u32, ty: &Ty, v: Option<&RawValue>, out: &mut Out) -> R<()> {
    match ty {
        Ty::Scalar(sc) => scalar(cx, number, *sc, v, out),
        Ty::Message(idx) => {
            let body = message_value(cx, *idx, v)?;
            out.message_field(number, body);
            Ok(())
        }
        Ty::Map(..) => unsupported("a map inside a map"),
    }
}

/// The body of message `idx` from its JSON value (`None`: the Go zero value).
fn message_value(cx: &Cx, idx: usize, v: Option<&RawValue>) -> R<Out> {
    let depth = cx.depth.get() + 1;
    if depth > MAX_DEPTH {
        return unsupported(format!("messages nested deeper than {MAX_DEPTH}"));
    }
    cx.depth.set(depth);
    let out = message_value_in(cx, idx, v);
    cx.depth.set(depth - 1);
    out
}

fn message_value_in(cx: &Cx, idx: usize, v: Option<&RawValue>) -> R<Out> {
    let m = &cx.s.messages[idx];
    if let Some(sp) = m.special {
        return special(cx, m, sp, v);
    }
    let mut out = Out::default();
    if m.array {
        // A named slice: the JSON array is field 1.
        let Some(f) = m.fields.first() else { return unsupported(format!("{} has no field", m.name)) };
        if let Some(v) = v {
            for e in elements(v)? {
                single(cx, f.number, &f.ty, Some(e).filter(|e| !is_null(e)), &mut out)?;
            }
        }
        return Ok(out);
    }
    let members = match v {
        Some(v) => read_object(cx, idx, v.get())?,
        None => Members { list: Vec::new(), used: 0 },
    };
    drop(out);
    encode_read(cx, m, members)
}

fn scalar(cx: &Cx, number: u32, sc: Scalar, v: Option<&RawValue>, out: &mut Out) -> R<()> {
    match sc {
        Scalar::String => match v {
            None => wire::len_field(out, number, b""),
            Some(v) => {
                let t = text(v);
                if t.len() >= 2 && t.starts_with('"') && !t.contains('\\') {
                    // A JSON string (the value is valid JSON) without escapes holds the string's
                    // own bytes, between its quotes: no parse.
                    let inner = &t.as_bytes()[1..t.len() - 1];
                    debug_assert_eq!(Some(inner), string(v).ok().as_deref().map(str::as_bytes));
                    out.bytes_field(cx, number, inner);
                } else {
                    wire::len_field(out, number, string(v)?.as_bytes());
                }
            }
        },
        Scalar::Bytes => {
            let b = match v {
                Some(v) => base64::engine::general_purpose::STANDARD
                    .decode(string(v)?.as_bytes())
                    .map_err(|e| Unsupported(format!("bytes: {e}")))?,
                None => Vec::new(),
            };
            wire::len_field(out, number, &b);
        }
        Scalar::Bool => {
            let b = match v.map(text) {
                None | Some("false") => false,
                Some("true") => true,
                Some(t) => return unsupported(format!("not a bool: {t}")),
            };
            wire::varint_field(out, number, u64::from(b));
        }
        Scalar::Int32 | Scalar::Int64 => {
            let n: i64 = match v {
                Some(v) => {
                    text(v).parse().map_err(|_| Unsupported(format!("not an integer: {}", v.get())))?
                }
                None => 0,
            };
            if sc == Scalar::Int32 && i32::try_from(n).is_err() {
                return unsupported(format!("{n} is not an int32"));
            }
            wire::varint_field(out, number, n as u64);
        }
        Scalar::Uint32 | Scalar::Uint64 => {
            let n: u64 = match v {
                Some(v) => text(v)
                    .parse()
                    .map_err(|_| Unsupported(format!("not an unsigned integer: {}", v.get())))?,
                None => 0,
            };
            if sc == Scalar::Uint32 && u32::try_from(n).is_err() {
                return unsupported(format!("{n} is not a uint32"));
            }
            wire::varint_field(out, number, n);
        }
        Scalar::Double | Scalar::Float => {
            let x: f64 = match v {
                Some(v) => text(v).parse().map_err(|_| Unsupported(format!("not a number: {}", v.get())))?,
                None => 0.0,
            };
            if sc == Scalar::Double {
                wire::tag(out, number, wire::FIXED64);
                out.extend_from_slice(&x.to_le_bytes());
            } else {
                wire::tag(out, number, wire::FIXED32);
                out.extend_from_slice(&(x as f32).to_le_bytes());
            }
        }
    }
    Ok(())
}

fn special(cx: &Cx, m: &Message, sp: Special, v: Option<&RawValue>) -> R<Out> {
    let mut out = Out::default();
    match sp {
        Special::Time | Special::MicroTime => {
            // Zero (JSON null): Marshal writes nothing.
            if let Some(v) = v {
                let t: jiff::Timestamp =
                    string(v)?.parse().map_err(|e| Unsupported(format!("time {}: {e}", v.get())))?;
                // Go's `Unix()` floors and `Nanosecond()` is never negative: before 1970 a
                // fraction is a second less and a positive remainder (jiff's seconds round
                // toward zero; a review).
                let total = t.as_nanosecond();
                let (seconds, subsec) = (total.div_euclid(1_000_000_000), total.rem_euclid(1_000_000_000));
                let nanos = match sp {
                    // Time.ProtoTime drops the nanoseconds ("our JSON only handled seconds").
                    Special::Time => 0,
                    _ => subsec / 1000 * 1000,
                };
                wire::varint_field(&mut out, 1, seconds as i64 as u64);
                wire::varint_field(&mut out, 2, nanos as u64);
            }
        }
        Special::Duration => {
            let ns = match v {
                Some(v) => {
                    go_duration(&string(v)?).ok_or_else(|| Unsupported(format!("duration {}", v.get())))?
                }
                None => 0,
            };
            wire::varint_field(&mut out, 1, ns as u64);
        }
        Special::Quantity => {
            // Marshal writes q.String(); the JSON is the same canonical string ("0" when zero).
            let q = match v {
                Some(v) => string(v)?,
                None => Cow::Borrowed("0"),
            };
            wire::len_field(&mut out, 1, q.as_bytes());
        }
        Special::IntOrString => {
            // type (0 int, 1 string), intVal, strVal: always all three.
            match v {
                Some(v) if text(v).starts_with('"') => {
                    wire::varint_field(&mut out, 1, 1);
                    wire::varint_field(&mut out, 2, 0);
                    wire::len_field(&mut out, 3, string(v)?.as_bytes());
                }
                _ => {
                    let n: i64 = match v {
                        Some(v) => {
                            text(v).parse().map_err(|_| Unsupported(format!("int-or-string {}", v.get())))?
                        }
                        None => 0,
                    };
                    if i32::try_from(n).is_err() {
                        return unsupported(format!("{n} is not an int32"));
                    }
                    wire::varint_field(&mut out, 1, 0);
                    wire::varint_field(&mut out, 2, n as u64);
                    wire::len_field(&mut out, 3, b"");
                }
            }
        }
        Special::RawJson => {
            // The JSON bytes themselves, when set.
            if let Some(v) = v {
                out.bytes_field(cx, 1, text(v).as_bytes());
            }
        }
        Special::SchemaOrArray | Special::SchemaOrStringArray => {
            // field 1: the schema object; field 2: the array (schemas, or strings).
            if let Some(v) = v {
                let field = |n: u32| m.fields.iter().find(|f| f.number == n);
                let (Some(one), Some(two)) = (field(1), field(2)) else {
                    return unsupported(format!("{}: unexpected fields", m.name));
                };
                if text(v).starts_with('[') {
                    for e in elements(v)? {
                        single(cx, 2, &two.ty, Some(e).filter(|e| !is_null(e)), &mut out)?;
                    }
                } else {
                    single(cx, 1, &one.ty, Some(v), &mut out)?;
                }
            }
        }
        Special::SchemaOrBool => {
            // allows (always), then the schema when the JSON is an object.
            let Some(schema_field) = m.fields.iter().find(|f| f.number == 2) else {
                return unsupported(format!("{}: unexpected fields", m.name));
            };
            match v.map(text) {
                None | Some("false") => wire::varint_field(&mut out, 1, 0),
                Some("true") => wire::varint_field(&mut out, 1, 1),
                Some(_) => {
                    wire::varint_field(&mut out, 1, 1);
                    single(cx, 2, &schema_field.ty, v, &mut out)?;
                }
            }
        }
        Special::Unknown => return unsupported(format!("{} has a hand-written encoding", m.name)),
    }
    Ok(out)
}

/// Go's `time.ParseDuration`, in nanoseconds (what `metav1.Duration`'s JSON holds).
fn go_duration(s: &str) -> Option<i64> {
    crate::go_duration::parse(s.as_bytes()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Schema {
        Schema::parse(
            "g core v1 t\n\
             m k8s.io.apimachinery.pkg.apis.meta.v1.Time special\nf 1 seconds int64 one\nf 2 nanos int32 one\n\
             m k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime special\nf 1 seconds int64 one\nf 2 nanos int32 one\n\
             m t.Src\nf 1 path string one\n\
             m t.Vol\nf 1 name string one\nf 2 src t.Src one inline\n\
             m t.Obj\nf 1 name string one\nf 2 n int32 one\nf 3 p int64 opt\nf 4 on bool one\n\
             f 5 tags string rep\nf 6 labels map<string,string> map\nf 7 vols t.Vol rep\n\
             f 8 t k8s.io.apimachinery.pkg.apis.meta.v1.Time one\nf 9 dt k8s.io.apimachinery.pkg.apis.meta.v1.Time opt\nf 10 data map<string,bytes> map\nf 11 ratio double opt\n\
             m t.Hook\nf 1 ca bytes opt omitempty\nf 2 raw bytes opt\n",
        )
        .unwrap()
    }

    fn enc(json: &str) -> R<Vec<u8>> {
        let s = schema();
        object(&s, s.message("t.Obj").unwrap(), json.as_bytes(), super::super::NEWEST)
    }

    #[test]
    fn zero_values_of_non_pointer_fields_are_written() {
        // name "", n 0, on false, t (zero time: empty) — p, dt, ratio and the slices not.
        assert_eq!(enc(r#"{"kind":"Obj","apiVersion":"v1"}"#).unwrap(), [0x0a, 0, 0x10, 0, 0x20, 0, 0x42, 0]);
    }

    /// A pointer to the zero time is `null` in Go's JSON and an empty message in its protobuf;
    /// a nil one is absent in both (a review: the `null` was read as nil).
    #[test]
    fn a_pointer_to_the_zero_time_is_an_empty_message() {
        let zeros = [0x0a, 0, 0x10, 0, 0x20, 0, 0x42, 0];
        assert_eq!(enc(r#"{"dt":null}"#).unwrap(), [&zeros[..], &[0x4a, 0]].concat());
        assert_eq!(enc(r#"{}"#).unwrap(), zeros);
        assert_eq!(
            enc(r#"{"dt":"1970-01-01T00:01:40Z"}"#).unwrap(),
            [&zeros[..], &[0x4a, 4, 0x08, 100, 0x10, 0]].concat()
        );
        // A Lease renewed at the zero time, as kube-apiserver writes it: spec {1: "h", 4: {}}.
        let s = super::super::schema::schema();
        let lease = s.kind("coordination.k8s.io", "v1", "Lease").unwrap();
        let json = r#"{"kind":"Lease","apiVersion":"coordination.k8s.io/v1","metadata":{"name":"l"},"spec":{"holderIdentity":"h","renewTime":null}}"#;
        let out = object(s, lease, json.as_bytes(), super::super::NEWEST).unwrap();
        let spec = [0x12, 5, 0x0a, 1, b'h', 0x22, 0];
        assert!(out.windows(spec.len()).any(|w| w == spec), "{out:02x?}");
    }

    #[test]
    fn fields_in_number_order_maps_sorted_slices_unpacked() {
        let got = enc(
            r#"{"labels":{"b":"2","a":"1"},"tags":["x",""],"p":-1,"n":-2,"name":"o","on":true,
                "t":"1970-01-01T00:01:40Z","vols":[{"name":"v","path":"/p"}],"data":{"k":"AAE="},"ratio":0.5}"#,
        )
        .unwrap();
        let mut want = vec![0x0a, 1, b'o', 0x10];
        want.extend_from_slice(&[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        want.extend_from_slice(&[0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        want.extend_from_slice(&[0x20, 1, 0x2a, 1, b'x', 0x2a, 0]);
        want.extend_from_slice(&[
            0x32, 6, 0x0a, 1, b'a', 0x12, 1, b'1', 0x32, 6, 0x0a, 1, b'b', 0x12, 1, b'2',
        ]);
        // Vol{name, src{path}}: the inline source is a nested message.
        want.extend_from_slice(&[0x3a, 9, 0x0a, 1, b'v', 0x12, 4, 0x0a, 2, b'/', b'p']);
        want.extend_from_slice(&[0x42, 4, 0x08, 100, 0x10, 0]);
        want.extend_from_slice(&[0x52, 7, 0x0a, 1, b'k', 0x12, 2, 0, 1]);
        want.push(0x59);
        want.extend_from_slice(&0.5f64.to_le_bytes());
        assert_eq!(got, want);
    }

    #[test]
    fn what_the_schema_does_not_know_is_unsupported() {
        assert!(enc(r#"{"name":"o","newField":1}"#).is_err());
        assert!(enc(r#"{"vols":[{"name":"v","other":1}]}"#).is_err());
        assert!(enc(r#"{"n":"1"}"#).is_err());
        assert!(enc(r#"{"n":4294967296}"#).is_err());
        assert!(enc(r#"[1]"#).is_err());
        assert!(enc(r#"{"t":"yesterday"}"#).is_err());
    }

    /// A string Go's JSON wrote with `\ufffd` held bytes that are not UTF-8, which its
    /// protobuf keeps and the JSON no longer says: not encoded (its protobuf reads forwarded).
    /// A real U+FFFD, written as is, is.
    /// gogo writes a `[]byte` set but empty (`12 00`), not a nil one; Go's JSON writes `""`
    /// and `null` for them, except under `omitempty`, where both are absent (a webhook's
    /// `caBundle`): that object is not encoded (its protobuf readers are forwarded).
    #[test]
    fn bytes_nil_and_empty_as_gogo_writes_them() {
        let s = schema();
        let hook =
            |json: &str| object(&s, s.message("t.Hook").unwrap(), json.as_bytes(), super::super::NEWEST);
        assert_eq!(hook(r#"{"ca":"Zm8=","raw":""}"#).unwrap(), [0x0a, 2, b'f', b'o', 0x12, 0]);
        assert_eq!(hook(r#"{"ca":"","raw":null}"#).unwrap(), [0x0a, 0]);
        assert!(hook(r#"{"raw":""}"#).is_err(), "no caBundle: nil or empty, the JSON does not say");
        assert!(hook(r#"{"ca":null}"#).is_err());
        // A map's nil value is its key alone; an empty one is written.
        // (after the zero values of name, n, on and t)
        assert_eq!(
            enc(r#"{"data":{"b":"","a":null}}"#).unwrap()[8..],
            [0x52, 3, 0x0a, 1, b'a', 0x52, 5, 0x0a, 1, b'b', 0x12, 0]
        );
    }

    #[test]
    fn a_string_that_held_bytes_not_utf8_is_unsupported() {
        assert!(enc(r#"{"name":"a\ufffdb"}"#).is_err());
        assert!(enc(r#"{"tags":["x\uFFFD"]}"#).is_err());
        assert!(enc("{\"name\":\"a\u{fffd}b\"}").is_ok());
        // The text `\ufffd` after an escaped backslash is no such escape.
        assert!(enc(r#"{"name":"a\\ufffd"}"#).is_ok());
        assert!(enc(r#"{"name":"a\\\ufffd"}"#).is_err());
        assert!(enc(r#"{"name":"\\"}"#).is_ok());
        assert!(enc(r#"{"name":"\u005cufffd"}"#).is_ok(), "an escaped backslash written as a \\u escape");
    }

    #[test]
    fn micro_time_keeps_microseconds_time_drops_fractions() {
        let s = schema();
        let t = |name: &str, json: &str| {
            let v: Box<RawValue> = serde_json::from_str(json).unwrap();
            let cx = Cx::new(&s, u32::MAX, json.as_bytes(), None);
            let m = &s.messages[s.message(name).unwrap()];
            special(&cx, m, m.special.unwrap(), Some(&v)).unwrap().into_rope().to_vec()
        };
        assert_eq!(
            t("k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime", r#""1970-01-01T00:00:01.000002Z""#),
            [0x08, 1, 0x10, 0xd0, 0x0f]
        );
        assert_eq!(
            t("k8s.io.apimachinery.pkg.apis.meta.v1.Time", r#""1970-01-01T00:00:01.5Z""#),
            [0x08, 1, 0x10, 0]
        );
        // Before 1970, as Go's `Unix()` (floored) and `Nanosecond()` (never negative): -1 s and
        // 500 000 000 ns, not 0 s and -500 000 000 (a review).
        let mut want = vec![0x08];
        want.extend_from_slice(&[0xff; 9]);
        want.push(0x01);
        want.extend_from_slice(&[0x10, 0x80, 0xca, 0xb5, 0xee, 0x01]);
        assert_eq!(
            t("k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime", r#""1969-12-31T23:59:59.500000Z""#),
            want
        );
    }

    #[test]
    fn long_strings_are_shared_with_the_stored_json_and_the_bytes_stay_the_same() {
        let s = schema();
        let long = "x".repeat(100);
        let body = format!(
            r#""name":"{long}","tags":["short","{long}"],"labels":{{"k":"{long}","e":"a\u003cb{long}"}}}}"#
        );
        let stored = Bytes::from(body.clone());
        let json = format!(r#"{{"kind":"Obj","apiVersion":"v1",{body}"#);
        let msg = s.message("t.Obj").unwrap();
        let rope =
            object_shared(&s, msg, json.as_bytes(), &stored, json.len() - body.len(), super::super::NEWEST)
                .unwrap();
        assert_eq!(
            rope.to_vec(),
            object(&s, msg, json.as_bytes(), super::super::NEWEST).unwrap(),
            "same bytes"
        );
        assert_eq!(rope.len(), rope.to_vec().len());
        // name, the long tag and the long label value are shared; the escaped one is copied.
        let own = rope.own_bytes(&stored);
        assert_eq!(rope.len() - own, 300, "three 100-byte strings shared");
        assert!(rope.parts().len() > 3);
    }

    #[test]
    fn pooled_buffers_leave_no_trace_in_later_transcodes_and_stay_bounded() {
        let json = r#"{"name":"o","n":3,"labels":{"b":"2","a":"1"},"vols":[{"name":"v","path":"/p"}],"t":"1970-01-01T00:01:40Z"}"#;
        let first = enc(json).unwrap();
        // A failure midway (an unknown member deep inside) drops half-written messages: their
        // buffers go back to the pool and must not leak bytes into the next result.
        assert!(enc(r#"{"name":"zzzzzzzz","vols":[{"name":"wwwwwwww","path":"/q","other":1}]}"#).is_err());
        assert_eq!(enc(json).unwrap(), first, "same bytes after reuse");
        // A large object: its big buffers are freed, not kept.
        let big = format!(r#"{{"name":"{}","tags":["{}"]}}"#, "n".repeat(40_000), "t".repeat(40_000));
        assert!(enc(&big).unwrap().len() > 80_000);
        pool::BYTES.with_borrow(|p| {
            assert!(p.len() <= pool::KEEP, "{} buffers kept", p.len());
            assert!(p.iter().all(|b| b.is_empty() && b.capacity() <= pool::MAX_BYTES));
            assert!(!p.is_empty(), "buffers are kept for the next transcode");
        });
        assert_eq!(enc(json).unwrap(), first);
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration("1h0m0s"), Some(3_600_000_000_000));
        assert_eq!(go_duration("1.5s"), Some(1_500_000_000));
        assert_eq!(go_duration("-300ms"), Some(-300_000_000));
        assert_eq!(go_duration("0"), Some(0));
        assert_eq!(go_duration("1x"), None);
    }
}

#[cfg(test)]
mod depth_tests {
    use super::super::NEWEST;
    use super::*;

    /// A message that holds itself, as `JSONSchemaProps` does (`not`, `properties`, …).
    fn schema() -> Schema {
        Schema::parse(
            "g core v1 t\n\
             m t.Node\nf 1 name string one\nf 2 child t.Node opt\nf 3 kids map<string,t.Node> map\nf 4 list t.Node rep\n",
        )
        .unwrap()
    }

    fn nested(depth: usize, open: &str, close: &str) -> String {
        let mut j = String::from(r#"{"kind":"Node","apiVersion":"v1","name":"top""#);
        for _ in 0..depth {
            j.push_str(open);
        }
        for _ in 0..depth {
            j.push_str(close);
        }
        j.push('}');
        j
    }

    /// An object nested deeper than any real one (a CRD whose schema nests `properties`
    /// thousands deep, in a map, a slice or a singular field) is Unsupported — forwarded in
    /// protobuf, as any object the transcoder cannot encode — never a stack overflow, which
    /// would abort the process; one nested almost to the limit encodes. On a thread with a
    /// tokio worker's 2 MiB stack, in a debug build (larger frames than the release build's).
    #[test]
    fn an_object_nested_past_the_limit_is_unsupported_not_a_stack_overflow() {
        for (open, close, levels) in [
            (r#","child":{"name":"n""#, "}", 90),
            (r#","kids":{"k":{"name":"n""#, "}}", 90),
            (r#","list":[{"name":"n""#, "}]", 60),
        ] {
            let (deep, allowed) = (nested(20_000, open, close), nested(levels, open, close));
            let (deep, allowed) = std::thread::Builder::new()
                .stack_size(2 << 20)
                .spawn(move || {
                    let s = schema();
                    let m = s.message("t.Node").unwrap();
                    (
                        object(&s, m, deep.as_bytes(), NEWEST).map(|_| ()),
                        object(&s, m, allowed.as_bytes(), NEWEST),
                    )
                })
                .unwrap()
                .join()
                .expect("no overflow");
            let err = deep.expect_err("too deep");
            assert!(err.0.contains("recursion limit") || err.0.contains("nested deeper"), "{open}: {err}");
            assert!(allowed.is_ok(), "{open}: {levels} levels encode: {:?}", allowed.err());
        }
    }
}
