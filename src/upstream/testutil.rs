//! Test helpers for `upstream`: temp dirs, scripted bodies, and tiny hyper servers on
//! `127.0.0.1:0` (plain or TLS) standing in for the apiserver and for the proxy's listener.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

use super::{BoxBody, BoxError};

pub const CA_PEM: &str = include_str!("testdata/ca.pem");
pub const SERVER_PEM: &str = include_str!("testdata/server.pem");
pub const SERVER_KEY: &str = include_str!("testdata/server.key");
pub const CLIENT_PEM: &str = include_str!("testdata/client.pem");
pub const CLIENT_KEY: &str = include_str!("testdata/client.key");

/// A directory under `std::env::temp_dir()`, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "kube-watchcache-upstream-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            fastrand::u64(..)
        );
        let p = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, contents).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A body that yields exactly these chunks as separate data frames.
pub fn chunked_body(chunks: &[&str]) -> BoxBody {
    let frames: Vec<Result<Frame<Bytes>, BoxError>> =
        chunks.iter().map(|c| Ok(Frame::data(Bytes::copy_from_slice(c.as_bytes())))).collect();
    StreamBody::new(stream::iter(frames)).boxed_unsync()
}

/// A body that yields `data` and then fails like a reset connection.
pub fn failing_body(data: &str) -> BoxBody {
    let frames: Vec<Result<Frame<Bytes>, BoxError>> = vec![
        Ok(Frame::data(Bytes::copy_from_slice(data.as_bytes()))),
        Err("connection reset by peer".into()),
    ];
    StreamBody::new(stream::iter(frames)).boxed_unsync()
}

pub fn full(body: impl Into<Bytes>) -> BoxBody {
    Full::new(body.into()).map_err(|never| match never {}).boxed_unsync()
}

/// What the TLS layer saw on a connection.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConnInfo {
    pub client_cert: bool,
    pub h2: bool,
}

type Handler = Arc<
    dyn Fn(ConnInfo, Request<Incoming>) -> Pin<Box<dyn Future<Output = Response<BoxBody>> + Send>>
        + Send
        + Sync,
>;

/// Wraps an async closure as a [`Handler`].
pub fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(ConnInfo, Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<BoxBody>> + Send + 'static,
{
    Arc::new(move |c, r| Box::pin(f(c, r)))
}

/// Serves `h` over plain HTTP (HTTP/1.1 with upgrades, or h2c) on 127.0.0.1:0.
pub async fn serve(h: Handler) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let h = h.clone();
            tokio::spawn(serve_conn(TokioIo::new(tcp), ConnInfo::default(), h, None));
        }
    });
    addr
}

/// Serves `h` over TLS with the test server certificate; client certificates signed by the test
/// CA are asked for but optional, and reported in [`ConnInfo`].
pub async fn serve_tls(h: Handler) -> SocketAddr {
    serve_tls_with(h, None).await
}

/// [`serve_tls`] allowing at most `max_streams` HTTP/2 streams per connection (kube-apiserver's
/// `--http2-max-streams-per-connection`; hyper's own default otherwise).
pub async fn serve_tls_with(h: Handler, max_streams: Option<u32>) -> SocketAddr {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(CA_PEM.as_bytes()).unwrap()).unwrap();
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .allow_unauthenticated()
            .build()
            .unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            CertificateDer::pem_slice_iter(SERVER_PEM.as_bytes()).collect::<Result<Vec<_>, _>>().unwrap(),
            PrivateKeyDer::from_pem_slice(SERVER_KEY.as_bytes()).unwrap(),
        )
        .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (h, acceptor) = (h.clone(), acceptor.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let (_, conn) = tls.get_ref();
                let info = ConnInfo {
                    client_cert: conn.peer_certificates().is_some_and(|c| !c.is_empty()),
                    h2: conn.alpn_protocol() == Some(b"h2"),
                };
                serve_conn(TokioIo::new(tls), info, h, max_streams).await;
            });
        }
    });
    addr
}

async fn serve_conn<I>(io: TokioIo<I>, info: ConnInfo, h: Handler, max_streams: Option<u32>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let h = h.clone();
        async move { Ok::<_, Infallible>(h(info, req).await) }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    if let Some(n) = max_streams {
        builder.http2().max_concurrent_streams(n);
    }
    let _ = builder.serve_connection_with_upgrades(io, svc).await;
}

/// An upstream (plain HTTP on 127.0.0.1:0) answering every request with `body` as JSON and
/// `headers`, and a client of it.
pub async fn answering(
    body: &'static str,
    headers: &'static [(&'static str, &'static str)],
) -> super::Upstream {
    let addr = serve(handler(move |_, _| async move {
        let mut b = Response::builder().header("content-type", "application/json");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(full(body)).unwrap()
    }))
    .await;
    client_of(addr)
}

/// A client of a plain-HTTP upstream at `addr` (a test server), with the default options.
pub fn client_of(addr: SocketAddr) -> super::Upstream {
    super::Upstream::new(&super::UpstreamOptions {
        upstream: Some(format!("http://{addr}")),
        ..Default::default()
    })
    .unwrap()
}
