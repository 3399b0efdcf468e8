//! The state file's bytes: one file per cached resource, versioned and checksummed, laid out
//! so that a load parses no JSON. Each object is kept with what the cache derived from its
//! JSON when it was cached ([`Header`]: key, RV, uid, labels, selectable fields) beside the
//! bytes the cache keeps of it (its `body`), so a warm start rebuilds the objects from the
//! file's fields ([`Object::restored`](crate::resource::Object::restored)).
//!
//! Pure functions, no file I/O: [`encode`] here, [`decode`](super::decode) in `state::decode`;
//! `state::save` and `state::restore` use them, the fuzz target `state_file` feeds `decode`
//! anything.
//!
//! Layout, format version 2 (integers little-endian):
//!
//! ```text
//! magic "KWCSTATE" | format version u32 | meta length u32 | meta | CRC-32 of all before (u32)
//! meta: str server | str cluster uid | str group | str version | str resource | u8 built-in
//!       | u64 cache rv | u64 floor | u32 f, f × str field label    (the selectable fields)
//!       | u64 n objects | u64 m events | u64 b blocks
//! b × block: u32 records | u32 records length | u32 bodies length
//!            | CRC-32 of the block's first 12 bytes, its records and its bodies (u32)
//!            | records | bodies (the records' bodies back to back)
//! record: [u8 event type, events only] | str namespace | str name | u64 rv | str uid
//!         | u32 l, l × (str label key, str value) | f × str field value | u32 body length
//! str: u32 len, UTF-8 bytes
//! ```
//!
//! The n objects at `floor` come first, then the m events after it, oldest first; a block
//! holds whole records, its bodies about [`BLOCK_BODIES`] bytes. A loaded object's body is a
//! slice of its block's bodies (read into a buffer of their own): every byte of that buffer
//! is a body some object keeps, and it is freed when the last of them goes, as a LIST page's
//! buffer is after a cold start.
//!
//! The checksums are an integrity check of the proxy's own 0600 files (truncation, a bad
//! sector, a stray write): CRC-32 per section, checked as the section is decoded. They are no
//! defence against someone who can write `--state-dir`, who could as well write a file of
//! objects of their choosing, checksummed or not. A header is trusted to be what the build
//! that wrote it derived from the bytes beside it; [`VERSION`] changes whenever what
//! [`Object::parse`](crate::resource::Object::parse) derives does (the selectable fields are
//! in the file and compared), and `state::restore` parses a sample of the objects again.
//!
//! Every RV in a file was issued by the upstream.

use bytes::Bytes;

use crate::resource::{field_labels, EventType, Header, Rv};

/// The first bytes of every state file.
pub const MAGIC: &[u8; 8] = b"KWCSTATE";
/// The format this build writes and the only one it reads (version 1 kept the objects' JSON
/// only and parsed it again at every load: such a file is refused and the resource starts
/// cold once, then is saved in this format; version 2 held events' `source` field without its
/// `reportingComponent` fallback, 2026-11-29).
pub const VERSION: u32 = 3;
/// Bytes before the meta: magic, version, meta length.
pub const HEAD_LEN: usize = 8 + 4 + 4;
/// Bytes before a block's records: count, two lengths, CRC-32.
pub const BLOCK_HEAD_LEN: usize = 16;
/// A block is closed once its bodies reach this many bytes (a LIST page of pods is ~1.5 MB).
pub const BLOCK_BODIES: usize = 1 << 20;

/// What identifies the upstream cluster a state was taken from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The upstream's base URL.
    pub server: String,
    /// The `kube-system` namespace's UID.
    pub cluster_uid: String,
}

/// One saved object: what the cache derived from its JSON, and the bytes it keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedObject {
    pub header: Header,
    /// `Object::body`: for a built-in kind the members after the type members, else the object.
    pub body: Bytes,
}

/// One resource's cache as saved: the objects at the history's floor and every event after
/// it, so a restore rebuilds the same store and the same history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Saved {
    pub identity: Identity,
    pub group: String,
    pub version: String,
    pub resource: String,
    /// Whether the kind is built in (what an object's body holds, `ResourceKind::builtin`).
    pub builtin: bool,
    /// The cache RV (≥ the newest event's: bookmarks move it).
    pub rv: Rv,
    /// The history's floor: `objects` are the state there; a watch may resume from any RV ≥ it.
    pub floor: Rv,
    pub objects: Vec<SavedObject>,
    pub events: Vec<(EventType, SavedObject)>,
}

