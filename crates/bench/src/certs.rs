//! The throwaway PKI of `bench --tls`: a fresh certificate authority and two serving
//! certificates for 127.0.0.1 / localhost (the proxy's and the sim's), written as PEM files in a
//! private temporary directory that is removed when the [`Pki`] is dropped.
//!
//! Called by `env::Local::start` in in-process `--tls` mode. Every certificate has its own
//! CommonName: OpenSSL-based clients reject a chain whose issuer and subject names are equal.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The files of one run, and the CA's issuer (node client certificates are signed with it).
pub struct Pki {
    pub dir: PathBuf,
    /// The CA certificate (PEM): the bench clients' and the proxy's trust anchor.
    pub ca: PathBuf,
    pub proxy_cert: PathBuf,
    pub proxy_key: PathBuf,
    pub sim_cert: PathBuf,
    pub sim_key: PathBuf,
    pub issuer: Issuer<'static, KeyPair>,
}

/// A kubelet's client certificate: `CN=system:node:<node>, O=system:nodes`, client auth, signed
/// by `ca` (the Node authorizer's identity for that node). PEM chain and key.
pub fn node_certificate(node: &str, ca: &Issuer<'_, KeyPair>) -> Result<(String, String), String> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(err(node))?;
    p.distinguished_name.push(DnType::CommonName, format!("system:node:{node}"));
    p.distinguished_name.push(DnType::OrganizationName, "system:nodes");
    p.use_authority_key_identifier_extension = true;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().map_err(err(node))?;
    let cert = p.signed_by(&key, ca).map_err(err(node))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A CA given as PEM files (`--node-ca-cert`, `--node-ca-key`), to sign node certificates.
pub fn issuer_from_files(cert: &Path, key: &Path) -> Result<Issuer<'static, KeyPair>, String> {
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    let key = KeyPair::from_pem(&read(key)?).map_err(|e| format!("{}: {e}", key.display()))?;
    Issuer::from_ca_cert_pem(&read(cert)?, key).map_err(|e| format!("{}: {e}", cert.display()))
}

fn err(what: &str) -> impl Fn(rcgen::Error) -> String + '_ {
    move |e| format!("generating the {what}: {e}")
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// A serving certificate for 127.0.0.1, ::1 and localhost, signed by `ca`.
fn serving(cn: &str, ca: &Issuer<'_, KeyPair>) -> Result<(String, String), String> {
    let names = vec!["127.0.0.1".to_owned(), "::1".to_owned(), "localhost".to_owned()];
    let mut p = CertificateParams::new(names).map_err(err(cn))?;
    p.distinguished_name.push(DnType::CommonName, cn);
    p.use_authority_key_identifier_extension = true;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(err(cn))?;
    let cert = p.signed_by(&key, ca).map_err(err(cn))?;
    Ok((cert.pem(), key.serialize_pem()))
}

impl Pki {
    /// Generates the CA and both certificates into a new directory under the system temp dir.
    pub fn generate() -> Result<Pki, String> {
        let dir = std::env::temp_dir().join(format!(
            "kube-watchcache-bench-tls-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        // 0700: the keys and the sim's admin token written here are this user's alone.
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err("CA"))?;
        ca.distinguished_name.push(DnType::CommonName, "kube-watchcache bench CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().map_err(err("CA"))?;
        let ca_pem = ca.self_signed(&ca_key).map_err(err("CA"))?.pem();
        let pki = Pki {
            ca: dir.join("ca.crt"),
            proxy_cert: dir.join("proxy.crt"),
            proxy_key: dir.join("proxy.key"),
            sim_cert: dir.join("sim.crt"),
            sim_key: dir.join("sim.key"),
            dir,
            issuer: Issuer::new(ca, ca_key),
        };
        write(&pki.ca, &ca_pem)?;
        let issuer = &pki.issuer;
        for (cn, cert, key) in [
            ("kube-watchcache bench proxy", &pki.proxy_cert, &pki.proxy_key),
            ("kube-watchcache bench sim", &pki.sim_cert, &pki.sim_key),
        ] {
            let (c, k) = serving(cn, issuer)?;
            write(cert, &c)?;
            write(key, &k)?;
        }
        Ok(pki)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;

    #[test]
    fn the_serving_certificates_verify_against_the_ca_for_127_0_0_1() {
        let pki = Pki::generate().unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&pki.dir).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "the keys' directory is the user's alone");
        }
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_file(&pki.ca).unwrap()).unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
            .build()
            .unwrap();
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let now = rustls_pki_types::UnixTime::now();
        for cert in [&pki.proxy_cert, &pki.sim_cert] {
            let leaf = CertificateDer::from_pem_file(cert).unwrap();
            verifier.verify_server_cert(&leaf, &[], &name, &[], now).unwrap();
        }
        let dir = pki.dir.clone();
        drop(pki);
        assert!(!dir.exists(), "removed on drop");
    }
}
