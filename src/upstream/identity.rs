//! The proxy's client certificate: parsed from PEM ([`Identity`]) and, once the TLS layer is
//! built, held in an [`IdentitySlot`] that every own connection's handshake reads, so that a
//! certificate an exec plugin renews is presented by the next connection without rebuilding
//! the clients.
//!
//! Used by `config.rs` (flags, kubeconfig data and files, an exec plugin's first answer),
//! `tls.rs` (the client-certificate resolver) and `auth.rs` (renewals). Depends only on
//! `errors.rs`.

use std::sync::Arc;

use parking_lot::RwLock;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::errors::{one_line, ConfigError};

/// A client certificate chain and its key.
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Identity {
    /// From PEM (the key PKCS#8, PKCS#1 or SEC1).
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Identity, ConfigError> {
        let chain =
            parse_certs(cert_pem).map_err(|e| ConfigError::Tls(format!("client certificate: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| ConfigError::Tls(format!("client key: {}", one_line(&e.to_string()))))?;
        Ok(Identity { chain, key })
    }

    fn certified(&self) -> Result<Arc<CertifiedKey>, ConfigError> {
        // Not `with_client_auth_cert`: it parses the certificate with webpki to match the key,
        // which refuses X.509 v1 certificates (`openssl x509 -req` without extensions makes
        // them). Whether the certificate is acceptable is the upstream's decision;
        // kube-apiserver accepts v1 client certificates.
        let key = rustls::crypto::ring::default_provider()
            .key_provider
            .load_private_key(self.key.clone_key())
            .map_err(|e| ConfigError::Tls(format!("client certificate key: {e}")))?;
        Ok(Arc::new(CertifiedKey::new(self.chain.clone(), key)))
    }
}

/// PEM certificates; an error when there are none.
pub(crate) fn parse_certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs =
        CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no PEM certificate found".into());
    }
    Ok(certs)
}

/// The certificate the own connections present; replaced in place on renewal.
#[derive(Debug)]
pub struct IdentitySlot(RwLock<Arc<CertifiedKey>>, std::sync::atomic::AtomicU64);

impl IdentitySlot {
    pub fn new(id: &Identity) -> Result<Arc<IdentitySlot>, ConfigError> {
        Ok(Arc::new(IdentitySlot(RwLock::new(id.certified()?), std::sync::atomic::AtomicU64::new(0))))
    }

    /// New connections present `id` from now on; the own clients' lanes see the
    /// [`IdentitySlot::generation`] change and open new connections (`lanes`), as client-go's
    /// exec authenticator closes its connections when the certificate changes (a review: a
    /// busy shared HTTP/2 connection presented the old one until it expired, then every own
    /// request got 401).
    pub fn replace(&self, id: &Identity) -> Result<(), ConfigError> {
        *self.0.write() = id.certified()?;
        self.1.fetch_add(1, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// How many times the certificate was replaced.
    pub fn generation(&self) -> u64 {
        self.1.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn current(&self) -> Arc<CertifiedKey> {
        self.0.read().clone()
    }
}

/// Offered whenever the server asks for a client certificate, if its key can sign with a
/// scheme the server accepts.
impl rustls::client::ResolvesClientCert for IdentitySlot {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        let certified = self.current();
        certified.key.choose_scheme(sigschemes).map(|_| certified.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::testutil::{CLIENT_KEY, CLIENT_PEM, SERVER_KEY, SERVER_PEM};

    /// A certificate an exec plugin renews is what the next handshake presents.
    #[test]
    fn a_replaced_identity_is_the_current_one() {
        let first = Identity::from_pem(CLIENT_PEM.as_bytes(), CLIENT_KEY.as_bytes()).unwrap();
        let slot = IdentitySlot::new(&first).unwrap();
        assert_eq!(slot.current().cert, first.chain);
        let second = Identity::from_pem(SERVER_PEM.as_bytes(), SERVER_KEY.as_bytes()).unwrap();
        assert_eq!(slot.generation(), 0);
        slot.replace(&second).unwrap();
        assert_eq!(slot.current().cert, second.chain);
        assert_eq!(slot.generation(), 1);
        assert!(Identity::from_pem(b"no", b"no").is_err());
    }
}
