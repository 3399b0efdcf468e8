//! One accepted connection, served with the protocol it speaks: hyper's own HTTP/1.1 (with
//! upgrades, for `kubectl exec`) or HTTP/2 connection when the protocol is known (ALPN, or the
//! first bytes of a plain connection), `hyper_util`'s auto-detecting one only when it is not.
//! Each connection future is boxed on its own: an HTTP/1.1 watch does not carry the size of an
//! HTTP/2 connection state, as it did inside the auto-detecting future (measured: 18.0 → 11.4
//! KiB per idle HTTP/1.1 connection in a bare hyper server, 10 000 connections).
//!
//! Graceful shutdown is here too (`hyper_util`'s `GracefulShutdown` cannot watch hyper's
//! upgradeable HTTP/1.1 connection): when the stop flag turns true each connection is told to
//! finish (HTTP/1.1 after its response, HTTP/2 with GOAWAY), and [`Live`] lets the listener
//! wait for the last one.
//!
//! Used by `server::listener`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};

use super::body::{Body, BoxError};
use super::listener::{until_true, MAX_CONCURRENT_STREAMS, MAX_HEADER_BYTES};

/// What a connection speaks, as far as the listener knows before serving it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Http1,
    Http2,
    /// Not known (no ALPN, a plain connection whose first bytes did not arrive in time).
    Detect,
}

/// A served connection, to its end.
pub type ConnFuture = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

/// The per-protocol connection settings (the same limits whichever is used).
pub struct Builders {
    h1: http1::Builder,
    h2: http2::Builder<TokioExecutor>,
    auto: auto::Builder<TokioExecutor>,
}

impl Builders {
    /// HTTP/2 hardened: bounded concurrent streams, pending-accept and locally-errored resets
    /// (rapid reset, CVE-2023-44487) and header lists; HTTP/1 heads bounded, read within 30 s.
    pub fn new() -> Builders {
        let mut h1 = http1::Builder::new();
        h1.timer(TokioTimer::new())
            .max_buf_size(MAX_HEADER_BYTES)
            .header_read_timeout(Duration::from_secs(30));
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.max_concurrent_streams(MAX_CONCURRENT_STREAMS)
            .max_header_list_size(MAX_HEADER_BYTES as u32)
            .max_pending_accept_reset_streams(Some(50))
            .max_local_error_reset_streams(Some(256));
        let mut auto = auto::Builder::new(TokioExecutor::new());
        auto.http2()
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
            .max_header_list_size(MAX_HEADER_BYTES as u32)
            .max_pending_accept_reset_streams(Some(50))
            .max_local_error_reset_streams(Some(256));
        auto.http1()
            .timer(TokioTimer::new())
            .max_buf_size(MAX_HEADER_BYTES)
            .header_read_timeout(Duration::from_secs(30));
        Builders { h1, h2, auto }
    }

    /// Serves `io` as `proto` until the connection ends or, once `stop` is true, has finished
    /// gracefully.
    pub fn serve<I, S>(
        &self,
        io: I,
        proto: Proto,
        svc: S,
        stop: watch::Receiver<bool>,
        live: Live,
    ) -> ConnFuture
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        S: hyper::service::Service<http::Request<Incoming>, Response = http::Response<Body>>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
    {
        let io = TokioIo::new(io);
        match proto {
            Proto::Http1 => {
                let conn = self.h1.serve_connection(io, svc).with_upgrades();
                Box::pin(graceful(conn, stop, live, |c| c.graceful_shutdown()))
            }
            Proto::Http2 => {
                let conn = self.h2.serve_connection(io, svc);
                Box::pin(graceful(conn, stop, live, |c| c.graceful_shutdown()))
            }
            Proto::Detect => {
                let conn = self.auto.serve_connection_with_upgrades(io, svc).into_owned();
                Box::pin(graceful(conn, stop, live, |c| c.graceful_shutdown()))
            }
        }
    }
}

impl Default for Builders {
    fn default() -> Self {
        Builders::new()
    }
}

/// Held by every connection task; [`Live::wait`] returns when all are gone.
#[derive(Clone)]
pub struct Live {
    _held: mpsc::Sender<()>,
}

/// The listener's side of [`Live`].
pub struct AllGone(mpsc::Receiver<()>);

pub fn live() -> (Live, AllGone) {
    let (tx, rx) = mpsc::channel(1);
    (Live { _held: tx }, AllGone(rx))
}

impl AllGone {
    /// Waits until every [`Live`] handle is dropped (the caller dropped its own first).
    pub async fn wait(mut self) {
        let _ = self.0.recv().await;
    }
}

/// Runs `conn`; once `stop` turns true, tells it to finish (`shutdown`) and runs it to its end.
async fn graceful<C, E>(
    conn: C,
    mut stop: watch::Receiver<bool>,
    live: Live,
    shutdown: fn(Pin<&mut C>),
) -> Result<(), BoxError>
where
    C: Future<Output = Result<(), E>>,
    E: Into<BoxError>,
{
    let _live = live;
    let mut conn = std::pin::pin!(conn);
    if !*stop.borrow() {
        tokio::select! {
            r = conn.as_mut() => return r.map_err(Into::into),
            _ = until_true(&mut stop) => {}
        }
    }
    shutdown(conn.as_mut());
    conn.await.map_err(Into::into)
}
