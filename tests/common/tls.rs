//! TLS clients for the tests of the proxy's TLS listener (security, identities, node fleet,
//! metrics): the roots of the test server CA (`tests/testdata/security/server-ca.crt`, which
//! signed `server1` and `server2`), a rustls config builder that trusts them, and an HTTPS
//! client made from a config.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::client::WantsClientCert;
use rustls::{ClientConfig, ConfigBuilder, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

pub type TlsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The test server CA.
pub fn server_roots() -> RootCertStore {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/security/server-ca.crt");
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(path).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    roots
}

/// A config builder (ring, the safe default versions) trusting the test server CA; the caller
/// says which client certificate, if any.
pub fn config() -> ConfigBuilder<ClientConfig, WantsClientCert> {
    ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(server_roots())
}

/// An HTTPS-only client with `cfg`: HTTP/1.1, and HTTP/2 when `h2` (negotiated by ALPN).
pub fn https(cfg: ClientConfig, h2: bool) -> TlsClient {
    let b = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(cfg).https_only().enable_http1();
    let conn = if h2 { b.enable_http2().build() } else { b.build() };
    Client::builder(TokioExecutor::new()).build(conn)
}
