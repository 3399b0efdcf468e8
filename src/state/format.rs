//! The state file's bytes: one file per cached resource, versioned and checksummed.
//!
//! Pure functions, no I/O: `state::file` writes and reads the bytes, `state::restore` checks
//! what [`decode`] returns against the upstream, the fuzz target `state_file` feeds it anything.
//! [`decode`] never panics and never allocates more than its input justifies.
//!
//! Layout (integers little-endian):
//!
//! ```text
//! magic "KWCSTATE" | format version u32 | body length u64 | body | SHA-256 of all before (32)
//! body: str server | str cluster uid | str group | str version | str resource
//!       | u64 cache rv | u64 floor
//!       | u64 n | n × (u32 len, object bytes)            the objects at `floor`
//!       | u64 m | m × (u8 type, u32 len, object bytes)   every event after `floor`, oldest first
//! str: u32 len, UTF-8 bytes
//! ```
//!
//! The objects are the bytes the cache keeps (what the upstream sent); every RV in a file was
//! issued by the upstream.

use bytes::Bytes;
use ring::digest::{digest, SHA256};

use crate::resource::{EventType, Rv};

/// The first bytes of every state file.
pub const MAGIC: &[u8; 8] = b"KWCSTATE";
/// The format this build writes and the only one it reads.
pub const VERSION: u32 = 1;
const CHECKSUM_LEN: usize = 32;
const HEAD_LEN: usize = 8 + 4 + 8;

/// What identifies the upstream cluster a state was taken from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The upstream's base URL.
    pub server: String,
    /// The `kube-system` namespace's UID.
    pub cluster_uid: String,
}

/// One resource's cache as saved: the objects at the history's floor and every event after
/// it, so a restore rebuilds the same store and the same history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Saved {
    pub identity: Identity,
    pub group: String,
    pub version: String,
    pub resource: String,
    /// The cache RV (≥ the newest event's: bookmarks move it).
    pub rv: Rv,
    /// The history's floor: `objects` are the state there; a watch may resume from any RV ≥ it.
    pub floor: Rv,
    pub objects: Vec<Bytes>,
    pub events: Vec<(EventType, Bytes)>,
}

/// Why a file's bytes are not a usable state.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("truncated: {0} bytes")]
    Truncated(usize),
    #[error("not a state file (bad magic)")]
    Magic,
    #[error("format version {found}, this build reads {VERSION}")]
    Version { found: u32 },
    #[error("checksum mismatch")]
    Checksum,
    #[error("malformed: {0}")]
    Malformed(&'static str),
}

impl DecodeError {
    /// The metric label of the refusal.
    pub fn as_str(&self) -> &'static str {
        match self {
            DecodeError::Truncated(_) => "truncated",
            DecodeError::Magic | DecodeError::Malformed(_) => "corrupt",
            DecodeError::Version { .. } => "format_version",
            DecodeError::Checksum => "checksum",
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_bytes(out, s.as_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    // Objects are far below 4 GiB (etcd's limit is 1.5 MiB by default); longer ones cannot be
    // written, and `encode`'s caller never keeps them.
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn type_byte(t: EventType) -> u8 {
    match t {
        EventType::Added => 1,
        EventType::Modified => 2,
        EventType::Deleted => 3,
        EventType::Bookmark => 4,
        EventType::Error => 5,
    }
}

/// The file's bytes (built in one buffer: a state can be hundreds of megabytes).
pub fn encode(s: &Saved) -> Vec<u8> {
    let size: usize = s.objects.iter().map(|o| o.len() + 4).sum::<usize>()
        + s.events.iter().map(|(_, o)| o.len() + 5).sum::<usize>()
        + 256;
    let mut out = Vec::with_capacity(HEAD_LEN + size + CHECKSUM_LEN);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    for f in [&s.identity.server, &s.identity.cluster_uid, &s.group, &s.version, &s.resource] {
        put_str(&mut out, f);
    }
    out.extend_from_slice(&s.rv.0.to_le_bytes());
    out.extend_from_slice(&s.floor.0.to_le_bytes());
    out.extend_from_slice(&(s.objects.len() as u64).to_le_bytes());
    for o in &s.objects {
        put_bytes(&mut out, o);
    }
    out.extend_from_slice(&(s.events.len() as u64).to_le_bytes());
    for (t, o) in &s.events {
        out.push(type_byte(*t));
        put_bytes(&mut out, o);
    }
    let body_len = (out.len() - HEAD_LEN) as u64;
    out[12..HEAD_LEN].copy_from_slice(&body_len.to_le_bytes());
    let sum = digest(&SHA256, &out);
    out.extend_from_slice(sum.as_ref());
    out
}

/// `buf` with its last 32 bytes replaced by the SHA-256 of the others (unchanged when shorter):
/// lets tests and the fuzz target reach the body parser with altered bytes.
pub fn reseal(buf: &[u8]) -> Vec<u8> {
    let mut out = buf.to_vec();
    if out.len() >= CHECKSUM_LEN {
        let at = out.len() - CHECKSUM_LEN;
        let sum = digest(&SHA256, &out[..at]);
        out[at..].copy_from_slice(sum.as_ref());
    }
    out
}

/// A bounds-checked reader over the body.
struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let end =
            self.at.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or(DecodeError::Malformed(what))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }
    fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let b = self.bytes(what)?;
        std::str::from_utf8(b).map(str::to_owned).map_err(|_| DecodeError::Malformed(what))
    }
    /// A record count, bounded by what the rest of the body could hold (`min` bytes each).
    fn count(&mut self, min: usize, what: &'static str) -> Result<usize, DecodeError> {
        let n = self.u64(what)?;
        let left = (self.buf.len() - self.at) / min;
        usize::try_from(n).ok().filter(|&n| n <= left).ok_or(DecodeError::Malformed(what))
    }
}

