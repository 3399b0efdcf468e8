//! Protobuf wire primitives (varints, tags, length-delimited fields) as gogo-protobuf's
//! generated `MarshalToSizedBuffer` writes them for Kubernetes types.
//!
//! Pure; used by `proto::transcode` and `proto::envelope`.

/// Wire type of varint fields (bool, int32, int64, uint32, uint64).
pub const VARINT: u8 = 0;
/// Wire type of `double`.
pub const FIXED64: u8 = 1;
/// Wire type of strings, bytes, messages and map entries.
pub const LEN: u8 = 2;
/// Wire type of `float`.
pub const FIXED32: u8 = 5;

/// Appends `v` as a base-128 varint.
pub fn varint(out: &mut Vec<u8>, v: u64) {
    put_varint(out, v);
}

/// Appends `v` as a varint to any buffer (a LIST's chunk).
pub fn put_varint(out: &mut impl bytes::BufMut, mut v: u64) {
    while v >= 0x80 {
        out.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

/// The length of `v` as a varint.
pub fn varint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Appends a field key.
pub fn tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

/// Appends a length-delimited field: key, length, bytes.
pub fn len_field(out: &mut Vec<u8>, field: u32, data: &[u8]) {
    tag(out, field, LEN);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

/// Appends a varint field. Go's generated code writes `uint64(v)` of a signed value: a
/// negative int32 or int64 takes ten bytes.
pub fn varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, VARINT);
    varint(out, v);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_as_go_writes_them() {
        let enc = |v: u64| {
            let mut o = Vec::new();
            varint(&mut o, v);
            assert_eq!(o.len(), varint_len(v), "{v}");
            o
        };
        assert_eq!(enc(0), [0]);
        assert_eq!(enc(127), [0x7f]);
        assert_eq!(enc(300), [0xac, 0x02]);
        // int32(-1) as Go's uint64(m.X): ten bytes.
        assert_eq!(enc(-1i64 as u64), [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        let mut o = Vec::new();
        len_field(&mut o, 1, b"v1");
        tag(&mut o, 17, LEN);
        assert_eq!(o, [0x0a, 2, b'v', b'1', 0x8a, 0x01]);
    }
}
