//! The proxy's client certificate: parsed from PEM ([`Identity`]) and, once the TLS layer is
//! built, held in an [`IdentitySlot`] that every own connection's handshake reads, so that a
//! certificate an exec plugin renews, or that its files are rewritten with (cert-manager,
//! kubelet-style rotation), is presented by the next connection without rebuilding the clients.
//!
//! Used by `config.rs` (flags, kubeconfig data and files, an exec plugin's first answer),
//! `tls.rs` (the client-certificate resolver), `auth.rs` (renewals) and `client.rs` (which
//! starts [`IdentitySlot::reload_files`]). Depends only on `errors.rs`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
        let certified = CertifiedKey::new(self.chain.clone(), key);
        // A key that is not the certificate's (files rewritten one after the other, and read
        // between): refused, as Go's `tls.X509KeyPair` refuses it (a review: every own handshake
        // then failed until a restart). A certificate webpki cannot parse (X.509 v1) is not
        // compared.
        if let Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) =
            certified.keys_match()
        {
            return Err(ConfigError::Tls("the client certificate and key do not match".into()));
        }
        Ok(Arc::new(certified))
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

/// How often client certificate and key files are read again: client-go's
/// `CertCallbackRefreshDuration`, after which its rotating dialer closes the connections that
/// presented the old certificate.
pub const CERT_FILES_REFRESH: Duration = Duration::from_secs(300);

/// The certificate the own connections present; replaced in place on renewal.
#[derive(Debug)]
pub struct IdentitySlot {
    current: RwLock<Arc<CertifiedKey>>,
    generation: std::sync::atomic::AtomicU64,
    /// The certificate chain and key (DER) of the files last read into `current`: a reload
    /// replaces the certificate when either changed (client-go's `certsEqual`).
    read: parking_lot::Mutex<Option<(Vec<CertificateDer<'static>>, Vec<u8>)>>,
    /// Reads of the files finished (for tests).
    reloads: std::sync::atomic::AtomicU64,
    /// The certificate and key files it was read from, when both were files (client-go reloads
    /// only then, `ReloadTLSFiles`): read again every [`CERT_FILES_REFRESH`].
    files: Option<(PathBuf, PathBuf)>,
}

impl IdentitySlot {
    pub fn new(id: &Identity) -> Result<Arc<IdentitySlot>, ConfigError> {
        Ok(Arc::new(IdentitySlot {
            current: RwLock::new(id.certified()?),
            generation: std::sync::atomic::AtomicU64::new(0),
            read: parking_lot::Mutex::new(None),
            reloads: std::sync::atomic::AtomicU64::new(0),
            files: None,
        }))
    }

    /// From certificate and key files, read now (an error stops the start) and again later
    /// ([`IdentitySlot::reload_files`]).
    pub fn from_files(cert: PathBuf, key: PathBuf) -> Result<Arc<IdentitySlot>, ConfigError> {
        let id = read_files(&cert, &key)?;
        Ok(Arc::new(IdentitySlot {
            current: RwLock::new(id.certified()?),
            generation: std::sync::atomic::AtomicU64::new(0),
            read: parking_lot::Mutex::new(Some((id.chain.clone(), id.key.secret_der().to_vec()))),
            reloads: std::sync::atomic::AtomicU64::new(0),
            files: Some((cert, key)),
        }))
    }

