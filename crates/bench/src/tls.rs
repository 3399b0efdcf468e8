//! The bench clients' TLS: the trust anchors for `https://` targets (`--certificate-authority`,
//! the kubeconfig's CA, or the in-process run's throwaway CA), the kubeconfig's client
//! certificate, `tls-server-name` and `insecure-skip-tls-verify` (the proxy's own TLS layer,
//! `upstream::client_config`, so that both read a kubeconfig alike), and the connector that speaks plain HTTP or TLS by the URL's scheme,
//! offering ALPN `h2` alone with `--http2` and no ALPN (HTTP/1.1) otherwise.
//!
//! Built by `bench::measure`; `env::Clients` makes one connector per client from it.

use std::path::Path;
use std::sync::Arc;

use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

use kube_watchcache::upstream::{Identity, IdentitySlot, TlsSettings};

/// TCP, then TLS for `https://` URLs.
pub type Connector = HttpsConnector<HttpConnector>;

/// The TLS material every bench client shares; cheap to clone.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    /// Whether any trust anchor was given (an `https://` target needs one), or verification
    /// is off (`insecure-skip-tls-verify`).
    has_roots: bool,
    /// The kubeconfig's `tls-server-name`.
    server_name: Option<ServerName<'static>>,
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

impl ClientTls {
    /// Verifies servers against `roots` (ring provider, TLS 1.2 and 1.3); no client
    /// certificate (those come with a kubeconfig: [`ClientTls::from_kubeconfig`]).
    pub fn new(roots: Vec<CertificateDer<'static>>) -> Result<ClientTls, String> {
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
        let config = builder.with_no_client_auth();
        Ok(ClientTls { config: Arc::new(config), has_roots, server_name: None })
    }

    /// Verifies servers against `roots` and presents a client certificate (PEM chain and key):
    /// a node identity. The proxy's own TLS layer, as for a kubeconfig's certificate.
    pub fn with_identity(
        roots: Vec<CertificateDer<'static>>,
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<ClientTls, String> {
        let id = Identity::from_pem(cert_pem, key_pem).map_err(|e| format!("node certificate: {e}"))?;
        let slot = IdentitySlot::new(&id).map_err(|e| format!("node certificate: {e}"))?;
        Self::from_kubeconfig(
            TlsSettings { roots, identity: Some(slot), ..TlsSettings::default() },
            Vec::new(),
        )
    }

    /// From a kubeconfig resolved as `serve` resolves it (its CA plus `extra_roots`,
    /// `tls-server-name`, `insecure-skip-tls-verify`, a client certificate an exec plugin may
    /// renew during the run).
    pub fn from_kubeconfig(
        mut tls: TlsSettings,
        extra_roots: Vec<CertificateDer<'static>>,
    ) -> Result<ClientTls, String> {
        tls.roots.extend(extra_roots);
        let has_roots = !tls.roots.is_empty() || tls.insecure;
        let server_name = match &tls.server_name {
            Some(n) => {
                Some(ServerName::try_from(n.clone()).map_err(|_| format!("invalid tls-server-name {n:?}"))?)
            }
            None => None,
        };
        let config = kube_watchcache::upstream::client_config(&tls, true).map_err(|e| e.to_string())?;
        Ok(ClientTls { config: Arc::new(config), has_roots, server_name })
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
        let mut b = HttpsConnectorBuilder::new().with_tls_config((*self.config).clone()).https_or_http();
        if let Some(n) = &self.server_name {
            b = b.with_server_name_resolver(FixedServerNameResolver::new(n.clone()));
        }
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
        let none = ClientTls::new(Vec::new()).unwrap();
        assert!(none.check("http://127.0.0.1:1").is_ok());
        assert!(none.check("https://127.0.0.1:1").unwrap_err().contains("--certificate-authority"));
        assert!(certs(b"not a certificate", "x").unwrap_err().contains("no PEM certificate"));
        let ca = std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/testdata/security/server-ca.crt"),
        )
        .unwrap();
        let some = ClientTls::new(certs(&ca, "ca").unwrap()).unwrap();
        assert!(some.check("https://127.0.0.1:1").is_ok());
    }
}
