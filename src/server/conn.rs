//! One accepted connection, served with the protocol it speaks: hyper's own HTTP/1.1 (with
//! upgrades, for `kubectl exec`) or HTTP/2 connection when the protocol is known (ALPN, or the
//! first bytes of a plain connection), `hyper_util`'s auto-detecting one only when it is not.
//! Each connection future is boxed on its own: an HTTP/1.1 watch does not carry the size of an
//! HTTP/2 connection state, as it did inside the auto-detecting future (measured: 18.0 → 11.4
//! KiB per idle HTTP/1.1 connection in a bare hyper server, 10 000 connections).
//!
//! Idle connections are closed (issue 21 item 6), as kube-apiserver's `http.Server` does
//! (ReadHeaderTimeout 32 s, IdleTimeout 90 s): a connection on which no request started within
//! `read_header_timeout` of its accept (a silent one, or one that never finishes a head), and
//! one with no request in flight for `idle_timeout` (HTTP/1.1 keep-alive, HTTP/2 with no open
//! stream), is told to finish like at shutdown (HTTP/2: GOAWAY). An open watch is a request in
//! flight: it never makes its connection idle. HTTP/2 connections are also pinged every
//! `h2_keepalive_interval` and closed when a ping is not answered within
//! `h2_keepalive_timeout`, so a peer that vanished does not hold its streams. [`Activity`]
//! counts a connection's requests (from the service, until each response body ends).
//!
//! A connection on which no request started is closed at `read_header_timeout` outright, not
//! told to finish: hyper would otherwise go on reading a head that is being trickled in until
//! its own head timeout (the longer idle one).
//!
//! HTTP/2 streams that the client resets after the server accepted them (the request was being
//! handled: a review sent upstream, a response being built) escape h2's own reset bound, which
//! counts only streams reset before they are accepted. They are counted here, against the
//! connection ([`Activity::handling`]): past [`RESET_BURST`] (refilled at [`RESET_QPS`] a
//! second) the connection is closed.
//!
//! `--goaway-chance` (kube-apiserver's flag): after a request on an HTTP/2 connection, with
//! that probability, the connection is sent GOAWAY (streams in flight, watches included,
//! finish normally) so that the client reconnects through the Service and lands on any replica:
//! after a rollout, long-lived HTTP/2 clients spread again over every replica.
//!
//! Graceful shutdown is here too (`hyper_util`'s `GracefulShutdown` cannot watch hyper's
//! upgradeable HTTP/1.1 connection): when the stop flag turns true each connection is told to
//! finish (HTTP/1.1 after its response, HTTP/2 with GOAWAY), and [`Live`] lets the listener
//! wait for the last one.
//!
//! A connection whose every open response has been waiting on the client for twice
//! `write_stall` — never taken from since it was ready, or not asked for more since it gave a
//! frame (an HTTP/2 stream the client opened with no window, a socket it stopped reading) —
//! is closed at once ([`Stalled`]): hyper keeps such a stream, and its connection busy, until
//! the connection ends, so one client could hold every connection slot with one stalled 401
//! each (found by a review). A quiet watch waiting for an event is not waiting on its client.
//!
//! Used by `server::listener` (which it does not use).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};

use super::auth::rate::Bucket;
use super::body::{Body, BoxError};
use crate::shutdown::until_true;

/// Concurrent HTTP/2 streams per connection (each watch is one).
pub const MAX_CONCURRENT_STREAMS: u32 = 1000;
/// HTTP/2 header list / HTTP/1 head size bound, in bytes.
pub const MAX_HEADER_BYTES: usize = 1 << 20;

/// HTTP/2 streams a connection may reset while they are handled, at once …
pub const RESET_BURST: u32 = 100;
/// … and per second after that; past it the connection is closed.
pub const RESET_QPS: f64 = 10.0;

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

/// Connection timeouts (`--read-header-timeout`, `--idle-timeout`,
/// `--http2-keepalive-interval`, `--http2-keepalive-timeout`).
#[derive(Clone, Copy, Debug)]
pub struct ConnOptions {
    pub read_header_timeout: Duration,
    pub idle_timeout: Duration,
    /// `None`: no pings.
    pub h2_keepalive_interval: Option<Duration>,
    pub h2_keepalive_timeout: Duration,
    /// Probability of a GOAWAY after an HTTP/2 request (0: never; at most 0.02).
    pub goaway_chance: f64,
    /// Connections open at once (0: unbounded); past it the listener accepts no more until one
    /// closes (`--max-connections`, resolved by `app`).
    pub max_connections: usize,
    /// A connection whose every open response has waited on the client twice this long is
    /// closed (`--write-stall-timeout`; zero: never).
    pub write_stall: Duration,
}

