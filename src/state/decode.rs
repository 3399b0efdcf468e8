//! Reading a state file (`state::format`'s layout) without parsing any JSON: the meta is read
//! and checked (its CRC-32, the version, the selectable fields), then each block is read into
//! buffers of its own (its bodies become the objects' bytes, no copy) while up to
//! `available_parallelism` threads check (CRC-32) and decode the blocks already read, each
//! block's checksum checked by the thread that decodes it (no pass of its own).
//!
//! Never panics, and never allocates more than the input's length justifies (every length is
//! checked against what is left before a buffer is made). Called by `state::restore` (a file)
//! and by tests and the fuzz target (fuzz/fuzz_targets/state_file.rs, bytes).

use std::collections::BTreeMap;
use std::io::Read;

use bytes::Bytes;

use super::format::{
    event_type, DecodeError, Identity, Saved, SavedObject, BLOCK_HEAD_LEN, HEAD_LEN, MAGIC, VERSION,
};
use crate::resource::{field_labels, EventType, Header, Rv};

/// The least a record takes: namespace, name, rv, uid, label count, body length.
const MIN_RECORD: usize = 4 + 4 + 8 + 4 + 4 + 4;
/// Below this many bytes one thread reads and decodes the file.
const PARALLEL_FROM: u64 = 4 * super::format::BLOCK_BODIES as u64;

/// Decodes a whole file's bytes.
pub fn decode(buf: &[u8]) -> Result<Saved, DecodeError> {
    decode_from(&mut &buf[..], buf.len() as u64)
}

/// Decodes a file of `len` bytes read from `r`.
pub fn decode_from(r: &mut impl Read, len: u64) -> Result<Saved, DecodeError> {
    let mut src = Source { r, left: len, len };
    let magic = src.read(MAGIC.len())?;
    if magic[..] != MAGIC[..] {
        return Err(DecodeError::Magic);
    }
    let head = src.read(HEAD_LEN - MAGIC.len())?;
    let found = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    if found != VERSION {
        return Err(DecodeError::Version { found });
    }
    let meta_len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
    let meta = src.read(meta_len)?;
    let sum = src.read(4)?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&magic);
    crc.update(&head);
    crc.update(&meta);
    if crc.finalize().to_le_bytes()[..] != sum[..] {
        return Err(DecodeError::Checksum("meta"));
    }
    let mut c = Cursor { buf: &meta, at: 0 };
    let identity = Identity { server: c.string("server")?, cluster_uid: c.string("cluster uid")? };
    let (group, version, resource) = (c.string("group")?, c.string("version")?, c.string("resource")?);
    let builtin = match c.u8("built-in")? {
        0 => false,
        1 => true,
        _ => return Err(DecodeError::Malformed("built-in")),
    };
    let (rv, floor) = (Rv(c.u64("rv")?), Rv(c.u64("floor")?));
    if floor > rv {
        return Err(DecodeError::Malformed("floor after the cache rv"));
    }
    let f = c.u32("field count")?;
    let f = c.count(f.into(), 4, "field count")?;
    let found: Vec<String> = (0..f).map(|_| c.string("field label")).collect::<Result<_, _>>()?;
    let (labels, _) = field_labels(&group, &resource);
    if found.iter().map(String::as_str).ne(labels.iter().copied()) {
        return Err(DecodeError::Fields { found, want: labels.iter().map(|l| l.to_string()).collect() });
    }
    let (n, m, b) = (c.u64("object count")?, c.u64("event count")?, c.u64("block count")?);
    if c.at != meta.len() {
        return Err(DecodeError::Malformed("bytes after the meta"));
    }
    // A count beyond what the rest of the file could hold reads as a truncation (below).
    let b = usize::try_from(b).unwrap_or(usize::MAX);
    let total_records = n.checked_add(m).ok_or(DecodeError::Malformed("record count"))?;
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).min(8);
    let records = if threads < 2 || len < PARALLEL_FROM {
        let mut blocks = Vec::new();
        let total = read_blocks(&mut src, b, |_, block| blocks.push(block))?;
        ends(&src, total, total_records)?;
        let mut out = Vec::with_capacity(blocks.iter().map(|b| b.count).sum());
        for block in &blocks {
            out.extend(decode_block(block, n, labels)?);
        }
        out
    } else {
        read_and_decode(&mut src, b, threads, n, total_records, labels)?
    };
    let mut objects = Vec::with_capacity(n as usize);
    let mut events = Vec::with_capacity(m as usize);
    for (t, o) in records {
        match t {
            None => objects.push(o),
            Some(t) => events.push((t, o)),
        }
    }
    Ok(Saved { identity, group, version, resource, builtin, rv, floor, objects, events })
}

