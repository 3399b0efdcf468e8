//! HTTPS for the simulated apiserver: a serving certificate and key from PEM files, ALPN `h2`
//! and `http/1.1`, no client certificates. Like kube-apiserver (Go's crypto/tls on a CPU with
//! AES instructions), the server picks AES-128-GCM whenever the client offers it (the proxy's
//! own `server::tls::server_provider`), so a bench's "direct" column pays the same cipher as
//! one against a real apiserver.
//!
//! Built by `Sim::start` when [`SimOptions::tls`](super::SimOptions) is set (`sim
//! --tls-cert-file/--tls-private-key-file`, `bench --tls`); `http::serve` wraps each accepted
//! connection with the acceptor.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// Where the sim's serving certificate (PEM, leaf first) and key (PEM) are.
#[derive(Clone, Debug)]
pub struct SimTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

fn invalid(path: &Path, e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{}: {e}", path.display()))
}

/// The acceptor for `tls`; unreadable or mismatched files are an `InvalidInput` error.
pub fn acceptor(tls: &SimTls) -> std::io::Result<TlsAcceptor> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&tls.cert_file)
        .map_err(|e| invalid(&tls.cert_file, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(&tls.cert_file, e))?;
    if chain.is_empty() {
        return Err(invalid(&tls.cert_file, "no certificate found"));
    }
    let key = PrivateKeyDer::from_pem_file(&tls.key_file).map_err(|e| invalid(&tls.key_file, e))?;
    let mut cfg =
        rustls::ServerConfig::builder_with_provider(kube_watchcache::server::tls::server_provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(&tls.cert_file, e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| invalid(&tls.key_file, e))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    cfg.ignore_client_order = true;
    Ok(TlsAcceptor::from(Arc::new(cfg)))
}