impl Default for ConnOptions {
    fn default() -> Self {
        ConnOptions {
            read_header_timeout: Duration::from_secs(32),
            idle_timeout: Duration::from_secs(90),
            h2_keepalive_interval: Some(Duration::from_secs(30)),
            h2_keepalive_timeout: Duration::from_secs(20),
            goaway_chance: 0.0,
            max_connections: 0,
            write_stall: Duration::from_secs(10),
        }
    }
}

/// The requests of one connection: how many are in flight, since when none is, and whether
/// one ever started.
#[derive(Debug)]
pub struct Activity {
    born: Instant,
    active: AtomicUsize,
    /// Milliseconds after `born` when the last request ended.
    idle_since_ms: AtomicU64,
    started: AtomicBool,
    /// Set (once) when the connection is to be sent GOAWAY.
    goaway: tokio::sync::Notify,
    goaway_sent: AtomicBool,
    /// Streams reset by the client while handled.
    resets: Bucket,
    /// Set (once) when the connection is to be closed at once.
    abort: tokio::sync::Notify,
    aborted: AtomicBool,
    /// Responses waiting on the client ([`Stalled`]).
    owed: AtomicUsize,
    /// Milliseconds after `born` when a response was last asked for a frame, or made.
    progress_ms: AtomicU64,
}

/// Held while an HTTP/2 request is handled (until its response is ready); dropped before
/// that, the client reset the stream, and it counts against the connection.
#[derive(Debug)]
pub struct Handling(Option<Arc<Activity>>);

impl Handling {
    /// The response is ready: the stream was not reset while handled.
    pub fn done(mut self) {
        self.0 = None;
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        if let Some(a) = self.0.take() {
            if !a.resets.take() && !a.aborted.swap(true, Ordering::AcqRel) {
                static CLOSED: crate::warn_gate::WarnGate = crate::warn_gate::WarnGate::new();
                const WHAT: &str =
                    "closing an HTTP/2 connection: too many streams reset by the client while handled";
                match CLOSED.pass() {
                    Some(held) => tracing::warn!(similar_since_last = held, "{WHAT}"),
                    None => tracing::debug!("{WHAT}"),
                }
                a.abort.notify_one();
            }
        }
    }
}

