//! The listening socket: accepts TCP connections, terminates TLS (rustls, ALPN `h2` and
//! `http/1.1`; config from `server::tls`) when configured, and serves HTTP/1.1 (with upgrades,
//! for `kubectl exec`) and HTTP/2 on each connection; drains connections gracefully on shutdown.
//! The user of a verified client certificate is attached to every request of its connection
//! ([`PeerUser`]). HTTP/2 is hardened: bounded concurrent streams per connection, bounded
//! pending-accept and locally-errored resets (rapid reset, CVE-2023-44487), bounded header
//! lists; HTTP/1 heads are bounded too. TLS connections write through `tlsio` (full records).
//!
//! Called by `app` with a bound listener and the shared `Server`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::auth::{x509, PeerUser};
use super::batch;
use super::coalesce::{Coalesce, FlushAfterPoll};
use super::Server;

/// Concurrent HTTP/2 streams per connection (each watch is one).
pub const MAX_CONCURRENT_STREAMS: u32 = 1000;
/// HTTP/2 header list / HTTP/1 head size bound, in bytes.
pub const MAX_HEADER_BYTES: usize = 1 << 20;

/// Accepts connections until `shutdown` turns true, then waits up to `grace` for open
/// connections to finish (watches are ended by the caches closing their watchers).
pub async fn run(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    server: Arc<Server>,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let graceful = GracefulShutdown::new();
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .max_pending_accept_reset_streams(Some(50))
        .max_local_error_reset_streams(Some(256));
    builder
        .http1()
        .timer(TokioTimer::new())
        .max_buf_size(MAX_HEADER_BYTES)
        .header_read_timeout(Duration::from_secs(30));
    let builder = Arc::new(builder);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = until_true(&mut shutdown) => break,
        };
        let _ = stream.set_nodelay(true);
        let server = server.clone();
        let builder = builder.clone();
        match &acceptor {
            None => {
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let h2 = starts_with_h2_preface(&stream).await;
                    let svc = service(server, None);
                    if h2 {
                        let (io, flusher) = batch::batched(stream);
                        let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc).into_owned();
                        drive(watcher.watch(conn), true, Some(Box::new(flusher)), peer).await;
                    } else {
                        let conn =
                            builder.serve_connection_with_upgrades(TokioIo::new(stream), svc).into_owned();
                        drive(watcher.watch(conn), false, None, peer).await;
                    }
                });
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let tls =
                        match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
                            Ok(Ok(tls)) => tls,
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => return,
                        };
                    let peer_user = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|leaf| x509::user(leaf))
                        .map(|u| PeerUser(Arc::new(u)));
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                    let svc = service(server, peer_user);
                    // Full TLS records: short tails wait for the end of each poll (`tlsio`), which also
                    // batches an HTTP/2 connection's frames into few writes (as `batch` does in the
                    // clear).
                    let (io, cork) = super::tlsio::wrap(tls);
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc).into_owned();
                    drive(super::tlsio::corked(watcher.watch(conn), cork), h2, None, peer).await;
                });
            }
        }
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!("grace period over; closing remaining connections");
    }
}

/// Runs one connection to its end. HTTP/2 ones defer their wake-ups behind the runnable tasks
/// (`coalesce`), so one connection poll serves all the streams that sent; with a `batch`
/// flusher, what that poll wrote leaves in one write.
async fn drive<F, E>(conn: F, h2: bool, flusher: Option<Box<dyn FlushAfterPoll>>, peer: std::net::SocketAddr)
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let res = match (h2, flusher) {
        (true, Some(flusher)) => Coalesce::new(conn).flushing(flusher).await,
        (true, None) => Coalesce::new(conn).await,
        (false, _) => conn.await,
    };
    if let Err(e) = res {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// Whether a plain connection opens with the HTTP/2 preface (prior knowledge); looks at what
/// has arrived without consuming it, and says no when in doubt (a partial or late preface: the
/// connection is then served without write coalescing, nothing else changes).
async fn starts_with_h2_preface(stream: &tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 3];
    match tokio::time::timeout(Duration::from_secs(10), stream.peek(&mut buf)).await {
        Ok(Ok(3)) => &buf == b"PRI",
        _ => false,
    }
}

/// The per-connection service: every request gets the connection's certificate user.
fn service(
    server: Arc<Server>,
    peer_user: Option<PeerUser>,
) -> impl hyper::service::Service<
    http::Request<hyper::body::Incoming>,
    Response = http::Response<super::Body>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<http::Response<super::Body>, Infallible>> + Send + 'static,
> + Clone
       + Send
       + 'static {
    service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
        let server = server.clone();
        if let Some(p) = &peer_user {
            req.extensions_mut().insert(p.clone());
        }
        // Boxed: hyper keeps the service future's slot for the whole connection (HTTP/1) or
        // stream (HTTP/2); unboxed, its ~5 KiB would stay allocated for every open watch.
        Box::pin(async move { Ok::<_, Infallible>(server.handle(req).await) })
    })
}

/// Resolves once the flag is true (or its sender is gone).
pub(crate) async fn until_true(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await.map(|_| ());
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn first_bytes(sent: &'static [u8]) -> bool {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut c = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        c.write_all(sent).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let h2 = starts_with_h2_preface(&s).await;
        // Nothing was consumed: the connection still starts with what the client sent.
        let mut buf = vec![0; sent.len()];
        let mut got = 0;
        while got < buf.len() {
            s.readable().await.unwrap();
            got += s.try_read(&mut buf[got..]).unwrap_or(0);
        }
        assert_eq!(buf, sent);
        h2
    }

    #[tokio::test]
    async fn the_h2_preface_is_recognised_without_consuming_it() {
        assert!(first_bytes(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await);
        assert!(!first_bytes(b"GET /api HTTP/1.1\r\nHost: x\r\n\r\n").await);
    }
}