/// Reads `b` blocks, handing each (with its index) to `sink`; returns how many records they hold.
fn read_blocks<R: Read>(
    src: &mut Source<'_, R>,
    b: usize,
    mut sink: impl FnMut(usize, Block),
) -> Result<u64, DecodeError> {
    let mut total = 0u64;
    for i in 0..b {
        let head = src.read(BLOCK_HEAD_LEN)?;
        let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let (count, recs_len, bodies_len, crc) = (word(0), word(4), word(8), word(12));
        let recs = src.read(recs_len as usize)?;
        let bodies = Bytes::from(src.read(bodies_len as usize)?);
        if count as usize > recs.len() / MIN_RECORD {
            return Err(DecodeError::Malformed("record count"));
        }
        sink(i, Block { first: total, count: count as usize, head, crc, recs, bodies });
        total += count as u64;
    }
    Ok(total)
}

/// What must hold once every block is read: nothing after them, as many records as the meta said.
fn ends<R>(src: &Source<'_, R>, total: u64, want: u64) -> Result<(), DecodeError> {
    if src.left != 0 {
        return Err(DecodeError::Malformed("bytes after the last block"));
    }
    if total != want {
        return Err(DecodeError::Malformed("record count"));
    }
    Ok(())
}

/// Reads the blocks on this thread while `threads` others check and decode those already read
/// (reading ~300 MB and decoding 100 000 records take about as long). Errors as the sequential
/// path has them: the reading's first, then the first failing block in file order.
fn read_and_decode<R: Read>(
    src: &mut Source<'_, R>,
    b: usize,
    threads: usize,
    n: u64,
    total_records: u64,
    labels: &'static [&'static str],
) -> Result<Vec<Record>, DecodeError> {
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Block)>();
    let rx = parking_lot::Mutex::new(rx);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let next = rx.lock().recv();
                        let Ok((i, block)) = next else { break };
                        done.push((i, decode_block(&block, n, labels)));
                    }
                    done
                })
            })
            .collect();
        let read = read_blocks(src, b, |i, block| {
            // The workers end only once `tx` is dropped: the send cannot fail before.
            let _ = tx.send((i, block));
        });
        drop(tx);
        let mut done = Vec::new();
        for w in workers {
            done.extend(w.join().map_err(|_| DecodeError::Malformed("a decoding thread panicked"))?);
        }
        ends(src, read?, total_records)?;
        // Every block read was decoded (each index once): in file order, the first error wins.
        done.sort_unstable_by_key(|(i, _)| *i);
        let mut out = Vec::with_capacity(done.iter().map(|(_, r)| r.as_ref().map_or(0, Vec::len)).sum());
        for (_, r) in done {
            out.extend(r?);
        }
        Ok(out)
    })
}

/// The file as it is read: what is left of it bounds every buffer made.
struct Source<'r, R> {
    r: &'r mut R,
    left: u64,
    len: u64,
}

impl<R: Read> Source<'_, R> {
    /// The next `n` bytes, in a buffer of their own.
    fn read(&mut self, n: usize) -> Result<Vec<u8>, DecodeError> {
        if n as u64 > self.left {
            return Err(DecodeError::Truncated(self.len));
        }
        let mut v = Vec::with_capacity(n);
        match (&mut *self.r).take(n as u64).read_to_end(&mut v) {
            Ok(got) if got == n => {}
            // The file was shorter than its length said (cut while being read).
            Ok(_) => return Err(DecodeError::Truncated(self.len - self.left + v.len() as u64)),
            Err(e) => return Err(DecodeError::Io(e.to_string())),
        }
        self.left -= n as u64;
        Ok(v)
    }
}

