//! Upstream connections in lanes: a request goes on the first lane (one pooled client, one
//! HTTP/2 connection) with fewer than `per_lane` requests open on it, and a new lane is made
//! when every lane is full. Each request holds its lane's slot until its response body ends or
//! is dropped ([`Leased`]).
//!
//! Why: hyper's pooled client multiplexes every request to a host on **one** HTTP/2 connection,
//! and kube-apiserver allows 100 streams on a connection (`--http2-max-streams-per-connection`,
//! 0 by default: 100). Past that, a new request waits in the connection's queue until a stream
//! ends — and watches end after minutes. 100 forwarded watches (any callers') made every other
//! forwarded request wait; 100 cached resources' own watches made every TokenReview and
//! SubjectAccessReview wait (the proxy ready, every authenticated request hanging). With
//! lanes no request waits for another's stream. Each connection's flow-control window is
//! `per_lane` times a stream's (see `client::builder`), so a response nobody reads (its caller
//! stopped reading) holds its own stream's window, never the connection's.
//!
//! Made by `client::Inner::build` for the own and forwarding clients; upgrades (HTTP/1.1, a
//! connection each) do not need it.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use parking_lot::Mutex;

use super::tls::Connector;

/// Requests on one upstream connection when nothing else is said: half of what kube-apiserver
/// allows by default (100), so that a lane never reaches the upstream's own limit.
pub const DEFAULT_STREAMS_PER_CONNECTION: usize = 50;

/// The most `--upstream-max-streams-per-connection` takes: a connection's flow-control window
/// (this many streams' windows) must stay below HTTP/2's 2 GiB.
pub const MAX_STREAMS_PER_CONNECTION: usize = 1000;

/// The clients of one kind of request (own, forwarded), in lanes of `per_lane` requests.
pub(crate) struct Lanes<B> {
    make: Box<dyn Fn() -> Client<Connector, B> + Send + Sync>,
    /// Told the number of lanes whenever one is made (metrics).
    made: Box<dyn Fn(usize) + Send + Sync>,
    lanes: Mutex<Vec<Arc<Lane<B>>>>,
    per_lane: usize,
    /// The client certificate the lanes' connections present, and the generation of it they
    /// were made with: a renewed one leaves the lanes behind (their open requests finish on
    /// their connections, which close with them) for new ones that present it.
    identity: Option<(Arc<super::identity::IdentitySlot>, AtomicU64)>,
}

struct Lane<B> {
    client: Client<Connector, B>,
    /// Requests sent on this lane whose response body has not ended yet.
    open: Arc<AtomicUsize>,
}

impl<B> Lanes<B>
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    pub fn new(per_lane: usize, make: impl Fn() -> Client<Connector, B> + Send + Sync + 'static) -> Lanes<B> {
        Lanes {
            make: Box::new(make),
            made: Box::new(|_| {}),
            lanes: Mutex::new(Vec::new()),
            per_lane: per_lane.max(1),
            identity: None,
        }
    }

    /// Lanes whose connections present `slot`'s certificate: new ones after each renewal.
    pub fn presenting(mut self, slot: Option<Arc<super::identity::IdentitySlot>>) -> Lanes<B> {
        self.identity = slot.map(|s| {
            let seen = AtomicU64::new(s.generation());
            (s, seen)
        });
        self
    }

    /// Reports the number of lanes to `made` whenever one is made.
    pub fn reporting(mut self, made: impl Fn(usize) + Send + Sync + 'static) -> Lanes<B> {
        self.made = Box::new(made);
        self
    }

    /// Sends `req` on a lane with room, holding a slot of it until the response body ends.
    pub async fn request(
        &self,
        req: Request<B>,
    ) -> Result<Response<Leased<Incoming>>, hyper_util::client::legacy::Error> {
        let (client, lease) = self.lease();
        let resp = client.request(req).await?;
        Ok(resp.map(|inner| Leased { inner, lease: Some(lease) }))
    }

    /// Requests open on every lane together.
    #[cfg(test)]
    pub fn open(&self) -> usize {
        self.lanes.lock().iter().map(|l| l.open.load(Ordering::Relaxed)).sum()
    }

    /// Lanes made so far.
    pub fn lanes(&self) -> usize {
        self.lanes.lock().len()
    }

    /// A lane with room (a new one if none has) and a slot of it. The client is cloned out (a
    /// handle on the lane's pool) so that no lock is held while the request is sent.
    fn lease(&self) -> (Client<Connector, B>, Lease) {
        let mut lanes = self.lanes.lock();
        if let Some((slot, seen)) = &self.identity {
            let now = slot.generation();
            // Under the lanes' lock: one request leaves the old lanes behind.
            if seen.swap(now, Ordering::Relaxed) != now {
                lanes.clear();
            }
        }
        let free = lanes.iter().find(|l| l.open.load(Ordering::Relaxed) < self.per_lane).cloned();
        let lane = free.unwrap_or_else(|| {
            let lane = Arc::new(Lane { client: (self.make)(), open: Arc::new(AtomicUsize::new(0)) });
            lanes.push(lane.clone());
            (self.made)(lanes.len());
            lane
        });
        // Taken under the lanes' lock: two requests never both take a lane's last slot.
        lane.open.fetch_add(1, Ordering::Relaxed);
        (lane.client.clone(), Lease(lane.open.clone()))
    }
}

