//! The user of a verified client certificate, as the apiserver's x509 authenticator reads it:
//! name = the subject's CommonName, groups = its Organization values, read like Go's
//! `pkix.Name.FillFromRDNSequence`: every RDN in order, so the LAST CommonName wins and the
//! Organizations keep their order; attribute values are decoded like Go's `parseASN1String`
//! (a value Go would refuse makes the whole subject unreadable). A minimal DER reader for the
//! subject only (the chain itself was verified by rustls against `--client-ca-file`); no
//! maintained X.509 parser is in the dependency tree (rustls-webpki does not expose subjects).
//!
//! Called by the listener once per TLS connection; must not panic on any input (fuzzed).

use super::user::UserInfo;

const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
const OID_O: &[u8] = &[0x55, 0x04, 0x0a];

/// One DER element: (tag, contents, rest).
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None; // high tag numbers never appear in the parts read here
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |acc, b| (acc << 8) | *b as usize);
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

fn expect(input: &[u8], want: u8) -> Option<(&[u8], &[u8])> {
    let (tag, body, rest) = tlv(input)?;
    (tag == want).then_some((body, rest))
}

/// (CommonName, Organizations) of the certificate's subject.
pub fn subject(cert_der: &[u8]) -> Option<(String, Vec<String>)> {
    let (cert, _) = expect(cert_der, 0x30)?;
    let (tbs, _) = expect(cert, 0x30)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = tlv(rest)?.2; // version
    }
    let (_, rest) = expect(rest, 0x02)?; // serialNumber
    let (_, rest) = expect(rest, 0x30)?; // signature
    let (_, rest) = expect(rest, 0x30)?; // issuer
    let (_, rest) = expect(rest, 0x30)?; // validity
    let (mut name, _) = expect(rest, 0x30)?; // subject
    let mut cn = None;
    let mut orgs = Vec::new();
    while !name.is_empty() {
        let (mut rdn, next) = expect(name, 0x31)?;
        name = next;
        while !rdn.is_empty() {
            let (atv, next) = expect(rdn, 0x30)?;
            rdn = next;
            let (oid, value) = expect(atv, 0x06)?;
            let (tag, value, _) = tlv(value)?;
            let text = string(tag, value)?;
            if oid == OID_CN {
                // Go overwrites: the last CommonName is the name.
                cn = Some(text);
            } else if oid == OID_O {
                orgs.push(text);
            }
        }
    }
    Some((cn.unwrap_or_default(), orgs))
}

/// Whether the certificate is X.509 version 1 (no `[0] version` in the TBSCertificate, or
/// version 0). rustls' verifier (webpki) refuses such certificates; Go accepts them.
pub fn is_v1(cert_der: &[u8]) -> bool {
    let Some((cert, _)) = expect(cert_der, 0x30) else { return false };
    let Some((tbs, _)) = expect(cert, 0x30) else { return false };
    match tlv(tbs) {
        Some((0xa0, version, _)) => matches!(expect(version, 0x02), Some((&[0], _))),
        Some(_) => true,
        None => false,
    }
}

/// The certificate's `notAfter` as Unix seconds (UTCTime or GeneralizedTime, `…Z`); for the
/// serving certificate's expiry metric.
pub fn not_after(cert_der: &[u8]) -> Option<i64> {
    let (cert, _) = expect(cert_der, 0x30)?;
    let (tbs, _) = expect(cert, 0x30)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = tlv(rest)?.2; // version
    }
    let (_, rest) = expect(rest, 0x02)?; // serialNumber
    let (_, rest) = expect(rest, 0x30)?; // signature
    let (_, rest) = expect(rest, 0x30)?; // issuer
    let (validity, _) = expect(rest, 0x30)?;
    let (_, _, after) = tlv(validity)?; // notBefore
    let (tag, t, _) = tlv(after)?;
    let digits = std::str::from_utf8(t).ok()?.strip_suffix('Z')?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let num = |s: &str| s.parse::<i64>().ok();
    let (year, rest) = match (tag, digits.len()) {
        // UTCTime YYMMDDHHMMSS: 50–99 are 19xx (RFC 5280).
        (0x17, 12) => {
            let yy = num(&digits[..2])?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &digits[2..])
        }
        (0x18, 14) => (num(&digits[..4])?, &digits[4..]),
        _ => return None,
    };
    let (month, day) = (num(&rest[..2])?, num(&rest[2..4])?);
    let (h, m, s) = (num(&rest[4..6])?, num(&rest[6..8])?, num(&rest[8..10])?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + s)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Go's `parseASN1String` (crypto/x509/parser.go): the string types it knows, checked like it
