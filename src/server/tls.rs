//! The serving TLS configuration: the certificate and key from PEM files, reloaded when their
//! content changes (polled, default every 10 s) without dropping connections — new handshakes
//! get the new certificate, open connections keep theirs; optional client-certificate
//! verification against `--client-ca-file` (`auth::client_ca`, reloaded the same way;
//! certificates optional, so token callers still connect); ALPN `h2` and `http/1.1`. AES-128-GCM is negotiated whenever the client offers it
//! (the server's order wins over the client's): it is cheaper than AES-256-GCM for both ends of a
//! large LIST, and the clients of this proxy (Go, curl/OpenSSL, rustls) all offer it.
//!
//! Built by `app`; `listener` uses the config and reads the verified peer certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::auth::client_ca::ClientCa;
use crate::metrics::Metrics;
use parking_lot::{Mutex, RwLock};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::watch;

/// Where the serving material comes from.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
    pub reload_interval: Duration,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Whether a suite encrypts with AES-128-GCM (TLS 1.3 or a TLS 1.2 ECDHE suite).
fn is_aes128_gcm(s: &rustls::SupportedCipherSuite) -> bool {
    use rustls::CipherSuite as C;
    matches!(
        s.suite(),
        C::TLS13_AES_128_GCM_SHA256
            | C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            | C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
    )
}

/// The serving provider: ring's suites with the AES-128-GCM ones first (otherwise in ring's
/// order). ring's default puts AES-256-GCM first, and so does OpenSSL (curl); on this
/// project's measurements AES-128-GCM decrypts ~40 % faster in OpenSSL (`openssl speed -evp`),
/// and the client's decryption is what bounds a large LIST over TLS.
pub fn server_provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites.sort_by_key(|s| !is_aes128_gcm(s));
    Arc::new(p)
}

/// The current certificate, swapped atomically on reload.
#[derive(Debug)]
pub struct CertReloader {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// The bytes the current certificate was loaded from.
    loaded_from: Mutex<(Vec<u8>, Vec<u8>)>,
    /// `--client-ca-file`, reloaded with the certificate.
    pub client_ca: Option<Arc<ClientCa>>,
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().clone())
    }
}

fn read(path: &Path, flag: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
}

fn certified_key(cert_pem: &[u8], key_pem: &[u8], cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--tls-cert-file {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("--tls-cert-file {}: no certificate found", cert.display()));
    }
    let pk = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| format!("--tls-private-key-file {}: {e}", key.display()))?;
    CertifiedKey::from_der(chain, pk, &provider()).map_err(|e| format!("TLS certificate/key: {e}"))
}

impl CertReloader {
    pub fn load(cert: &Path, key: &Path) -> Result<CertReloader, String> {
        let (c, k) = (read(cert, "--tls-cert-file")?, read(key, "--tls-private-key-file")?);
        let ck = certified_key(&c, &k, cert, key)?;
        Ok(CertReloader {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: RwLock::new(Arc::new(ck)),
            loaded_from: Mutex::new((c, k)),
            client_ca: None,
        })
    }

    /// Reloads when either file's content changed. `Ok(true)` when the certificate was
    /// swapped; a broken new pair is an error and the old certificate stays.
    pub fn reload_if_changed(&self) -> Result<bool, String> {
        let (c, k) = (read(&self.cert, "--tls-cert-file")?, read(&self.key, "--tls-private-key-file")?);
        let mut from = self.loaded_from.lock();
        if from.0 == c && from.1 == k {
            return Ok(false);
        }
        let ck = certified_key(&c, &k, &self.cert, &self.key)?;
        *self.current.write() = Arc::new(ck);
        *from = (c, k);
        Ok(true)
    }

    /// The leaf certificate now served.
    pub fn current_leaf(&self) -> Option<CertificateDer<'static>> {
        self.current.read().cert.first().cloned()
    }
}

/// Builds the server config and the reloader behind it.
pub fn server_config(files: &TlsFiles) -> Result<(Arc<rustls::ServerConfig>, Arc<CertReloader>), String> {
    let client_ca = files.client_ca.as_deref().map(ClientCa::load).transpose()?;
    let reloader = Arc::new(CertReloader { client_ca, ..CertReloader::load(&files.cert, &files.key)? });
    let builder = rustls::ServerConfig::builder_with_provider(server_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &reloader.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => builder.with_client_cert_verifier(ca.handshake_verifier()),
    };
    let mut cfg = builder.with_cert_resolver(reloader.clone());
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    // Pick the first of our suites that the client offers, not the client's favourite.
    cfg.ignore_client_order = true;
    Ok((Arc::new(cfg), reloader))
}

/// Sets the serving certificate's expiry metric from the leaf now served.
fn report_expiry(reloader: &CertReloader, metrics: &Metrics) {
    match reloader.current_leaf().and_then(|c| super::auth::x509::not_after(&c)) {
        Some(t) => metrics.serving_certificate_expiry(t),
        None => {
            tracing::warn!(cert = %reloader.cert.display(), "cannot read the serving certificate's notAfter")
        }
    }
}

