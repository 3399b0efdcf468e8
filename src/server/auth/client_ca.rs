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
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
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
    current: RwLock<Bundle>,
    /// The bytes the current bundle was loaded from.
    loaded_from: Mutex<Vec<u8>>,
    /// Counts the bundles loaded, from 1.
    generation: AtomicU64,
    /// The current bundle's `expires` (`i64::MAX`: none), read at every request.
    expires: AtomicI64,
}

/// One loaded bundle: the verifier of its CAs valid when it was built, and when the first of
/// them expires (it is built again then: webpki does not check a trust anchor's validity, Go's
/// `x509` does — a review: a CA past its `notAfter` kept authenticating its certificates).
#[derive(Clone, Debug)]
struct Bundle {
    verifier: Arc<dyn ClientCertVerifier>,
    /// The bundle's subjects, sent in the CertificateRequest (clients choose a certificate by
    /// them). rustls borrows them from the verifier for the whole handshake, so each bundle's
    /// are kept for the process's life: one small list per bundle built.
    hints: &'static [DistinguishedName],
    /// Every CA of the file had expired: nothing is trusted (the verifier is of them all, for
    /// the handshake's hints and schemes only).
    trusts_none: bool,
    /// The earliest `notAfter` of the CAs trusted (Unix seconds).
    expires: Option<i64>,
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

fn bundle(path: &Path, pem: &[u8], now: i64) -> Result<Bundle, String> {
    let what = |e: &dyn std::fmt::Display| format!("--client-ca-file {}: {e}", path.display());
    let (mut valid, mut all) = (RootCertStore::empty(), RootCertStore::empty());
    let mut expires: Option<i64> = None;
    for c in CertificateDer::pem_slice_iter(pem) {
        let c = c.map_err(|e| what(&e))?;
        let not_after = super::x509::not_after(&c);
        if not_after.is_none_or(|t| now <= t) {
            valid.add(c.clone()).map_err(|e| what(&e))?;
            expires = not_after.into_iter().chain(expires).min();
        } else {
            tracing::warn!(file = %path.display(), not_after, "a client CA has expired: not trusted");
        }
        all.add(c).map_err(|e| what(&e))?;
    }
    if all.is_empty() {
        return Err(what(&"no certificate found"));
    }
    let trusts_none = valid.is_empty();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(
        Arc::new(if trusts_none { all } else { valid }),
        provider,
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| what(&e))?;
    let hints = Box::leak(verifier.root_hint_subjects().to_vec().into_boxed_slice());
    Ok(Bundle { verifier, hints, trusts_none, expires })
}

impl ClientCa {
    pub fn load(path: &Path) -> Result<Arc<ClientCa>, String> {
        let pem = std::fs::read(path).map_err(|e| format!("--client-ca-file {}: {e}", path.display()))?;
        let b = bundle(path, &pem, unix_now())?;
        Ok(Arc::new(ClientCa {
            path: path.to_owned(),
            expires: AtomicI64::new(b.expires.unwrap_or(i64::MAX)),
            current: RwLock::new(b),
            loaded_from: Mutex::new(pem),
            generation: AtomicU64::new(1),
        }))
    }

