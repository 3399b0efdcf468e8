//! rustls client configurations and the hyper-rustls connectors built on them.
//!
//! Called by `client.rs` three times: the own-requests connector (client certificate, h2 +
//! http/1.1), the forward connector (no client certificate, h2 + http/1.1) and the upgrade
//! connector (no client certificate, http/1.1 only). Provider: ring.

use std::sync::Arc;
use std::time::Duration;

use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::config::{one_line, ConfigError, TlsSettings};

/// The connector every client uses: TCP, then TLS for `https://` URLs.
pub(crate) type Connector = HttpsConnector<HttpConnector>;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

/// Which credentials and protocols a connector offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// The proxy's own requests: client certificate (if any), h2 or http/1.1.
    Own,
    /// Pass-through: no client certificate, h2 or http/1.1.
    Forward,
    /// Pass-through of upgrades: no client certificate, http/1.1 only.
    Upgrade,
    /// Upgrades sent on a caller's behalf with the proxy's identity (impersonation): client
    /// certificate (if any), http/1.1 only.
    OwnUpgrade,
}

/// Builds the connector for one client.
pub(crate) fn connector(tls: &TlsSettings, flavor: Flavor) -> Result<Connector, ConfigError> {
    let config = client_config(tls, matches!(flavor, Flavor::Own | Flavor::OwnUpgrade))?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.set_keepalive(Some(TCP_KEEPALIVE));

    let mut builder = HttpsConnectorBuilder::new().with_tls_config(config).https_or_http();
    if let Some(name) = &tls.server_name {
        let name = ServerName::try_from(name.clone())
            .map_err(|_| ConfigError::Tls(format!("invalid tls-server-name \"{}\"", one_line(name))))?;
        builder = builder.with_server_name_resolver(FixedServerNameResolver::new(name));
    }
    let builder = builder.enable_http1();
    Ok(match flavor {
        Flavor::Own | Flavor::Forward => builder.enable_http2().wrap_connector(http),
        Flavor::Upgrade | Flavor::OwnUpgrade => builder.wrap_connector(http),
    })
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub fn client_config(tls: &TlsSettings, with_identity: bool) -> Result<ClientConfig, ConfigError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::Tls(e.to_string()))?;
    let builder = if tls.insecure {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(NoVerification(provider.clone())))
    } else {
        let mut roots = RootCertStore::empty();
        let (added, ignored) = roots.add_parsable_certificates(tls.roots.iter().cloned());
        if added == 0 && ignored > 0 {
            return Err(ConfigError::Tls("no usable certificate in the certificate authority".into()));
        }
        builder.with_root_certificates(roots)
    };
    match (&tls.identity, with_identity) {
        (Some(slot), true) => Ok(builder.with_client_cert_resolver(slot.clone())),
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// `insecure-skip-tls-verify`: any certificate is accepted, but handshake signatures are still
/// checked (so the peer holds the key of the certificate it sent).
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::config::Identity;
    use crate::upstream::identity::IdentitySlot;
    use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::PrivateKeyDer;
    use std::path::PathBuf;

    fn testdata(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/security").join(name)
    }

    fn certs(name: &str) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_file_iter(testdata(name)).unwrap().map(|c| c.unwrap()).collect()
    }

    /// A server that asks for a client certificate and takes any (test only).
    #[derive(Debug)]
    struct AnyClient;

    impl ClientCertVerifier for AnyClient {
        fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
            &[]
        }
        fn verify_client_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: UnixTime,
        ) -> Result<ClientCertVerified, rustls::Error> {
            Ok(ClientCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            provider().signature_verification_algorithms.supported_schemes()
        }
    }

    /// Issue 21 item 7: the proxy's own X.509 v1 client certificate (what `openssl x509 -req`
    /// makes) is presented to the upstream, which decides; before, building the client failed
    /// with `UnsupportedCertVersion`.
    #[tokio::test]
    async fn a_version_one_own_certificate_is_presented_to_the_upstream() {
        let chain = certs("v1/client-v1.crt");
        let key = PrivateKeyDer::from_pem_file(testdata("v1/client-v1.key")).unwrap();
        let tls = TlsSettings {
            roots: certs("server-ca.crt"),
            identity: Some(IdentitySlot::new(&Identity { chain: chain.clone(), key }).unwrap()),
            ..TlsSettings::default()
        };
        let client = Arc::new(client_config(&tls, true).expect("a v1 certificate is accepted as our own"));
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(Arc::new(AnyClient))
            .with_single_cert(
                certs("server1.crt"),
                PrivateKeyDer::from_pem_file(testdata("server1.key")).unwrap(),
            )
            .unwrap();
        let (a, b) = tokio::io::duplex(64 * 1024);
        let accept = tokio::spawn(async move {
            let tls = tokio_rustls::TlsAcceptor::from(Arc::new(server)).accept(b).await.unwrap();
            tls.get_ref().1.peer_certificates().map(|c| c.to_vec())
        });
        let name = ServerName::try_from("localhost").unwrap();
        let _conn = tokio_rustls::TlsConnector::from(client).connect(name, a).await.expect("handshake");
        assert_eq!(accept.await.unwrap(), Some(chain), "the upstream got our v1 certificate");
    }
}
