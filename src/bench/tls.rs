//! The bench clients' TLS: the trust anchors for `https://` targets (`--certificate-authority`,
//! the kubeconfig's CA, or the in-process run's throwaway CA), an optional client certificate
//! (from the kubeconfig), and the connector that speaks plain HTTP or TLS by the URL's scheme,
//! offering ALPN `h2` alone with `--http2` and no ALPN (HTTP/1.1) otherwise.
//!
//! Built by `bench::measure`; `env::Clients` makes one connector per client from it.

use std::path::Path;
use std::sync::Arc;

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// TCP, then TLS for `https://` URLs.
pub type Connector = HttpsConnector<HttpConnector>;

/// The TLS material every bench client shares; cheap to clone.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    /// Whether any trust anchor was given (an `https://` target needs one).
    has_roots: bool,
}

/// PEM certificates from `pem`; `what` names the source in errors.
pub fn certs(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> =
        CertificateDer::pem_slice_iter(pem).collect::<Result<_, _>>().map_err(|e| format!("{what}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what}: no PEM certificate found"));
    }
    Ok(certs)
}

/// A PEM bundle from a file.
pub fn certs_file(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    certs(&pem, &format!("{flag} {}", path.display()))
}

/// A client certificate chain and its key, both PEM.
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Identity {
    pub fn from_pem(cert: &[u8], key: &[u8]) -> Result<Identity, String> {
        let chain = certs(cert, "client certificate")?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("client key: {e}"))?;
        Ok(Identity { chain, key })
    }
}

impl ClientTls {
    /// Verifies servers against `roots` (ring provider, TLS 1.2 and 1.3) and presents
    /// `identity` when a server asks for a client certificate.
    pub fn new(roots: Vec<CertificateDer<'static>>, identity: Option<Identity>) -> Result<ClientTls, String> {
        let mut store = RootCertStore::empty();
        let (_, ignored) = store.add_parsable_certificates(roots);
        if ignored > 0 {
            return Err(format!("{ignored} certificate(s) of the certificate authority could not be used"));
        }
        let has_roots = !store.is_empty();
        let builder = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(store);
        let config = match identity {
            Some(id) => builder
                .with_client_auth_cert(id.chain, id.key)
                .map_err(|e| format!("client certificate: {e}"))?,
            None => builder.with_no_client_auth(),
        };
        Ok(ClientTls { config: Arc::new(config), has_roots })
    }

    /// Refuses an `https://` URL when no trust anchor was given (it could not be verified).
    pub fn check(&self, url: &str) -> Result<(), String> {
        if url.starts_with("https://") && !self.has_roots {
            return Err(format!(
                "{url}: an https target needs --certificate-authority (or a kubeconfig with a CA)"
            ));
        }
        Ok(())
    }

    /// A connector for one client: `http://` in the clear, `https://` over TLS with ALPN `h2`
    /// (`http2`) or without ALPN (HTTP/1.1).
    pub fn connector(&self, http2: bool) -> Connector {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        let b = HttpsConnectorBuilder::new().with_tls_config((*self.config).clone()).https_or_http();
        if http2 {
            b.enable_http2().wrap_connector(http)
        } else {
            b.enable_http1().wrap_connector(http)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_needs_a_trust_anchor_and_bad_pem_is_refused() {
        let none = ClientTls::new(Vec::new(), None).unwrap();
        assert!(none.check("http://127.0.0.1:1").is_ok());
        assert!(none.check("https://127.0.0.1:1").unwrap_err().contains("--certificate-authority"));
        assert!(certs(b"not a certificate", "x").unwrap_err().contains("no PEM certificate"));
        let ca = std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/security/server-ca.crt"),
        )
        .unwrap();
        let some = ClientTls::new(certs(&ca, "ca").unwrap(), None).unwrap();
        assert!(some.check("https://127.0.0.1:1").is_ok());
    }
}