/// Polls the files every `interval` until `shutdown`, swapping the certificate on change; keeps
/// `watchcache_serving_certificate_expiration_timestamp_seconds` current.
pub async fn watch_files(
    reloader: Arc<CertReloader>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
) {
    report_expiry(&reloader, &metrics);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        match reloader.reload_if_changed() {
            Ok(true) => {
                tracing::info!(cert = %reloader.cert.display(), "serving certificate reloaded");
                report_expiry(&reloader, &metrics);
            }
            Ok(false) => {}
            Err(e) => tracing::warn!("keeping the current serving certificate: {e}"),
        }
        if let Some(ca) = &reloader.client_ca {
            match ca.reload_if_changed() {
                Ok(true) => {
                    tracing::info!(file = %ca.path().display(), "client CA bundle reloaded; open connections verify their chains again at their next request")
                }
                Ok(false) => {}
                Err(e) => tracing::warn!("keeping the current client CA bundle: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::RootCertStore;

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/security").join(name)
    }

    #[test]
    fn reloads_only_on_change_and_keeps_the_old_pair_on_error() {
        let dir = std::env::temp_dir().join(format!("kwc-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::copy(testdata("server1.crt"), &cert).unwrap();
        std::fs::copy(testdata("server1.key"), &key).unwrap();
        let r = CertReloader::load(&cert, &key).unwrap();
        let first = r.current_leaf().unwrap();
        assert_eq!(r.reload_if_changed(), Ok(false));
        std::fs::copy(testdata("server2.crt"), &cert).unwrap();
        assert!(r.reload_if_changed().is_err(), "cert and key do not match yet");
        assert_eq!(r.current_leaf().unwrap(), first);
        std::fs::copy(testdata("server2.key"), &key).unwrap();
        assert_eq!(r.reload_if_changed(), Ok(true));
        assert_ne!(r.current_leaf().unwrap(), first);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Handshakes in memory with a rustls client that prefers AES-256-GCM (ring's default
    /// order) and returns the suite the server chose.
    fn negotiated(versions: &[&'static rustls::SupportedProtocolVersion]) -> rustls::CipherSuite {
        let files = TlsFiles {
            cert: testdata("server1.crt"),
            key: testdata("server1.key"),
            client_ca: None,
            reload_interval: Duration::from_secs(10),
        };
        let (server_cfg, _) = server_config(&files).unwrap();
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(testdata("server-ca.crt")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let client_provider = rustls::crypto::ring::default_provider();
        assert_eq!(
            client_provider.cipher_suites[0].suite(),
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
            "the client prefers AES-256-GCM"
        );
        let client_cfg = rustls::ClientConfig::builder_with_provider(Arc::new(client_provider))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(client_cfg), name).unwrap();
        let mut server = rustls::ServerConnection::new(server_cfg).unwrap();
        while client.is_handshaking() || server.is_handshaking() {
            let mut wire = Vec::new();
            client.write_tls(&mut wire).unwrap();
            server.read_tls(&mut wire.as_slice()).unwrap();
            server.process_new_packets().unwrap();
            let mut wire = Vec::new();
            server.write_tls(&mut wire).unwrap();
            client.read_tls(&mut wire.as_slice()).unwrap();
            client.process_new_packets().unwrap();
        }
        let suite = server.negotiated_cipher_suite().unwrap().suite();
        assert_eq!(client.negotiated_cipher_suite().unwrap().suite(), suite);
        suite
    }

    #[test]
    fn aes_128_gcm_is_first_and_chosen_over_the_clients_order() {
        let p = server_provider();
        let first: Vec<_> = p.cipher_suites.iter().take(3).map(|s| s.suite()).collect();
        use rustls::CipherSuite as C;
        assert_eq!(
            first,
            [
                C::TLS13_AES_128_GCM_SHA256,
                C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
                C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
            ]
        );
        // Nothing dropped: the other suites follow in ring's order.
        assert_eq!(p.cipher_suites.len(), rustls::crypto::ring::default_provider().cipher_suites.len());
        assert_eq!(negotiated(&[&rustls::version::TLS13]), C::TLS13_AES_128_GCM_SHA256);
        // server1 has an ECDSA key.
        assert_eq!(negotiated(&[&rustls::version::TLS12]), C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256);
    }

    #[test]
    fn client_ca_config_builds() {
        let files = TlsFiles {
            cert: testdata("server1.crt"),
            key: testdata("server1.key"),
            client_ca: Some(testdata("client-ca.crt")),
            reload_interval: Duration::from_secs(10),
        };
        let (cfg, _) = server_config(&files).unwrap();
        assert_eq!(cfg.alpn_protocols, [b"h2".to_vec(), b"http/1.1".to_vec()]);
        assert!(cfg.ignore_client_order);
        let bad = TlsFiles { client_ca: Some(testdata("README.md")), ..files };
        assert!(server_config(&bad).is_err());
    }
}