/// One block as read: its records, still encoded, and its bodies.
struct Block {
    /// The index of its first record in the file.
    first: u64,
    count: usize,
    head: Vec<u8>,
    crc: u32,
    recs: Vec<u8>,
    bodies: Bytes,
}

type Record = (Option<EventType>, SavedObject);

/// Checks a block's CRC-32, then decodes its records.
fn decode_block(b: &Block, n: u64, labels: &'static [&'static str]) -> Result<Vec<Record>, DecodeError> {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&b.head[..12]);
    crc.update(&b.recs);
    crc.update(&b.bodies);
    if crc.finalize() != b.crc {
        return Err(DecodeError::Checksum("block"));
    }
    let mut c = Cursor { buf: &b.recs, at: 0 };
    let mut body_at = 0usize;
    let mut out = Vec::with_capacity(b.count);
    for i in 0..b.count as u64 {
        let t = if b.first + i >= n {
            Some(event_type(c.u8("event type")?).ok_or(DecodeError::Malformed("event type"))?)
        } else {
            None
        };
        let namespace = c.string("namespace")?;
        let name = c.string("name")?;
        if name.is_empty() {
            return Err(DecodeError::Malformed("an object without a name"));
        }
        let rv = Rv(c.u64("object rv")?);
        let uid = c.string("uid")?;
        let l = c.u32("label count")?;
        let l = c.count(l.into(), 8, "label count")?;
        let mut pairs = Vec::with_capacity(l);
        for _ in 0..l {
            pairs.push((c.string("label key")?, c.string("label value")?));
        }
        let mut fields = BTreeMap::new();
        for &label in labels {
            fields.insert(label, c.string("field value")?);
        }
        let len = c.u32("body length")? as usize;
        let end = body_at
            .checked_add(len)
            .filter(|&e| e <= b.bodies.len())
            .ok_or(DecodeError::Malformed("body length"))?;
        let body = b.bodies.slice(body_at..end);
        body_at = end;
        let header = Header::new(
            &namespace,
            &name,
            rv,
            &uid,
            pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            fields.iter().map(|(k, v)| (*k, v.as_str())),
        );
        out.push((t, SavedObject { header, body }));
    }
    if c.at != b.recs.len() || body_at != b.bodies.len() {
        return Err(DecodeError::Malformed("bytes after a block's last record"));
    }
    Ok(out)
}

