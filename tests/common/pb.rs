//! Reading protobuf in tests: a message's fields, without the proxy's encoder (so that the
//! tests check it rather than share its mistakes).

/// The fields of a message, or `None` if the bytes are not one.
pub fn fields(b: &[u8]) -> Option<Vec<(u64, u8, &[u8])>> {
    let mut out = Vec::new();
    let mut i = 0;
    let varint = |i: &mut usize| -> Option<u64> {
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
    };
    while i < b.len() {
        let key = varint(&mut i)?;
        let start = i;
        match key & 7 {
            0 => {
                varint(&mut i)?;
            }
            1 => i += 8,
            5 => i += 4,
            2 => {
                let len = varint(&mut i)? as usize;
                let s = i;
                i = i.checked_add(len)?;
                out.push((key >> 3, 2, b.get(s..i)?));
                continue;
            }
            _ => return None,
        }
        out.push((key >> 3, (key & 7) as u8, b.get(start..i)?));
    }
    Some(out)
}

/// The first length-delimited field `n` of a message.
pub fn field(b: &[u8], n: u64) -> Option<&[u8]> {
    fields(b)?.into_iter().find(|(k, t, _)| *k == n && *t == 2).map(|(_, _, v)| v)
}

/// One event of a protobuf watch stream (`…;stream=watch`): its type, and the object's kind,
/// namespace/name and resourceVersion read from the `k8s\0` + `Unknown` envelope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: String,
    pub type_: String,
    pub key: String,
    pub rv: u64,
}

impl WatchEvent {
    /// A 4-byte big-endian length's frame body; `None` if it is not a watch event.
    pub fn parse(frame: &[u8]) -> Option<WatchEvent> {
        let s = |b: &[u8]| String::from_utf8(b.to_vec()).ok();
        let type_ = s(field(frame, 1)?)?;
        let raw = field(field(frame, 2)?, 1)?;
        let unknown = raw.strip_prefix(b"k8s\0")?;
        let kind = s(field(field(unknown, 1)?, 2)?)?;
        let meta = field(field(unknown, 2)?, 1)?;
        let name = s(field(meta, 1).unwrap_or_default())?;
        let namespace = s(field(meta, 3).unwrap_or_default())?;
        let rv = s(field(meta, 6)?)?.parse().ok()?;
        let key = if namespace.is_empty() { name } else { format!("{namespace}/{name}") };
        Some(WatchEvent { kind, type_, key, rv })
    }
}

/// Splits whole 4-byte length-prefixed frames off the front of `buf`.
pub fn take_frames(buf: &mut Vec<u8>) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while buf.len() >= 4 {
        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if buf.len() < 4 + len {
            break;
        }
        out.push(buf[4..4 + len].to_vec());
        buf.drain(..4 + len);
    }
    out
}

// Without managedFields (KEP-5958): what an apiserver that clears `ObjectMeta.managedFields`
// before encoding sends, made from what it sent with them. Go writes a message's fields in
// order and nothing for an empty repeated field, so dropping field 17 is exactly that.

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A message again from its fields, each length-delimited one passed through `f` (by number).
/// What `rebuild` does with a length-delimited field (by number): its new payload, or `None`
/// to leave it out.
pub type FieldMap<'a> = &'a dyn Fn(u64, &[u8]) -> Option<Vec<u8>>;

pub fn rebuild(msg: &[u8], f: FieldMap<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(msg.len());
    for (n, wt, payload) in fields(msg).expect("a protobuf message") {
        let payload = if wt == 2 { f(n, payload) } else { Some(payload.to_vec()) };
        let Some(payload) = payload else { continue };
        put_varint(&mut out, n << 3 | u64::from(wt));
        if wt == 2 {
            put_varint(&mut out, payload.len() as u64);
        }
        out.extend_from_slice(&payload);
    }
    out
}

/// An object (or PartialObjectMetadata) message without `ObjectMeta.managedFields` (17).
pub fn lean_object(obj: &[u8]) -> Vec<u8> {
    rebuild(obj, &|n, p| {
        Some(if n == 1 { rebuild(p, &|n, p| (n != 17).then(|| p.to_vec())) } else { p.to_vec() })
    })
}

/// `k8s\0` + Unknown whose raw (2) is rewritten by `f`.
pub fn lean_envelope(body: &[u8], f: &dyn Fn(&[u8]) -> Vec<u8>) -> Vec<u8> {
    let unknown = body.strip_prefix(b"k8s\0").expect("the protobuf magic");
    let mut out = b"k8s\0".to_vec();
    out.extend(rebuild(unknown, &|n, p| Some(if n == 2 { f(p) } else { p.to_vec() })));
    out
}

/// A list message whose items (2) lose their managedFields.
pub fn lean_list(list: &[u8]) -> Vec<u8> {
    rebuild(list, &|n, p| Some(if n == 2 { lean_object(p) } else { p.to_vec() }))
}