/// checks them; `None` where Go fails.
fn string(tag: u8, v: &[u8]) -> Option<String> {
    match tag {
        // UTF8String
        0x0c => String::from_utf8(v.to_vec()).ok(),
        // PrintableString, with Go's leniency for `*` and `&`.
        0x13 => v.iter().all(|&b| printable(b)).then(|| v.iter().map(|&b| b as char).collect()),
        // T61String: read as Latin-1, like Go and BoringSSL.
        0x14 => Some(v.iter().map(|&b| b as char).collect()),
        // IA5String: ASCII.
        0x16 => v.is_ascii().then(|| v.iter().map(|&b| b as char).collect()),
        // NumericString: digits and spaces.
        0x12 => {
            v.iter().all(|&b| b.is_ascii_digit() || b == b' ').then(|| v.iter().map(|&b| b as char).collect())
        }
        // BMPString: UCS-2 (UTF-16BE without surrogates), a trailing NUL pair dropped; the
        // surrogates and the permanent noncharacters (U+FFFE, U+FFFF, U+FDD0–U+FDEF) refused,
        // as Go (and BoringSSL) refuse them.
        0x1e if v.len().is_multiple_of(2) => {
            let v = v.strip_suffix(&[0, 0]).unwrap_or(v);
            v.chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .map(|u| match u {
                    0xfffe | 0xffff | 0xfdd0..=0xfdef | 0xd800..=0xdfff => None,
                    u => char::from_u32(u32::from(u)),
                })
                .collect()
        }
        _ => None,
    }
}

/// Go's `isPrintable` for PrintableString.
fn printable(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b" '()+,-./:=?*&".contains(&b)
}

