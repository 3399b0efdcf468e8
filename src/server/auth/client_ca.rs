//! `--client-ca-file`: the verifier of client certificates, reloaded when the file's content
//! changes (polled with the serving certificate by `tls::watch_files`), and its generation,
//! which tells a connection verified under an older bundle to verify its chain again at its next
//! request (`PeerUser::valid_at`) — kube-apiserver verifies a client's chain at every request
//! against its current bundle, so a CA taken out of the file stops authenticating open
//! connections and resumed TLS sessions too. An X.509 v1 certificate passes the handshake
//! unverified so that the listener can answer its requests with a clear 401
//! (`auth::VersionOneCertificate`); nothing is ever authenticated from one.
//!
//! Built by `tls::server_config`; asked by rustls at each handshake and by `PeerUser`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};

/// The client CA bundle now trusted, swapped on reload.
#[derive(Debug)]
pub struct ClientCa {
    path: PathBuf,
    current: RwLock<Arc<dyn ClientCertVerifier>>,
    /// The bundle's subjects, sent in the CertificateRequest (clients choose a certificate by
    /// them). rustls borrows them from the verifier for the whole handshake, so each bundle's
    /// are kept for the process's life: one small list per change of the file's content.
    hints: RwLock<&'static [DistinguishedName]>,
    /// The bytes the current bundle was loaded from.
    loaded_from: Mutex<Vec<u8>>,
    /// Counts the bundles loaded, from 1.
    generation: AtomicU64,
}

fn verifier(path: &Path, pem: &[u8]) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let what = |e: &dyn std::fmt::Display| format!("--client-ca-file {}: {e}", path.display());
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pem) {
        roots.add(c.map_err(|e| what(&e))?).map_err(|e| what(&e))?;
    }
    if roots.is_empty() {
        return Err(what(&"no certificate found"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|e| what(&e))
}

fn hints_of(v: &dyn ClientCertVerifier) -> &'static [DistinguishedName] {
    Box::leak(v.root_hint_subjects().to_vec().into_boxed_slice())
}

impl ClientCa {
    pub fn load(path: &Path) -> Result<Arc<ClientCa>, String> {
        let pem = std::fs::read(path).map_err(|e| format!("--client-ca-file {}: {e}", path.display()))?;
        let v = verifier(path, &pem)?;
        Ok(Arc::new(ClientCa {
            path: path.to_owned(),
            hints: RwLock::new(hints_of(&*v)),
            current: RwLock::new(v),
            loaded_from: Mutex::new(pem),
            generation: AtomicU64::new(1),
        }))
    }

    /// Reloads when the file's content changed: `Ok(true)` when the bundle was swapped; a
    /// broken new file is an error and the old bundle stays.
    pub fn reload_if_changed(&self) -> Result<bool, String> {
        let pem = std::fs::read(&self.path)
            .map_err(|e| format!("--client-ca-file {}: {e}", self.path.display()))?;
        let mut from = self.loaded_from.lock();
        if *from == pem {
            return Ok(false);
        }
        let v = verifier(&self.path, &pem)?;
        *self.hints.write() = hints_of(&*v);
        *self.current.write() = v;
        *from = pem;
        // After the swap: a handshake that read the old generation after it may have used
        // the new bundle, which only makes its connection verify once more.
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bundle's generation: changes at every reload.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether `chain` (leaf first) is trusted by the current bundle at `now`.
    pub fn verifies(&self, chain: &[CertificateDer<'_>], now: SystemTime) -> bool {
        let Some((leaf, intermediates)) = chain.split_first() else { return false };
        let now = UnixTime::since_unix_epoch(now.duration_since(UNIX_EPOCH).unwrap_or_default());
        let v = self.current.read().clone();
        v.verify_client_cert(leaf, intermediates, now).is_ok()
    }

    /// The verifier rustls asks at each handshake: the current bundle's, v1 certificates let
    /// through unverified.
    pub fn handshake_verifier(self: &Arc<Self>) -> Arc<dyn ClientCertVerifier> {
        Arc::new(VersionOneTolerant(self.clone()))
    }
}

/// The client-certificate verifier, except that an X.509 v1 certificate (which webpki refuses,
/// and kube-apiserver accepts) lets the handshake complete unverified, so that the listener can
/// answer every request on that connection with a clear 401 (`auth::VersionOneCertificate`)
/// instead of a bare TLS alert. Nothing is ever authenticated from such a certificate, so
/// neither its chain nor its handshake signature needs checking; every other certificate is
/// verified by the current bundle.
#[derive(Debug)]
struct VersionOneTolerant(Arc<ClientCa>);

impl VersionOneTolerant {
    fn current(&self) -> Arc<dyn ClientCertVerifier> {
        self.0.current.read().clone()
    }
}

impl ClientCertVerifier for VersionOneTolerant {
    fn offer_client_auth(&self) -> bool {
        self.current().offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.current().client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        *self.0.hints.read()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if super::x509::is_v1(end_entity) {
            return Ok(ClientCertVerified::assertion());
        }
        self.current().verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        unless_v1(cert, || self.current().verify_tls12_signature(message, cert, dss))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        unless_v1(cert, || self.current().verify_tls13_signature(message, cert, dss))
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().supported_verify_schemes()
    }
}

/// A v1 certificate's handshake signature is not checked (nothing is authenticated from it);
/// any other goes to `verify`.
fn unless_v1(
    cert: &CertificateDer<'_>,
    verify: impl FnOnce() -> Result<HandshakeSignatureValid, rustls::Error>,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    if super::x509::is_v1(cert) {
        return Ok(HandshakeSignatureValid::assertion());
    }
    verify()
}