/// Why a file's bytes are not a usable state.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("truncated: {0} bytes")]
    Truncated(u64),
    #[error("not a state file (bad magic)")]
    Magic,
    #[error("format version {found}, this build reads {VERSION}")]
    Version { found: u32 },
    #[error("written for the selectable fields {found:?}, this build indexes {want:?}")]
    Fields { found: Vec<String>, want: Vec<String> },
    #[error("checksum mismatch ({0})")]
    Checksum(&'static str),
    #[error("malformed: {0}")]
    Malformed(&'static str),
    #[error("read: {0}")]
    Io(String),
}

impl DecodeError {
    /// The metric label of the refusal.
    pub fn as_str(&self) -> &'static str {
        match self {
            DecodeError::Truncated(_) => "truncated",
            DecodeError::Magic | DecodeError::Malformed(_) => "corrupt",
            // Another build's layout, as another version is.
            DecodeError::Version { .. } | DecodeError::Fields { .. } => "format_version",
            DecodeError::Checksum(_) => "checksum",
            DecodeError::Io(_) => "unreadable",
        }
    }
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    // Objects, labels and blocks are far below 4 GiB (etcd's limit is 1.5 MiB by default).
    out.extend_from_slice(&(n as u32).to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

pub(super) fn type_byte(t: EventType) -> u8 {
    match t {
        EventType::Added => 1,
        EventType::Modified => 2,
        EventType::Deleted => 3,
        EventType::Bookmark => 4,
        EventType::Error => 5,
    }
}

/// An event's type from its byte (only the three a history holds).
pub(super) fn event_type(b: u8) -> Option<EventType> {
    match b {
        1 => Some(EventType::Added),
        2 => Some(EventType::Modified),
        3 => Some(EventType::Deleted),
        _ => None,
    }
}

fn put_record(out: &mut Vec<u8>, t: Option<EventType>, o: &SavedObject, labels: &[&str]) {
    if let Some(t) = t {
        out.push(type_byte(t));
    }
    let h = &o.header;
    put_str(out, h.namespace());
    put_str(out, h.name());
    out.extend_from_slice(&h.rv.0.to_le_bytes());
    put_str(out, &h.uid());
    put_u32(out, h.labels().len());
    for (k, v) in h.labels().iter() {
        put_str(out, k);
        put_str(out, v);
    }
    let fields = h.fields();
    for l in labels {
        put_str(out, fields.get(l).unwrap_or(""));
    }
    put_u32(out, o.body.len());
}

/// Writes one block: its head, records and bodies (see the layout).
fn close_block(out: &mut Vec<u8>, recs: &mut Vec<u8>, bodies: &mut Vec<&Bytes>, bodies_len: usize) {
    let start = out.len();
    put_u32(out, bodies.len());
    put_u32(out, recs.len());
    put_u32(out, bodies_len);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&out[start..]);
    crc.update(recs);
    for b in bodies.iter() {
        crc.update(b);
    }
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.extend_from_slice(recs);
    for b in bodies.drain(..) {
        out.extend_from_slice(b);
    }
    recs.clear();
}

/// Writes `records` as blocks; returns how many.
fn put_blocks<'a>(
    out: &mut Vec<u8>,
    records: impl Iterator<Item = (Option<EventType>, &'a SavedObject)>,
    labels: &[&str],
) -> u64 {
    let mut blocks = 0u64;
    let (mut recs, mut bodies): (Vec<u8>, Vec<&'a Bytes>) = (Vec::new(), Vec::new());
    let mut bodies_len = 0usize;
    for (t, o) in records {
        put_record(&mut recs, t, o, labels);
        bodies.push(&o.body);
        bodies_len += o.body.len();
        if bodies_len >= BLOCK_BODIES {
            close_block(out, &mut recs, &mut bodies, bodies_len);
            bodies_len = 0;
            blocks += 1;
        }
    }
    if !bodies.is_empty() {
        close_block(out, &mut recs, &mut bodies, bodies_len);
        blocks += 1;
    }
    blocks
}

/// The file's bytes (built in one buffer: a state can be hundreds of megabytes).
pub fn encode(s: &Saved) -> Vec<u8> {
    let (labels, _) = field_labels(&s.group, &s.resource);
    let all = || s.objects.iter().map(|o| (None, o)).chain(s.events.iter().map(|(t, o)| (Some(*t), o)));
    let size: usize =
        all().map(|(_, o)| o.body.len() + 64 + o.header.labels().len() * 48).sum::<usize>() + 512;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for f in [&s.identity.server, &s.identity.cluster_uid, &s.group, &s.version, &s.resource] {
        put_str(&mut out, f);
    }
    out.push(u8::from(s.builtin));
    out.extend_from_slice(&s.rv.0.to_le_bytes());
    out.extend_from_slice(&s.floor.0.to_le_bytes());
    put_u32(&mut out, labels.len());
    for l in labels {
        put_str(&mut out, l);
    }
    out.extend_from_slice(&(s.objects.len() as u64).to_le_bytes());
    out.extend_from_slice(&(s.events.len() as u64).to_le_bytes());
    let blocks_at = out.len();
    out.extend_from_slice(&0u64.to_le_bytes());
    let meta_len = out.len() - HEAD_LEN;
    out[12..HEAD_LEN].copy_from_slice(&(meta_len as u32).to_le_bytes());
    // The block count is written once the blocks are; the meta's CRC after it.
    let crc_at = out.len();
    out.extend_from_slice(&[0; 4]);
    let blocks = put_blocks(&mut out, all(), labels);
    out[blocks_at..blocks_at + 8].copy_from_slice(&blocks.to_le_bytes());
    let crc = crc32fast::hash(&out[..crc_at]);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    out
}

/// `buf` with every checksum it has made to match (the meta's and each block's, as far as the
/// layout can be followed; unchanged where it cannot): lets tests and the fuzz target reach
/// the decoder past the checksums with altered bytes.
pub fn reseal(buf: &[u8]) -> Vec<u8> {
    let mut out = buf.to_vec();
    let u32_at = |b: &[u8], at: usize| -> Option<usize> {
        let s = b.get(at..at.checked_add(4)?)?;
        Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize)
    };
    let Some(meta_len) = u32_at(&out, 12) else { return out };
    let crc_at = HEAD_LEN.saturating_add(meta_len);
    if crc_at.saturating_add(4) > out.len() {
        return out;
    }
    let crc = crc32fast::hash(&out[..crc_at]);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    let mut at = crc_at + 4;
    while let (Some(recs), Some(bodies)) = (u32_at(&out, at + 4), u32_at(&out, at + 8)) {
        let end = at.saturating_add(BLOCK_HEAD_LEN).saturating_add(recs).saturating_add(bodies);
        if end > out.len() {
            break;
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(&out[at..at + 12]);
        crc.update(&out[at + BLOCK_HEAD_LEN..end]);
        let sum = crc.finalize();
        out[at + 12..at + 16].copy_from_slice(&sum.to_le_bytes());
        at = end;
    }
    out
}