    /// Reads the files again every [`CERT_FILES_REFRESH`] while the slot lives; a new
    /// certificate is [`IdentitySlot::replace`]d in (so the own lanes open new connections), a
    /// failed read or parse keeps the current one with a warning. Each read runs on a thread of
    /// its own (a mount that hangs holds that thread, not the proxy); `None` without files.
    pub fn reload_files(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let (cert, key) = self.files.clone()?;
        let slot = Arc::downgrade(self);
        Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(CERT_FILES_REFRESH).await;
                let (tx, rx) = tokio::sync::oneshot::channel();
                let (c, k) = (cert.clone(), key.clone());
                let spawned = std::thread::Builder::new()
                    .name("client-cert-files".into())
                    .spawn(move || drop(tx.send(read_files(&c, &k))));
                let read = match spawned {
                    Ok(_) => rx.await.unwrap_or_else(|_| Err(ConfigError::Tls("the read ended".into()))),
                    Err(e) => Err(ConfigError::Tls(format!("no thread to read them: {e}"))),
                };
                let Some(slot) = slot.upgrade() else { return };
                slot.reloaded(read, &cert);
                slot.reloads.fetch_add(1, std::sync::atomic::Ordering::Release);
            }
        }))
    }

    /// New connections present `id` from now on; the own clients' lanes see the
    /// [`IdentitySlot::generation`] change and open new connections (`lanes`), as client-go's
    /// exec authenticator closes its connections when the certificate changes (a review: a
    /// busy shared HTTP/2 connection presented the old one until it expired, then every own
    /// request got 401).
    pub fn replace(&self, id: &Identity) -> Result<(), ConfigError> {
        *self.current.write() = id.certified()?;
        self.generation.fetch_add(1, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// A read of the files: replaces the certificate when the pair changed and matches.
    fn reloaded(&self, read: Result<Identity, ConfigError>, cert: &std::path::Path) {
        let id = match read {
            Ok(id) => id,
            Err(e) => {
                return tracing::warn!(cert = %cert.display(), "keeping the current client certificate: {e}")
            }
        };
        let now = (id.chain.clone(), id.key.secret_der().to_vec());
        if self.read.lock().as_ref() == Some(&now) {
            return;
        }
        match self.replace(&id) {
            Ok(()) => {
                *self.read.lock() = Some(now);
                tracing::info!(
                    cert = %cert.display(),
                    "client certificate files changed: new upstream connections present the new certificate"
                );
            }
            Err(e) => tracing::warn!(cert = %cert.display(), "keeping the current client certificate: {e}"),
        }
    }

    /// Reads of the certificate files finished.
    #[cfg(test)]
    fn reloads(&self) -> u64 {
        self.reloads.load(std::sync::atomic::Ordering::Acquire)
    }

    /// How many times the certificate was replaced.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().clone()
    }
}

fn read_files(cert: &std::path::Path, key: &std::path::Path) -> Result<Identity, ConfigError> {
    let read = |path: &std::path::Path, what: &'static str| {
        std::fs::read(path).map_err(|e| ConfigError::read_file(what, path, e))
    };
    Identity::from_pem(&read(cert, "client certificate")?, &read(key, "client key")?)
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
    use crate::upstream::testutil::{TempDir, CLIENT_KEY, CLIENT_PEM, SERVER_KEY, SERVER_PEM};

    /// Files rewritten with another certificate are read again within
    /// [`CERT_FILES_REFRESH`] (client-go's period) and presented by new connections (the
    /// generation moves, so the own lanes leave the old ones); unchanged files move nothing; a
    /// certificate read with a key that is not its own, or an unreadable pair, keeps the current
    /// one, and the pair is taken once it matches again. Data given inline is never re-read;
    /// a pair that does not match is refused at start too.
    #[tokio::test(start_paused = true)]
    async fn certificate_files_are_read_again() {
        let dir = TempDir::new();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, CLIENT_PEM).unwrap();
        std::fs::write(&key, CLIENT_KEY).unwrap();
        let slot = IdentitySlot::from_files(cert.clone(), key.clone()).unwrap();
        let first = slot.current().cert.clone();
        let task = slot.reload_files().expect("files are watched");
        // One period more, then until that read has finished (a thread of its own: real time).
        let period = |n: u64| {
            let slot = slot.clone();
            async move {
                tokio::time::sleep(CERT_FILES_REFRESH).await;
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                while slot.reloads() < n {
                    assert!(std::time::Instant::now() < deadline, "read {n} never finished");
                    tokio::task::yield_now().await;
                }
                slot.generation()
            }
        };
        assert_eq!(period(1).await, 0, "unchanged: nothing");
        // The certificate rewritten first, read before the key: refused, then taken.
        std::fs::write(&cert, SERVER_PEM).unwrap();
        assert_eq!(period(2).await, 0, "a certificate with another's key is not presented");
        std::fs::write(&key, SERVER_KEY).unwrap();
        assert_eq!(period(3).await, 1, "the rewritten pair");
        assert_ne!(slot.current().cert, first);
        std::fs::write(&key, "not a key").unwrap();
        assert_eq!(period(4).await, 1, "a broken pair keeps the current certificate");
        task.abort();
        let inline =
            IdentitySlot::new(&Identity::from_pem(CLIENT_PEM.as_bytes(), CLIENT_KEY.as_bytes()).unwrap());
        assert!(inline.unwrap().reload_files().is_none());
        let mismatched = Identity::from_pem(CLIENT_PEM.as_bytes(), SERVER_KEY.as_bytes()).unwrap();
        let e = IdentitySlot::new(&mismatched).err().unwrap().to_string();
        assert!(e.contains("do not match"), "{e}");
    }

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