/// A bounds-checked reader over a buffer.
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
    fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let n = self.u32(what)? as usize;
        let b = self.take(n, what)?;
        std::str::from_utf8(b).map(str::to_owned).map_err(|_| DecodeError::Malformed(what))
    }
    /// A count of items of at least `min` bytes each, bounded by what the rest could hold.
    fn count(&self, n: u64, min: usize, what: &'static str) -> Result<usize, DecodeError> {
        let left = (self.buf.len() - self.at) / min;
        usize::try_from(n).ok().filter(|&n| n <= left).ok_or(DecodeError::Malformed(what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{typing, Object, ResourceKind};
    use crate::state::format::{encode, reseal, BLOCK_BODIES};

    fn object(kind: &ResourceKind, json: String) -> SavedObject {
        let o = Object::parse(kind, &typing(kind), Bytes::from(json)).expect("parses");
        SavedObject { header: o.header.clone(), body: o.body.clone() }
    }

    fn pod(i: usize, pad: usize) -> String {
        format!(
            r#"{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"p{i}","namespace":"n","uid":"u{i}","resourceVersion":"{}","labels":{{"app":"a","i":"{i}"}}}},"spec":{{"nodeName":"node-{i}","hostNetwork":true}},"status":{{"phase":"Running","podIP":"10.0.0.{}"}},"pad":"{}"}}"#,
            i + 1,
            i % 250,
            "x".repeat(pad)
        )
    }

    pub(crate) fn sample() -> Saved {
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        Saved {
            identity: Identity { server: "https://10.0.0.1:6443".into(), cluster_uid: "uid-1".into() },
            group: String::new(),
            version: "v1".into(),
            resource: "configmaps".into(),
            builtin: true,
            rv: Rv(12),
            floor: Rv(9),
            objects: vec![object(
                &kind,
                r#"{"metadata":{"name":"a","namespace":"n","resourceVersion":"8","labels":{"x":"y"}}}"#
                    .into(),
            )],
            events: vec![(
                EventType::Modified,
                object(&kind, r#"{"metadata":{"name":"a","namespace":"n","resourceVersion":"10"}}"#.into()),
            )],
        }
    }

    /// 120 pods of ~40 KiB each (several blocks, decoded on several threads), 20 events.
    fn pods() -> Saved {
        let kind = ResourceKind::new("", "v1", "pods", "Pod", true, true);
        Saved {
            identity: Identity { server: "https://k".into(), cluster_uid: "u".into() },
            group: String::new(),
            version: "v1".into(),
            resource: "pods".into(),
            builtin: true,
            rv: Rv(1000),
            floor: Rv(120),
            objects: (0..120).map(|i| object(&kind, pod(i, 40 << 10))).collect(),
            events: (0..20).map(|i| (EventType::Added, object(&kind, pod(120 + i, 10)))).collect(),
        }
    }

    #[test]
    fn round_trips() {
        let s = sample();
        assert_eq!(decode(&encode(&s)), Ok(s));
        let p = pods();
        assert_eq!(decode(&encode(&p)), Ok(p));
    }

    #[test]
    fn a_large_state_is_in_blocks_of_their_own_buffers_every_byte_of_them_a_body() {
        let p = pods();
        let bytes = encode(&p);
        let back = decode_from(&mut &bytes[..], bytes.len() as u64).expect("decodes");
        assert_eq!(back, p);
        // Each block's bodies are one buffer: the objects of a block are slices of it, back to
        // back from its start, and no block is much over BLOCK_BODIES.
        let mut starts = Vec::new();
        let mut end = None::<*const u8>;
        for o in back.objects.iter().chain(back.events.iter().map(|(_, o)| o)) {
            let at = o.body.as_ptr();
            if end != Some(at) {
                starts.push(at);
            }
            end = Some(at.wrapping_add(o.body.len()));
        }
        let total: usize = p.objects.iter().map(|o| o.body.len()).sum();
        assert!(starts.len() >= total / BLOCK_BODIES, "{} blocks for {total} bytes", starts.len());
        assert!(starts.len() <= total / BLOCK_BODIES + 2, "{} blocks for {total} bytes", starts.len());
    }

    #[test]
    fn every_truncation_is_refused() {
        let b = encode(&sample());
        for n in 0..b.len() {
            assert_eq!(decode(&b[..n]), Err(DecodeError::Truncated(n as u64)), "{n}");
        }
        // A file that ends before the length it was opened with (cut while being read).
        let e = decode_from(&mut &b[..b.len() - 3], b.len() as u64).unwrap_err();
        assert_eq!(e, DecodeError::Truncated(b.len() as u64 - 3));
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let b = encode(&sample());
        let meta_len = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
        for i in 0..b.len() {
            let mut m = b.clone();
            m[i] ^= 0x01;
            let e = decode(&m).unwrap_err();
            match i {
                0..8 => assert_eq!(e, DecodeError::Magic, "byte {i}"),
                8..12 => assert_eq!(e, DecodeError::Version { found: VERSION ^ (1 << ((i - 8) * 8)) }),
                // The meta's length: read as a truncation or as a meta that fails its checksum.
                12..16 => {
                    assert!(matches!(e, DecodeError::Truncated(_) | DecodeError::Checksum(_)), "{i}: {e:?}")
                }
                _ if i < HEAD_LEN + meta_len + 4 => assert_eq!(e, DecodeError::Checksum("meta"), "byte {i}"),
                // A block's lengths can also make it run past the end or leave bytes after it.
                _ => assert!(
                    matches!(
                        e,
                        DecodeError::Checksum("block")
                            | DecodeError::Truncated(_)
                            | DecodeError::Malformed(_)
                    ),
                    "{i}: {e:?}"
                ),
            }
        }
    }

    #[test]
    fn a_version_1_file_is_another_format_version() {
        // Version 1's head: the magic, the version, a u64 body length.
        let mut v1 = MAGIC.to_vec();
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&[0; 8 + 32]);
        let e = decode(&v1).unwrap_err();
        assert_eq!(e.to_string(), format!("format version 1, this build reads {VERSION}"));
        assert_eq!(e.as_str(), "format_version");
    }

    #[test]
    fn a_file_written_for_other_selectable_fields_is_refused() {
        // The same bytes read as pods' state: pods index eight fields, configmaps none.
        let mut b = encode(&sample());
        let at = b.windows(10).position(|w| w == b"configmaps").unwrap();
        b[at - 4..at].copy_from_slice(&4u32.to_le_bytes());
        b.splice(at..at + 10, *b"pods");
        let meta_len = u32::from_le_bytes(b[12..16].try_into().unwrap()) - 6;
        b[12..16].copy_from_slice(&meta_len.to_le_bytes());
        let e = decode(&reseal(&b)).unwrap_err();
        assert!(matches!(e, DecodeError::Fields { .. }), "{e:?}");
        assert_eq!(e.as_str(), "format_version");
    }

    #[test]
    fn a_huge_count_with_valid_checksums_is_refused_not_an_allocation() {
        let mut s = sample();
        s.events.clear();
        let b = encode(&s);
        let meta_end = HEAD_LEN + u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
        // The block count (the meta's last 8 bytes), then the first block's record count.
        let mut m = b.clone();
        m[meta_end - 8..meta_end].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(decode(&reseal(&m)), Err(DecodeError::Truncated(m.len() as u64)));
        let mut m = b.clone();
        m[meta_end + 4..meta_end + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&reseal(&m)), Err(DecodeError::Malformed("record count")));
        // Counts that disagree with the blocks' records.
        let mut m = b;
        m[meta_end - 24..meta_end - 16].copy_from_slice(&2u64.to_le_bytes());
        assert_eq!(decode(&reseal(&m)), Err(DecodeError::Malformed("record count")));
    }

    #[test]
    fn a_nameless_object_or_a_bad_event_type_is_malformed() {
        let mut s = sample();
        let h = &s.objects[0].header;
        let labels: Vec<(&str, &str)> = h.labels().iter().collect();
        let fields: Vec<(&str, &str)> = h.fields().iter().collect();
        s.objects[0].header = Header::new(h.namespace(), "", h.rv, &h.uid(), labels, fields);
        assert_eq!(decode(&encode(&s)), Err(DecodeError::Malformed("an object without a name")));
        let mut s = sample();
        s.events[0].0 = EventType::Bookmark;
        assert_eq!(decode(&encode(&s)), Err(DecodeError::Malformed("event type")));
    }

    /// Writes the fuzz target's seeds (`fuzz/seeds/state_file`) in this build's format:
    /// `cargo test --lib state::decode -- --ignored write_fuzz_seeds` after a layout change.
    #[test]
    #[ignore = "writes fuzz/seeds/state_file"]
    fn write_fuzz_seeds() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/state_file");
        let mut empty = sample();
        (empty.objects, empty.events) = (Vec::new(), Vec::new());
        let mut few = pods();
        few.objects.truncate(2);
        few.events.truncate(1);
        let kind = ResourceKind::new("", "v1", "pods", "Pod", true, true);
        few.objects = (0..2).map(|i| object(&kind, pod(i, 4))).collect();
        for (name, s) in [("empty", empty), ("valid", sample()), ("pods", few)] {
            std::fs::write(dir.join(name), encode(&s)).expect("seed written");
        }
    }
}
