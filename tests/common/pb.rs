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