    /// Puts `b` in place of the current bundle (`loaded_from` locked by the caller) and moves
    /// the generation on — after the swap: a handshake that read the old generation after it
    /// may have used the new bundle, which only makes its connection verify once more.
    fn swap(&self, b: Bundle) {
        self.expires.store(b.expires.unwrap_or(i64::MAX), Ordering::Release);
        *self.current.write() = b;
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Builds the bundle again from the bytes it was loaded from when one of its CAs has
    /// expired since (between two polls, or with the file unreadable): no certificate is
    /// trusted past its CA's `notAfter` (a review).
    fn drop_expired(&self) {
        if unix_now() <= self.expires.load(Ordering::Acquire) {
            return;
        }
        let from = self.loaded_from.lock();
        let now = unix_now();
        if now <= self.expires.load(Ordering::Acquire) {
            return; // rebuilt meanwhile
        }
        match bundle(&self.path, &from, now) {
            Ok(b) => self.swap(b),
            Err(e) => tracing::warn!("client CA bundle: {e}"),
        }
    }

    /// Reloads when the file's content changed, or a CA of the bundle has expired since it was
    /// built: `Ok(true)` when the bundle was swapped; a broken or unreadable file is an error
    /// and the old bundle stays (without the CAs expired since).
    pub fn reload_if_changed(&self) -> Result<bool, String> {
        let generation = self.generation();
        self.drop_expired();
        let dropped = self.generation() != generation;
        let pem = std::fs::read(&self.path)
            .map_err(|e| format!("--client-ca-file {}: {e}", self.path.display()))?;
        let mut from = self.loaded_from.lock();
        if *from == pem {
            return Ok(dropped);
        }
        let b = bundle(&self.path, &pem, unix_now())?;
        self.swap(b);
        *from = pem;
        Ok(true)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bundle's generation: changes at every reload, and once a CA of it has expired.
    pub fn generation(&self) -> u64 {
        self.drop_expired();
        self.generation.load(Ordering::Acquire)
    }

    /// Whether `chain` (leaf first) is trusted by the current bundle at `now`.
    pub fn verifies(&self, chain: &[CertificateDer<'_>], now: SystemTime) -> bool {
        let Some((leaf, intermediates)) = chain.split_first() else { return false };
        let now = UnixTime::since_unix_epoch(now.duration_since(UNIX_EPOCH).unwrap_or_default());
        self.drop_expired();
        let b = self.current.read().clone();
        !b.trusts_none && b.verifier.verify_client_cert(leaf, intermediates, now).is_ok()
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
        self.0.current.read().verifier.clone()
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
        self.0.current.read().hints
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
        self.0.drop_expired();
        let b = self.0.current.read().clone();
        if b.trusts_none {
            return Err(rustls::Error::InvalidCertificate(rustls::CertificateError::Expired));
        }
        b.verifier.verify_client_cert(end_entity, intermediates, now)
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

    /// A CA valid until `not_after` (Unix seconds), and leaves it signs, valid for a century.
    pub struct TestCa {
        pub pem: String,
        issuer: Issuer<'static, KeyPair>,
    }

    impl TestCa {
        pub fn until(not_after: i64) -> TestCa {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.distinguished_name.push(DnType::CommonName, format!("test CA {}", fastrand::u32(..)));
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.not_before = rcgen::date_time_ymd(2000, 1, 1);
            p.not_after = rcgen::date_time_ymd(1970, 1, 1) + std::time::Duration::from_secs(not_after as u64);
            let key = KeyPair::generate().unwrap();
            let pem = p.self_signed(&key).unwrap().pem();
            TestCa { pem, issuer: Issuer::new(p, key) }
        }

        pub fn leaf(&self, cn: &str) -> CertificateDer<'static> {
            self.leaf_until(cn, 4_102_444_800)
        }

        /// A leaf valid until `not_after` (Unix seconds).
        pub fn leaf_until(&self, cn: &str, not_after: i64) -> CertificateDer<'static> {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.distinguished_name.push(DnType::CommonName, cn);
            p.not_before = rcgen::date_time_ymd(2000, 1, 1);
            p.not_after = rcgen::date_time_ymd(1970, 1, 1) + std::time::Duration::from_secs(not_after as u64);
            p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
            p.signed_by(&KeyPair::generate().unwrap(), &self.issuer).unwrap().der().clone()
        }
    }

    pub fn ca_file(pems: &[&str]) -> (Arc<ClientCa>, PathBuf) {
        let path = std::env::temp_dir().join(format!("kwc-client-ca-{}.crt", fastrand::u64(..)));
        std::fs::write(&path, pems.concat()).unwrap();
        (ClientCa::load(&path).unwrap(), path)
    }

    /// A CA past its `notAfter` is not trusted (Go's `x509` checks the root's validity, webpki
    /// does not); a file of expired CAs alone trusts nothing; a CA that expires while loaded
    /// is taken out at the next poll (a review).
    #[test]
    fn expired_cas_are_not_trusted() {
        let now = unix_now();
        let (expired, valid) = (TestCa::until(now - 3600), TestCa::until(now + 3600));
        let (ca, path) = ca_file(&[&expired.pem, &valid.pem]);
        let t = SystemTime::now();
        assert!(ca.verifies(&[valid.leaf("v")], t));
        assert!(!ca.verifies(&[expired.leaf("e")], t), "its CA expired");
        let (none, path2) = ca_file(&[&expired.pem]);
        assert!(!none.verifies(&[expired.leaf("e")], t), "nothing trusted");
        // Expiring while loaded: a poll after its notAfter builds the bundle again without it.
        let soon = TestCa::until(unix_now() + 1);
        std::fs::write(&path, [soon.pem.as_str(), &valid.pem].concat()).unwrap();
        assert_eq!(ca.reload_if_changed(), Ok(true));
        let generation = ca.generation();
        let leaf = soon.leaf("s");
        assert!(ca.verifies(std::slice::from_ref(&leaf), SystemTime::now()));
        assert_eq!(ca.reload_if_changed(), Ok(false), "nothing changed, nothing expired yet");
        // Past its notAfter it is trusted no more, without waiting for a poll (and with the
        // file gone: nothing can be read again).
        std::fs::remove_file(&path).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while ca.verifies(std::slice::from_ref(&leaf), SystemTime::now()) {
            assert!(std::time::Instant::now() < deadline, "still trusted 10 s after its CA expired");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(ca.generation() > generation, "open connections verify again");
        assert!(ca.reload_if_changed().is_err(), "the file is gone; the bundle stays, without the CA");
        assert!(!ca.verifies(std::slice::from_ref(&leaf), SystemTime::now()), "its CA expired while loaded");
        assert!(ca.verifies(&[valid.leaf("v")], SystemTime::now()));
        let _ = std::fs::remove_file(path2);
    }
}