/// Held while a request is in flight (until its response body ends or is dropped).
#[derive(Debug)]
pub struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let a = &self.0;
        let ms = Instant::now().saturating_duration_since(a.born).as_millis() as u64;
        a.idle_since_ms.store(ms, Ordering::Relaxed);
        a.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Activity {
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            born: Instant::now(),
            active: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            started: AtomicBool::new(false),
            goaway: tokio::sync::Notify::new(),
            goaway_sent: AtomicBool::new(false),
            resets: Bucket::new(RESET_QPS, RESET_BURST),
            abort: tokio::sync::Notify::new(),
            aborted: AtomicBool::new(false),
            owed: AtomicUsize::new(0),
            progress_ms: AtomicU64::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        Instant::now().saturating_duration_since(self.born).as_millis() as u64
    }

    /// Whether every response open on the connection has waited on its client for `stall`
    /// (none asked for a frame since, each ready or having given one), counted from `since_ms`
    /// at the earliest; `told`: the connection was told to finish, and one with no response
    /// of the proxy's open counts too (what it still has to send is in HTTP/2's buffers).
    fn stalled(&self, stall: Duration, since_ms: u64, told: bool) -> bool {
        let active = self.active.load(Ordering::Acquire);
        let idle_for = self.now_ms().saturating_sub(self.progress_ms.load(Ordering::Relaxed).max(since_ms));
        (active > 0 || told)
            && self.owed.load(Ordering::Acquire) >= active
            && idle_for >= stall.as_millis() as u64
    }

    /// An HTTP/2 request is being handled (see [`Handling`]).
    pub fn handling(self: &Arc<Self>) -> Handling {
        Handling(Some(self.clone()))
    }

    /// After an HTTP/2 request: with probability `chance`, tells the connection to send GOAWAY.
    pub fn maybe_goaway(&self, chance: f64) {
        if chance > 0.0 && fastrand::f64() < chance && !self.goaway_sent.swap(true, Ordering::AcqRel) {
            self.goaway.notify_one();
        }
    }

    /// Since when no request has been in flight (its accept if none ever was); `None` while
    /// one is (`crowd`).
    pub fn idle_since(&self) -> Option<Instant> {
        (self.active.load(Ordering::Acquire) == 0)
            .then(|| self.born + Duration::from_millis(self.idle_since_ms.load(Ordering::Relaxed)))
    }

    /// Tells the connection to finish, as `--goaway-chance` does (`crowd`: it gives way to a
    /// waiting one); false if it was told already.
    pub fn ask_to_close(&self) -> bool {
        let first = !self.goaway_sent.swap(true, Ordering::AcqRel);
        if first {
            self.goaway.notify_one();
        }
        first
    }

    /// Resolves once the connection is told to finish ([`Activity::ask_to_close`]), without
    /// consuming the telling (the connection, if it goes on, sends its GOAWAY).
    pub async fn told_to_close(&self) {
        if self.goaway_sent.load(Ordering::Acquire) {
            return;
        }
        // Told since the load: the permit is taken here, and given back below.
        self.goaway.notified().await;
        // Given back for whoever serves the connection next.
        self.goaway.notify_one();
    }

    /// Whether it was told to finish.
    pub fn asked_to_close(&self) -> bool {
        self.goaway_sent.load(Ordering::Acquire)
    }

    /// A request started.
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.started.store(true, Ordering::Relaxed);
        self.active.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// When the connection must be closed if nothing changes; `None` when it must be now.
    fn deadline(&self, opts: &ConnOptions, now: Instant) -> Option<Instant> {
        if !self.started.load(Ordering::Relaxed) {
            let at = self.born + opts.read_header_timeout.min(opts.idle_timeout);
            return (at > now).then_some(at);
        }
        if self.active.load(Ordering::Acquire) > 0 {
            // Busy: look again later (a request may end at any time).
            return Some(now + opts.idle_timeout);
        }
        let idle_since = self.born + Duration::from_millis(self.idle_since_ms.load(Ordering::Relaxed));
        let at = idle_since + opts.idle_timeout;
        (at > now).then_some(at)
    }
}

/// The per-protocol connection settings (the same limits whichever is used).
pub struct Builders {
    h1: http1::Builder,
    h2: http2::Builder<TokioExecutor>,
    auto: auto::Builder<TokioExecutor>,
    opts: ConnOptions,
}

impl Builders {
    /// HTTP/2 hardened: bounded concurrent streams, pending-accept and locally-errored resets
    /// (rapid reset, CVE-2023-44487) and header lists, keep-alive pings; HTTP/1 heads bounded.
    /// hyper's HTTP/1 head timeout also runs while a keep-alive connection waits for its next
    /// request, so it is the idle timeout there (Go's server waits IdleTimeout for the next
    /// request too); the first head is bounded by `read_header_timeout` from the accept
    /// (`Activity`).
    pub fn new(opts: ConnOptions) -> Builders {
        let head_timeout = opts.idle_timeout.max(opts.read_header_timeout);
        let mut h1 = http1::Builder::new();
        h1.timer(TokioTimer::new()).max_buf_size(MAX_HEADER_BYTES).header_read_timeout(head_timeout);
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new())
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
            .max_header_list_size(MAX_HEADER_BYTES as u32)
            .max_pending_accept_reset_streams(Some(50))
            .max_local_error_reset_streams(Some(256))
            .keep_alive_interval(opts.h2_keepalive_interval)
            .keep_alive_timeout(opts.h2_keepalive_timeout);
        let mut auto = auto::Builder::new(TokioExecutor::new());
        auto.http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
            .max_header_list_size(MAX_HEADER_BYTES as u32)
            .max_pending_accept_reset_streams(Some(50))
            .max_local_error_reset_streams(Some(256))
            .keep_alive_interval(opts.h2_keepalive_interval)
            .keep_alive_timeout(opts.h2_keepalive_timeout);
        auto.http1()
            .timer(TokioTimer::new())
            .max_buf_size(MAX_HEADER_BYTES)
            .header_read_timeout(head_timeout);
        Builders { h1, h2, auto, opts }
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
        activity: Arc<Activity>,
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
        let idle = Idle { activity, opts: self.opts };
        match proto {
            Proto::Http1 => {
                let conn = self.h1.serve_connection(io, svc).with_upgrades();
                Box::pin(graceful(conn, stop, live, idle, |c| c.graceful_shutdown()))
            }
            Proto::Http2 => {
                let conn = self.h2.serve_connection(io, svc);
                Box::pin(graceful(conn, stop, live, idle, |c| c.graceful_shutdown()))
            }
            Proto::Detect => {
                let conn = self.auto.serve_connection_with_upgrades(io, svc).into_owned();
                Box::pin(graceful(conn, stop, live, idle, |c| c.graceful_shutdown()))
            }
        }
    }
}

