//! The user of a verified client certificate, as the apiserver's x509 authenticator reads it:
//! name = the subject's CommonName, groups = its Organization values. A minimal DER reader for
//! the subject only (the chain itself was verified by rustls against `--client-ca-file`).
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
            if oid == OID_CN && cn.is_none() {
                cn = Some(text);
            } else if oid == OID_O {
                orgs.push(text);
            }
        }
    }
    Some((cn.unwrap_or_default(), orgs))
}

fn string(tag: u8, v: &[u8]) -> Option<String> {
    match tag {
        // UTF8String, PrintableString, T61String, IA5String
        0x0c | 0x13 | 0x14 | 0x16 => String::from_utf8(v.to_vec()).ok(),
        // BMPString: UTF-16BE
        0x1e if v.len().is_multiple_of(2) => {
            let units: Vec<u16> = v.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
            String::from_utf16(&units).ok()
        }
        _ => None,
    }
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
    fn common_name_and_organizations() {
        let u = user(&alice()).unwrap();
        assert_eq!(u.name, "alice");
        assert_eq!(u.groups, ["devs", "ops", "system:authenticated"]);
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