fn event_type(b: u8) -> Result<EventType, DecodeError> {
    match b {
        1 => Ok(EventType::Added),
        2 => Ok(EventType::Modified),
        3 => Ok(EventType::Deleted),
        _ => Err(DecodeError::Malformed("event type")),
    }
}

/// Reads a file's bytes. Checks magic, version, length and checksum before reading the body;
/// the objects themselves are checked when they are parsed into the cache (`state::restore`).
pub fn decode(buf: &[u8]) -> Result<Saved, DecodeError> {
    if buf.len() < MAGIC.len() {
        return Err(DecodeError::Truncated(buf.len()));
    }
    if &buf[..MAGIC.len()] != MAGIC {
        return Err(DecodeError::Magic);
    }
    if buf.len() < HEAD_LEN + CHECKSUM_LEN {
        return Err(DecodeError::Truncated(buf.len()));
    }
    let mut head = Cursor { buf: &buf[..HEAD_LEN], at: MAGIC.len() };
    let found = head.u32("version")?;
    if found != VERSION {
        return Err(DecodeError::Version { found });
    }
    let body_len = head.u64("body length")?;
    let total = usize::try_from(body_len).ok().and_then(|b| b.checked_add(HEAD_LEN + CHECKSUM_LEN));
    match total {
        Some(t) if t == buf.len() => {}
        Some(t) if t > buf.len() => return Err(DecodeError::Truncated(buf.len())),
        None => return Err(DecodeError::Truncated(buf.len())),
        Some(_) => return Err(DecodeError::Malformed("bytes after the checksum")),
    }
    let (signed, sum) = buf.split_at(buf.len() - CHECKSUM_LEN);
    if digest(&SHA256, signed).as_ref() != sum {
        return Err(DecodeError::Checksum);
    }
    let mut c = Cursor { buf: &signed[HEAD_LEN..], at: 0 };
    let identity = Identity { server: c.string("server")?, cluster_uid: c.string("cluster uid")? };
    let (group, version, resource) = (c.string("group")?, c.string("version")?, c.string("resource")?);
    let (rv, floor) = (Rv(c.u64("rv")?), Rv(c.u64("floor")?));
    if floor > rv {
        return Err(DecodeError::Malformed("floor after the cache rv"));
    }
    let n = c.count(4, "object count")?;
    let mut objects = Vec::with_capacity(n);
    for _ in 0..n {
        objects.push(Bytes::copy_from_slice(c.bytes("object")?));
    }
    let m = c.count(5, "event count")?;
    let mut events = Vec::with_capacity(m);
    for _ in 0..m {
        let t = event_type(c.u8("event type")?)?;
        events.push((t, Bytes::copy_from_slice(c.bytes("event object")?)));
    }
    if c.at != c.buf.len() {
        return Err(DecodeError::Malformed("bytes after the last event"));
    }
    Ok(Saved { identity, group, version, resource, rv, floor, objects, events })
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Saved {
        Saved {
            identity: Identity { server: "https://10.0.0.1:6443".into(), cluster_uid: "uid-1".into() },
            group: String::new(),
            version: "v1".into(),
            resource: "configmaps".into(),
            rv: Rv(12),
            floor: Rv(9),
            objects: vec![Bytes::from_static(
                br#"{"metadata":{"name":"a","namespace":"n","resourceVersion":"8"}}"#,
            )],
            events: vec![(
                EventType::Modified,
                Bytes::from_static(br#"{"metadata":{"name":"a","namespace":"n","resourceVersion":"10"}}"#),
            )],
        }
    }

    #[test]
    fn round_trips() {
        let s = sample();
        assert_eq!(decode(&encode(&s)), Ok(s));
    }

    #[test]
    fn every_truncation_is_refused() {
        let b = encode(&sample());
        for n in 0..b.len() {
            let e = decode(&b[..n]).unwrap_err();
            assert!(matches!(e, DecodeError::Truncated(_) | DecodeError::Checksum), "{n}: {e:?}");
        }
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let b = encode(&sample());
        for i in 0..b.len() {
            let mut m = b.clone();
            m[i] ^= 0x01;
            let e = decode(&m).unwrap_err();
            let want = match i {
                0..8 => DecodeError::Magic,
                8..12 => DecodeError::Version { found: VERSION ^ (1 << ((i - 8) * 8)) },
                _ => DecodeError::Checksum,
            };
            // A flipped length byte reads as a truncation or as trailing bytes.
            if (12..20).contains(&i) {
                assert!(matches!(e, DecodeError::Truncated(_) | DecodeError::Malformed(_)), "{i}: {e:?}");
            } else {
                assert_eq!(e, want, "byte {i}");
            }
        }
    }

    #[test]
    fn another_version_is_named() {
        let mut b = encode(&sample());
        b[8..12].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(decode(&b).unwrap_err().to_string(), "format version 2, this build reads 1");
    }

    #[test]
    fn a_huge_count_with_a_valid_checksum_is_malformed_not_an_allocation() {
        let mut s = sample();
        s.objects.clear();
        s.events.clear();
        let mut b = encode(&s);
        // The object count is the 8 bytes before the event count, just before the checksum.
        let at = b.len() - 32 - 16;
        b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(decode(&reseal(&b)), Err(DecodeError::Malformed("object count")));
    }
}