impl Default for Builders {
    fn default() -> Self {
        Builders::new(ConnOptions::default())
    }
}

/// A response body on its way to the client, which [`Activity`] counts as owed while it waits
/// on the client: from when it is made until it is first asked for a frame, and from each frame
/// it gives until it is asked for the next. Holds the request's [`Busy`].
pub struct Stalled {
    inner: Body,
    owing: bool,
    busy: Busy,
}

impl Stalled {
    pub fn wrap(resp: http::Response<Body>, busy: Busy) -> http::Response<Body> {
        let a = &busy.0;
        a.owed.fetch_add(1, Ordering::AcqRel);
        a.progress_ms.store(a.now_ms(), Ordering::Relaxed);
        resp.map(|inner| http_body_util::BodyExt::boxed_unsync(Stalled { inner, owing: true, busy }))
    }

    fn owing(&mut self, now: bool) {
        if now != self.owing {
            self.owing = now;
            if now {
                self.busy.0.owed.fetch_add(1, Ordering::AcqRel);
            } else {
                self.busy.0.owed.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        self.owing(false);
    }
}

impl http_body::Body for Stalled {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, BoxError>>> {
        let a = &self.busy.0;
        a.progress_ms.store(a.now_ms(), Ordering::Relaxed);
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        // A frame given: owed until asked for the next; waiting on its source, or ended: not.
        let owing = matches!(polled, std::task::Poll::Ready(Some(Ok(_))));
        self.owing(owing);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// What `graceful` needs to close an idle connection.
struct Idle {
    activity: Arc<Activity>,
    opts: ConnOptions,
}

impl Idle {
    /// Resolves once every response open on the connection has waited on its client for twice
    /// `write_stall` (never with zero): after the responses' own cuts at `write_stall`
    /// (`limits::InFlight`), which free what they hold. `told`: the connection was told to
    /// finish (idle, GOAWAY, shutdown), and one that does not within that time with none of
    /// the proxy's answers progressing (what its client does not take may be in HTTP/2's
    /// buffers, which hyper waits on for ever) is closed too.
    async fn stalled(&self, told: bool) {
        let stall = self.opts.write_stall;
        if stall.is_zero() {
            return std::future::pending().await;
        }
        let since = if told { self.activity.now_ms() } else { 0 };
        loop {
            tokio::time::sleep(stall / 2).await;
            if self.activity.stalled(stall * 2, since, told) {
                return;
            }
        }
    }

    /// Resolves when the connection has been idle (or silent since its accept) for too long.
    async fn expired(&self) {
        loop {
            match self.activity.deadline(&self.opts, Instant::now()) {
                None => return,
                Some(at) => tokio::time::sleep_until(at).await,
            }
        }
    }
}

/// Held by every connection task; [`AllGone::wait`] returns when all are gone, and
/// [`AllGone::kill`] ends those still draining after the grace period.
#[derive(Clone)]
pub struct Live {
    _held: mpsc::Sender<()>,
    kill: watch::Receiver<bool>,
    untold: Arc<Untold>,
}

/// Connections not yet told to finish, so that the caches end their watches only once no
/// connection will read another request (a client whose watch ends then finds its connection
/// closing, as at a stopping kube-apiserver, not a stopped cache's 503).
#[derive(Default)]
struct Untold {
    count: AtomicUsize,
    changed: tokio::sync::Notify,
}

/// One connection counted in [`Untold`] until dropped.
struct UntoldGuard(Arc<Untold>);

impl Drop for UntoldGuard {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// The listener's side of [`Live`].
pub struct AllGone(mpsc::Receiver<()>, watch::Sender<bool>, Arc<Untold>);

pub fn live() -> (Live, AllGone) {
    let (tx, rx) = mpsc::channel(1);
    let (kill_tx, kill) = watch::channel(false);
    let untold = Arc::new(Untold::default());
    (Live { _held: tx, kill, untold: untold.clone() }, AllGone(rx, kill_tx, untold))
}

impl AllGone {
    /// Waits until every connection has been told to finish (after the stop flag turned true:
    /// a connection that starts later is told before it reads anything).
    pub async fn all_told(&self) {
        loop {
            let changed = self.2.changed.notified();
            if self.2.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            changed.await;
        }
    }

    /// Waits until every [`Live`] handle is dropped (the caller dropped its own first).
    pub async fn wait(&mut self) {
        let _ = self.0.recv().await;
    }

    /// Drops every connection still open (the grace period is over): a request still in
    /// flight there (a watch, say) ends with its connection, rather than outliving the server.
    pub fn kill(&self) {
        self.1.send_replace(true);
    }
}

/// Runs `conn`; once `stop` turns true, or the connection has been idle too long, tells it to
/// finish (`shutdown`) and runs it to its end.
/// Why a connection whose every response waited on its client was closed.
const STALLED: &str = "closed: every open response waited on the client for twice --write-stall-timeout";

async fn graceful<C, E>(
    conn: C,
    mut stop: watch::Receiver<bool>,
    live: Live,
    idle: Idle,
    shutdown: fn(Pin<&mut C>),
) -> Result<(), BoxError>
where
    C: Future<Output = Result<(), E>>,
    E: Into<BoxError>,
{
    let mut kill = live.kill.clone();
    live.untold.count.fetch_add(1, Ordering::SeqCst);
    let untold = UntoldGuard(live.untold.clone());
    let _live = live;
    let mut conn = std::pin::pin!(conn);
    if !*stop.borrow() {
        tokio::select! {
            r = conn.as_mut() => return r.map_err(Into::into),
            _ = until_true(&mut stop) => {}
            _ = idle.expired() => {
                if !idle.activity.started.load(Ordering::Relaxed) {
                    // No request yet (a head still arriving, or none): nothing to finish.
                    tracing::debug!("closing a connection whose first request head did not arrive in time");
                    return Ok(());
                }
                tracing::debug!("closing an idle connection");
            }
            _ = idle.activity.goaway.notified() => tracing::debug!("GOAWAY (--goaway-chance)"),
            _ = idle.activity.abort.notified() => return Err("too many streams reset while handled".into()),
            _ = idle.stalled(false) => return Err(STALLED.into()),
        }
    }
    shutdown(conn.as_mut());
    drop(untold);
    tokio::select! {
        r = conn.as_mut() => r.map_err(Into::into),
        _ = until_true(&mut kill) => Ok(()),
        // Told to finish, it would wait for ever for streams its client never takes.
        _ = idle.stalled(true) => Err(STALLED.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_when_no_request_is_in_flight() {
        let opts = ConnOptions {
            read_header_timeout: Duration::from_secs(32),
            idle_timeout: Duration::from_secs(90),
            ..ConnOptions::default()
        };
        let a = Activity::new();
        let t0 = Instant::now();
        // Silent since accept: closed 32 s after it.
        assert_eq!(a.deadline(&opts, t0), Some(t0 + Duration::from_secs(32)));
        assert_eq!(a.deadline(&opts, t0 + Duration::from_secs(32)), None);
        // A request (a watch) in flight: never idle, however long.
        let busy = a.begin();
        tokio::time::advance(Duration::from_secs(1000)).await;
        assert!(a.deadline(&opts, Instant::now()).is_some());
        // It ends: idle for 90 s from then.
        drop(busy);
        let ended = Instant::now();
        tokio::time::advance(Duration::from_secs(89)).await;
        assert_eq!(a.deadline(&opts, Instant::now()), Some(ended + Duration::from_secs(90)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(a.deadline(&opts, Instant::now()), None);
    }
}