/// A slot of a lane (its count of open requests), given back when dropped.
struct Lease(Arc<AtomicUsize>);

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body holding its lane's slot until it ends (or is dropped: the stream is reset).
pub struct Leased<T> {
    inner: T,
    lease: Option<Lease>,
}

impl<T: Body<Data = Bytes> + Unpin> Body for Leased<T> {
    type Data = Bytes;
    type Error = T::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, T::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = polled {
            // The stream is over: its slot is free for the next request.
            self.lease = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {

    /// A renewed client certificate leaves the own lanes behind: the next request is sent on a
    /// new lane (new connections, whose handshakes present it), not on a busy connection that
    /// presented the old one until it expired (a review).
    #[test]
    fn a_renewed_identity_leaves_the_lanes_behind() {
        use super::Lanes;
        use crate::upstream::identity::{Identity, IdentitySlot};
        use crate::upstream::testutil::{CLIENT_KEY, CLIENT_PEM, SERVER_KEY, SERVER_PEM};
        use hyper_util::client::legacy::Client;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let first = Identity::from_pem(CLIENT_PEM.as_bytes(), CLIENT_KEY.as_bytes()).unwrap();
        let slot = IdentitySlot::new(&first).unwrap();
        let made = Arc::new(AtomicUsize::new(0));
        let counted = made.clone();
        let conn = crate::upstream::tls::connector(
            &crate::upstream::config::TlsSettings::default(),
            crate::upstream::tls::Flavor::Own,
        )
        .unwrap();
        let lanes: Lanes<http_body_util::Full<Bytes>> = Lanes::new(2, move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Client::builder(hyper_util::rt::TokioExecutor::new()).build(conn.clone())
        })
        .presenting(Some(slot.clone()));
        let (_c, lease) = lanes.lease();
        drop(lease);
        let (_c, held) = lanes.lease();
        assert_eq!(made.load(Ordering::SeqCst), 1, "one lane while nothing changes");
        let second = Identity::from_pem(SERVER_PEM.as_bytes(), SERVER_KEY.as_bytes()).unwrap();
        slot.replace(&second).unwrap();
        let (_c, _lease) = lanes.lease();
        assert_eq!(made.load(Ordering::SeqCst), 2, "a new lane for the renewed certificate");
        assert_eq!(lanes.lanes(), 1, "the old one left behind");
        // The request open on the old lane keeps its slot until it ends.
        drop(held);
        let (_c, _lease) = lanes.lease();
        assert_eq!(made.load(Ordering::SeqCst), 2);
    }
    use std::time::Duration;

    use bytes::Bytes;
    use futures_util::StreamExt;
    use http::{Method, Request, Response};
    use http_body_util::{BodyExt, Full, StreamBody};
    use hyper::body::Frame;

    use crate::upstream::testutil::*;
    use crate::upstream::{BoxBody, BoxError, Upstream, UpstreamOptions};

    /// An apiserver over TLS (HTTP/2 by ALPN) allowing `max_streams` streams per connection:
    /// `/watch` answers one line and never ends, `/big` answers 4 MiB, anything else `{}`.
    async fn apiserver(max_streams: u32) -> std::net::SocketAddr {
        let h = handler(|_, req: Request<hyper::body::Incoming>| async move {
            let body: BoxBody = match req.uri().path() {
                "/watch" => {
                    let line = futures_util::stream::once(async {
                        Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"{\"type\":\"ADDED\"}\n")))
                    });
                    StreamBody::new(line.chain(futures_util::stream::pending())).boxed_unsync()
                }
                "/big" => Full::new(Bytes::from(vec![b'x'; 4 << 20])).map_err(|e| match e {}).boxed_unsync(),
                _ => Full::new(Bytes::from_static(b"{}")).map_err(|e| match e {}).boxed_unsync(),
            };
            Response::new(body)
        });
        serve_tls_with(h, Some(max_streams)).await
    }

    fn upstream(dir: &TempDir, addr: std::net::SocketAddr, per_connection: usize) -> Upstream {
        Upstream::new(&UpstreamOptions {
            upstream: Some(format!("https://{addr}")),
            certificate_authority: Some(dir.write("ca.pem", CA_PEM)),
            max_streams_per_connection: per_connection,
            ..Default::default()
        })
        .unwrap()
    }

    /// More long-lived requests than the upstream allows streams on a connection (a cached
    /// resource's watch each, or callers' forwarded watches): the next request is answered at
    /// once, on another connection, instead of waiting for a watch to end.
    #[tokio::test]
    async fn requests_past_a_connections_stream_limit_go_on_another_connection() {
        let addr = apiserver(4).await;
        let dir = TempDir::new();
        let up = upstream(&dir, addr, 3);
        let metrics = std::sync::Arc::new(crate::metrics::Metrics::new());
        up.observe(metrics.clone());
        let mut watches = Vec::new();
        for _ in 0..6 {
            let req = up.inner.own_request(Method::GET, "/watch", None).unwrap();
            let resp = up.inner.send_own(req).await.unwrap();
            let mut body = resp.into_body();
            assert!(body.frame().await.unwrap().unwrap().is_data(), "the watch is open");
            watches.push(body);
        }
        assert_eq!(up.inner.own.lanes(), 2);
        let answer = tokio::time::timeout(Duration::from_secs(10), up.get_json("/version")).await;
        assert_eq!(&answer.expect("answered, not queued behind the watches").unwrap()[..], b"{}");
        assert_eq!(up.inner.own.lanes(), 3, "the two lanes were full");
        // The answered request gave its slot back: three more watches fit on the third lane.
        for _ in 0..3 {
            let req = up.inner.own_request(Method::GET, "/watch", None).unwrap();
            watches.push(up.inner.send_own(req).await.unwrap().into_body());
        }
        assert_eq!(up.inner.own.lanes(), 3);
        let answer = tokio::time::timeout(Duration::from_secs(10), up.get_json("/version")).await;
        assert!(answer.expect("answered").is_ok());
        assert_eq!(up.inner.own.lanes(), 4);
        let text = metrics.render();
        assert!(text.contains("watchcache_upstream_lanes{client=\"own\"} 4"), "{text}");
    }

    /// A forwarded body (pumped ahead by a task of its own) whose caller went away while the
    /// upstream sends nothing — an idle watch — gives its upstream stream and lane slot back at
    /// once, not at the upstream's next frame, which may never come.
    #[tokio::test]
    async fn a_pumped_idle_answer_whose_caller_left_gives_its_slot_back() {
        let addr = apiserver(100).await;
        let dir = TempDir::new();
        let up = upstream(&dir, addr, 1);
        let req = up.inner.own_request(Method::GET, "/watch", None).unwrap();
        let mut body = crate::upstream::rechunk::pumped(up.inner.send_own(req).await.unwrap().into_body());
        assert!(body.frame().await.unwrap().unwrap().is_data(), "the watch is open");
        assert_eq!(up.inner.own.open(), 1);
        drop(body);
        let back = async {
            while up.inner.own.open() != 0 {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), back).await.expect("the slot came back");
        let _ = up.get_json("/version").await.unwrap();
        assert_eq!(up.inner.own.lanes(), 1, "the next request took the freed slot");
    }

    /// A response whose reader stopped reading (a caller with no window, a slow one) holds its
    /// own stream's window only: the other responses on the same connection keep flowing.
    #[tokio::test]
    async fn a_response_nobody_reads_does_not_stop_the_others_on_its_connection() {
        let addr = apiserver(100).await;
        let dir = TempDir::new();
        let up = upstream(&dir, addr, 0);
        let req = up.inner.own_request(Method::GET, "/big", None).unwrap();
        let unread = up.inner.send_own(req).await.unwrap();
        for _ in 0..3 {
            let answer = tokio::time::timeout(Duration::from_secs(10), up.get_json("/version")).await;
            assert_eq!(&answer.expect("the connection still flows").unwrap()[..], b"{}");
        }
        assert_eq!(up.inner.own.lanes(), 1, "on the same connection");
        drop(unread);
    }
}