/// The user of a client certificate; `None` when it has no CommonName (then the request is
/// authenticated by its other credentials, like the apiserver does).
pub fn user(cert_der: &[u8]) -> Option<UserInfo> {
    let (cn, groups) = subject(cert_der)?;
    if cn.is_empty() {
        return None;
    }
    Some(UserInfo { name: cn, groups, ..UserInfo::default() }.with_authenticated_group())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `openssl req -x509 -subj "/O=devs/O=ops/CN=alice"` (see tests/testdata/security).
    fn alice() -> Vec<u8> {
        use rustls_pki_types::pem::PemObject;
        let pem = include_bytes!("../../../tests/testdata/security/alice.crt");
        rustls_pki_types::CertificateDer::from_pem_slice(pem).unwrap().to_vec()
    }

    #[test]
    fn version_one_certificates_are_told_apart() {
        assert!(!is_v1(&alice()), "v3");
        let v1 = include_bytes!("../../../tests/testdata/security/v1/client-v1.crt");
        use rustls_pki_types::pem::PemObject;
        let v1 = rustls_pki_types::CertificateDer::from_pem_slice(v1).unwrap();
        assert!(is_v1(&v1));
        assert!(!is_v1(b"garbage"));
    }

    #[test]
    fn common_name_and_organizations() {
        let u = user(&alice()).unwrap();
        assert_eq!(u.name, "alice");
        assert_eq!(u.groups, ["devs", "ops", "system:authenticated"]);
    }

    #[test]
    fn not_after_of_generalized_and_utc_times() {
        // `openssl x509 -enddate`: 2126-10-29 02:03:49Z (GeneralizedTime after 2049).
        assert_eq!(not_after(&alice()), Some(4_948_913_029));
        let with_validity = |after: Vec<u8>| {
            let validity = [der(0x17, b"240101000000Z"), after].concat();
            let tbs = [der(0x02, &[1]), der(0x30, &[]), der(0x30, &[]), der(0x30, &validity)].concat();
            der(0x30, &der(0x30, &tbs))
        };
        assert_eq!(not_after(&with_validity(der(0x17, b"270301120000Z"))), Some(1_803_902_400));
        assert_eq!(not_after(&with_validity(der(0x17, b"991231235959Z"))), Some(946_684_799));
        assert_eq!(not_after(&with_validity(der(0x17, b"2703011200Z"))), None);
        assert_eq!(not_after(&with_validity(der(0x18, b"20270301120000+0100"))), None);
        for n in 0..alice().len() {
            let _ = not_after(&alice()[..n]);
        }
    }

    /// One DER element with a short or long length.
    fn der(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match content.len() {
            n @ 0..=127 => out.push(n as u8),
            n @ 128..=255 => out.extend([0x81, n as u8]),
            n => out.extend([0x82, (n >> 8) as u8, n as u8]),
        }
        out.extend_from_slice(content);
        out
    }

    /// A certificate whose subject has these (OID, string tag, value) RDNs, one per SET.
    fn cert_with_subject(rdns: &[(&[u8], u8, &[u8])]) -> Vec<u8> {
        let mut name = Vec::new();
        for (oid, tag, value) in rdns {
            let atv = der(0x30, &[der(0x06, oid), der(*tag, value)].concat());
            name.extend(der(0x31, &atv));
        }
        let tbs = [
            der(0xa0, &der(0x02, &[2])), // version v3
            der(0x02, &[1]),             // serialNumber
            der(0x30, &der(0x06, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02])), // signature
            der(0x30, &[]),              // issuer
            der(0x30, &[]),              // validity (not read)
            der(0x30, &name),            // subject
        ]
        .concat();
        der(0x30, &der(0x30, &tbs))
    }

    #[test]
    fn the_last_common_name_wins_and_organizations_keep_their_order() {
        let cert = cert_with_subject(&[
            (OID_O, 0x0c, b"first-org"),
            (OID_CN, 0x0c, b"first"),
            (OID_O, 0x13, b"second-org"),
            (OID_CN, 0x13, b"second"),
        ]);
        let u = user(&cert).unwrap();
        assert_eq!(u.name, "second", "Go's FillFromRDNSequence overwrites CommonName");
        assert_eq!(u.groups, ["first-org", "second-org", "system:authenticated"]);
    }

    #[test]
    fn attribute_values_are_decoded_like_go() {
        let cn = |tag: u8, v: &[u8]| subject(&cert_with_subject(&[(OID_CN, tag, v)])).map(|s| s.0);
        assert_eq!(cn(0x14, b"caf\xe9").as_deref(), Some("caf\u{e9}"), "T61String is Latin-1");
        assert_eq!(cn(0x12, b"0123 45").as_deref(), Some("0123 45"));
        assert_eq!(cn(0x12, b"12a"), None, "not a NumericString");
        assert_eq!(cn(0x13, b"a_b"), None, "`_` is not printable");
        assert_eq!(cn(0x13, b"a*b&c").as_deref(), Some("a*b&c"));
        assert_eq!(cn(0x16, b"caf\xe9"), None, "IA5String is ASCII");
        assert_eq!(cn(0x0c, b"\xff"), None, "invalid UTF-8");
        assert_eq!(cn(0x1e, &[0, b'h', 0, b'i', 0, 0]).as_deref(), Some("hi"), "BMP terminator dropped");
        // Go refuses surrogates and noncharacters in a BMPString (issue 30 §3).
        for bad in [[0xd8, 0x00], [0xdc, 0x00], [0xff, 0xfe], [0xff, 0xff], [0xfd, 0xd0], [0xfd, 0xef]] {
            assert_eq!(cn(0x1e, &[0, b'a', bad[0], bad[1]]), None, "{bad:x?}");
        }
        assert_eq!(cn(0x1e, &[0xfd, 0xcf, 0xff, 0xfd]).as_deref(), Some("\u{fdcf}\u{fffd}"));
        assert_eq!(cn(0x1e, &[0, b'a', 0]), None, "odd length");
        assert_eq!(cn(0x02, &[1]), None, "not a string: Go refuses the subject");
        // A certificate with no CommonName authenticates nobody.
        assert!(user(&cert_with_subject(&[(OID_O, 0x0c, b"devs")])).is_none());
    }

    #[test]
    fn garbage_and_truncations_do_not_panic() {
        let der = alice();
        for n in 0..der.len() {
            let _ = subject(&der[..n]);
        }
        assert!(subject(&[]).is_none());
        assert!(subject(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_none());
        assert!(subject(&[0x30, 0x82]).is_none());
        assert_eq!(string(0x1e, &[0, b'a']), Some("a".into()));
        assert_eq!(string(0x1e, &[0]), None);
    }
}
