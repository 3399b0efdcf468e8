//! Reading protobuf watch streams (`application/vnd.kubernetes.protobuf;stream=watch`), as a
//! kubelet gets them from the proxy: 4-byte big-endian length-prefixed `WatchEvent`s whose
//! object is `k8s\0` + `runtime.Unknown` around the kind's message. Only what the tracker
//! needs is read (type, `metadata.resourceVersion`, the writer's two annotations, an ERROR's
//! code), with a minimal wire reader of its own: the harness stands apart from the proxy's
//! encoder, so it checks it instead of sharing its mistakes.
//!
//! Called by `bench::watchers` when a watch answers in protobuf.

use super::parsed::Parsed;

/// One field of a message: its number and its value.
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*i)?;
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

/// The fields of a message, in order; `None` at the first malformed one.
fn fields(b: &[u8]) -> impl Iterator<Item = Option<(u64, Value<'_>)>> + '_ {
    let mut i = 0;
    let mut broken = false;
    std::iter::from_fn(move || {
        if broken || i >= b.len() {
            return None;
        }
        let field = (|| {
            let key = varint(b, &mut i)?;
            let value = match key & 7 {
                0 => Value::Varint(varint(b, &mut i)?),
                2 => {
                    let len = usize::try_from(varint(b, &mut i)?).ok()?;
                    let v = b.get(i..i.checked_add(len)?)?;
                    i += len;
                    Value::Bytes(v)
                }
                1 => {
                    i += 8;
                    Value::Fixed
                }
                5 => {
                    i += 4;
                    Value::Fixed
                }
                _ => return None,
            };
            Some((key >> 3, value))
        })();
        broken = field.is_none();
        Some(field)
    })
}

/// The last length-delimited field `n` of a message.
fn bytes_field(b: &[u8], n: u64) -> Option<&[u8]> {
    let mut out = None;
    for f in fields(b) {
        match f? {
            (k, Value::Bytes(v)) if k == n => out = Some(v),
            _ => {}
        }
    }
    out
}

fn varint_field(b: &[u8], n: u64) -> Option<u64> {
    let mut out = None;
    for f in fields(b) {
        match f? {
            (k, Value::Varint(v)) if k == n => out = Some(v),
            _ => {}
        }
    }
    out
}

/// Splits the complete frames off the front of `buf`: their bodies, and how many bytes they
/// took.
pub fn frames(buf: &[u8]) -> (Vec<&[u8]>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(head) = buf.get(at..at + 4) {
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let Some(body) = buf.get(at + 4..at + 4 + len) else { break };
        out.push(body);
        at += 4 + len;
    }
    (out, at)
}

/// Reads one `WatchEvent` frame body.
pub fn parse_frame(event: &[u8]) -> Parsed {
    parse(event).unwrap_or(Parsed::Garbage)
}

fn parse(event: &[u8]) -> Option<Parsed> {
    let ty = std::str::from_utf8(bytes_field(event, 1)?).ok()?;
    let raw = bytes_field(bytes_field(event, 2)?, 1)?;
    let unknown = raw.strip_prefix(b"k8s\0")?;
    let msg = bytes_field(unknown, 2)?;
    if ty == "ERROR" {
        // meta/v1 Status: code is field 6.
        return Some(Parsed::Error {
            code: varint_field(msg, 6).and_then(|c| u16::try_from(c).ok()).unwrap_or(0),
        });
    }
    // Every kind (and PartialObjectMetadata) has its ObjectMeta as field 1.
    let meta = bytes_field(msg, 1)?;
    let rv: u64 = std::str::from_utf8(bytes_field(meta, 6)?).ok()?.parse().ok()?;
    let (mut sent, mut seq) = (None, None);
    for f in fields(meta) {
        if let (12, Value::Bytes(entry)) = f? {
            let key = bytes_field(entry, 1).unwrap_or_default();
            let value = std::str::from_utf8(bytes_field(entry, 2).unwrap_or_default()).ok();
            match key {
                b"bench.kube-watchcache.io/sent-unix-nanos" => {
                    sent = value.and_then(|v| v.parse::<u128>().ok())
                }
                b"bench.kube-watchcache.io/seq" => seq = value.and_then(|v| v.parse::<u64>().ok()),
                _ => {}
            }
        }
    }
    Some(match ty {
        "BOOKMARK" => Parsed::Bookmark { rv },
        "ADDED" | "MODIFIED" | "DELETED" => {
            Parsed::Event { rv, seq: seq.filter(|&s| s > 0), sent_nanos: sent.filter(|&s| s > 0) }
        }
        _ => Parsed::Garbage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn len_field(out: &mut Vec<u8>, n: u8, v: &[u8]) {
        out.push(n << 3 | 2);
        out.push(v.len() as u8);
        out.extend_from_slice(v);
    }

    fn event(ty: &str, msg: &[u8]) -> Vec<u8> {
        let mut unknown = b"k8s\0".to_vec();
        len_field(&mut unknown, 1, b"\x0a\x02v1\x12\x03Pod");
        len_field(&mut unknown, 2, msg);
        unknown.extend_from_slice(&[0x1a, 0, 0x22, 0]);
        let mut raw_ext = Vec::new();
        len_field(&mut raw_ext, 1, &unknown);
        let mut ev = Vec::new();
        len_field(&mut ev, 1, ty.as_bytes());
        len_field(&mut ev, 2, &raw_ext);
        let mut framed = (ev.len() as u32).to_be_bytes().to_vec();
        framed.extend_from_slice(&ev);
        framed
    }

    #[test]
    fn reads_what_the_tracker_needs() {
        let mut entry = Vec::new();
        len_field(&mut entry, 1, b"bench.kube-watchcache.io/seq");
        len_field(&mut entry, 2, b"7");
        let mut meta = Vec::new();
        len_field(&mut meta, 1, b"p");
        len_field(&mut meta, 6, b"42");
        len_field(&mut meta, 12, &entry);
        let mut pod = Vec::new();
        len_field(&mut pod, 1, &meta);
        let mut stream = event("MODIFIED", &pod);
        let mut bookmark_meta = Vec::new();
        len_field(&mut bookmark_meta, 6, b"43");
        let mut bookmark = Vec::new();
        len_field(&mut bookmark, 1, &bookmark_meta);
        stream.extend_from_slice(&event("BOOKMARK", &bookmark));
        let cut = stream.len() - 3;
        let (got, used) = frames(&stream[..cut]);
        assert_eq!(got.len(), 1, "an incomplete frame waits");
        assert_eq!(parse_frame(got[0]), Parsed::Event { rv: 42, seq: Some(7), sent_nanos: None });
        let (got, used2) = frames(&stream);
        assert_eq!(used2, stream.len());
        assert!(used < used2);
        assert_eq!(parse_frame(got[1]), Parsed::Bookmark { rv: 43 });
        let status = [0x30, 0x9a, 0x03]; // code 410
        let error = event("ERROR", &status);
        let (got, _) = frames(&error);
        assert_eq!(parse_frame(got[0]), Parsed::Error { code: 410 });
        assert_eq!(parse_frame(b"\xff\xff"), Parsed::Garbage);
    }
}
