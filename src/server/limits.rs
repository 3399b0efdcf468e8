//! Request limits: URL and header sizes (414 / 431), in-flight non-long-running requests (all,
//! and each user's share) and watches per user (429 + `Retry-After`), and the timeout of
//! non-long-running requests (504).
//!
//! Called by the phases before and around the request's work (`phase::sizes`,
//! `phase::admit`, `phase::authenticate`, `phase::watch_slot`); which requests are
//! long-running is `classify::is_long_running` (from the request's `RequestInfo`). An in-flight
//! request holds a [`Ticket`]: the permit taken before authentication (`phase::admit`), and,
//! once its caller is known (`phase::authenticate`), a slot of that user's share — like the
//! apiserver's API Priority and Fairness, one user cannot take every seat. The ticket is held
//! until the response body ends ([`InFlight`]), but never past the request's deadline: then the
//! body is cut (like the apiserver's timeout filter aborting a response already started), and
//! never for long while the client takes nothing of the body (`write_stall_timeout`): a client
//! that stopped reading frees its ticket well before the deadline.

// The `Err` of these checks is the refusal response itself, built once per refused request.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body::{Body as HttpBody, Frame, SizeHint};
use parking_lot::Mutex;
use prometheus::IntCounter;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;
use tokio::time::{Instant, Sleep};

use super::body::{self, Body, BoxError};
use crate::error::Error;

/// The limits; `0` disables a count limit.
#[derive(Clone, Debug)]
pub struct LimitOptions {
    pub max_url_bytes: usize,
    pub max_header_bytes: usize,
    pub max_in_flight: usize,
    /// In-flight requests one user may hold (0: no share, only `max_in_flight`).
    pub max_in_flight_per_user: usize,
    /// A response body nothing was taken of for this long frees its ticket and is cut (zero:
    /// only at the deadline).
    pub write_stall_timeout: Duration,
    pub max_watches_per_user: usize,
    pub request_timeout: Duration,
}

impl Default for LimitOptions {
    fn default() -> Self {
        LimitOptions {
            max_url_bytes: 16 * 1024,
            max_header_bytes: 1024 * 1024,
            max_in_flight: 400,
            max_in_flight_per_user: 200,
            write_stall_timeout: Duration::from_secs(10),
            max_watches_per_user: 1000,
            request_timeout: Duration::from_secs(60),
        }
    }
}

/// Shared counters.
pub struct Limits {
    pub opts: LimitOptions,
    in_flight: Arc<Semaphore>,
    permits: usize,
    /// In-flight requests per user.
    users: Counts,
    /// Starts of watches whose RV is unset per user and client address ([`user_at`]).
    starts: Counts,
    /// Both, per user: at most [`Limits::user_total`].
    totals: Counts,
    watches: Counts,
}

/// A count per user.
type Counts = Arc<Mutex<HashMap<String, usize>>>;

fn plain(code: StatusCode, text: &'static str) -> Response<Body> {
    let mut r = Response::new(body::full(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// The listener's `--max-connections` slots, carried by a request that asks to upgrade: an
/// upgraded session keeps two sockets (the caller's and its own upstream connection) where its
/// connection holds one slot, so it takes a second (`phase::watch_slot`).
#[derive(Clone)]
pub struct ConnectionSlots(pub Arc<Semaphore>);

/// The apiserver's max-in-flight (and API Priority and Fairness) answer, byte for byte: Go's
/// `http.Error` of `Too many requests, please try again later.` with `Retry-After` (1.36
/// `filters.tooManyRequests`), plain text, not a Status (client-go reads the code and
/// `Retry-After` alike; its message then is its own "the server has received too many
/// requests…"). It was a JSON Status before 2026-11-29 (found by a review).
pub fn too_many() -> Response<Body> {
    let mut r =
        Response::new(body::full(Bytes::from_static(b"Too many requests, please try again later.\n")));
    *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let h = r.headers_mut();
    h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    r
}

/// Go's net/http answer to a request whose `Transfer-Encoding` is anything but one `chunked`
/// (transfer.go `parseTransferEncoding`: "we only support a single Transfer-Encoding header
/// field, and only if set to chunked"; the server writes `501 Not Implemented` and closes).
/// hyper would decode the chunking and pass on a body still in the other coding, without it.
pub fn unsupported_transfer_encoding<B>(req: &http::Request<B>) -> Option<Response<Body>> {
    let values: Vec<&HeaderValue> = req.headers().get_all(header::TRANSFER_ENCODING).iter().collect();
    let ok = match values.as_slice() {
        [] => true,
        [one] => one.to_str().is_ok_and(|v| v.trim().eq_ignore_ascii_case("chunked")),
        _ => false,
    };
    if ok {
        return None;
    }
    let mut r = Response::new(body::full(Bytes::from_static(b"501 Not Implemented")));
    *r.status_mut() = StatusCode::NOT_IMPLEMENTED;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    Some(r)
}

/// The apiserver's timeout filter answer.
pub fn timed_out() -> Response<Body> {
    body::error(Error::Timeout)
}

impl Limits {
    pub fn new(opts: LimitOptions) -> Limits {
        let permits = if opts.max_in_flight == 0 { Semaphore::MAX_PERMITS } else { opts.max_in_flight };
        Limits {
            in_flight: Arc::new(Semaphore::new(permits)),
            permits,
            users: Arc::default(),
            starts: Arc::default(),
            totals: Arc::default(),
            watches: Arc::default(),
            opts,
        }
    }

    /// Requests holding an in-flight permit now.
    pub fn in_flight(&self) -> usize {
        self.permits.saturating_sub(self.in_flight.available_permits())
    }

    /// 414 for a too long URL, 431 for too large headers.
    pub fn check_sizes<B>(&self, req: &Request<B>) -> Result<(), Response<Body>> {
        let url = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
        if url > self.opts.max_url_bytes {
            return Err(plain(StatusCode::URI_TOO_LONG, "414 URI Too Long"));
        }
        let headers: usize = req.headers().iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum();
        if headers > self.opts.max_header_bytes {
            return Err(plain(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "431 Request Header Fields Too Large",
            ));
        }
        Ok(())
    }

    /// A ticket for one non-long-running request (its permit), or 429.
    pub fn admit(&self) -> Result<Ticket, Response<Body>> {
        let permit = self.in_flight.clone().try_acquire_owned().map_err(|_| too_many())?;
        Ok(Ticket(Arc::new(Mutex::new(Hold { permit: Some(permit), ..Hold::default() }))))
    }

    /// Adds a slot of `user`'s in-flight share to `ticket`, or 429 when the user holds all of
    /// theirs.
    pub fn share(&self, ticket: &Ticket, user: &str) -> Result<(), Response<Body>> {
        self.share_of(&self.users, ticket, user, user)
    }

    /// The same for the start of a watch whose RV is unset (its read upstream, `admit`), per
    /// user and client address as the watch slots are: a DaemonSet's pods share one service
    /// account across the nodes, and a relist wave starts all their watch-lists at once.
    pub fn share_start(
        &self,
        ticket: &Ticket,
        user: &str,
        source: Option<IpAddr>,
    ) -> Result<(), Response<Body>> {
        self.share_of(&self.starts, ticket, &user_at(user, source), user)
    }

    /// The in-flight requests one user may hold in all, starts from every address included:
    /// three quarters of `--max-requests-inflight` (at least the user's share), so that every
    /// other caller keeps a quarter. Starts have a share apart per address (a DaemonSet's
    /// service account starts watches on every node at once), and before 2026-11-29 one user
    /// at two addresses could hold every permit (found by a review).
    fn user_total(&self) -> usize {
        match self.opts.max_in_flight {
            0 => 0,
            n => (n * 3 / 4).max(self.opts.max_in_flight_per_user),
        }
    }

    fn share_of(
        &self,
        counts: &Counts,
        ticket: &Ticket,
        key: &str,
        user: &str,
    ) -> Result<(), Response<Body>> {
        if self.opts.max_in_flight_per_user == 0 {
            return Ok(());
        }
        let slot = take_slot(counts, key, self.opts.max_in_flight_per_user).ok_or_else(too_many)?;
        let total = take_slot(&self.totals, user, self.user_total()).ok_or_else(too_many)?;
        let mut hold = ticket.0.lock();
        // Already freed (stalled or past its deadline): the slots go back at once.
        if !hold.released {
            hold.share = Some((slot, total));
        }
        Ok(())
    }

    /// In-flight requests of `user` (tests, diagnostics).
    pub fn in_flight_of(&self, user: &str) -> usize {
        self.users.lock().get(user).copied().unwrap_or(0)
    }

    /// A slot for one more watch of `user` from the client host `addr`, or 429. The slot is
    /// freed when the guard drops.
    ///
    /// Counted per user *and* client address ([`user_at`]).
    pub fn watch_slot(&self, user: &str, addr: Option<IpAddr>) -> Result<WatchGuard, Response<Body>> {
        take_slot(&self.watches, &user_at(user, addr), self.opts.max_watches_per_user).ok_or_else(too_many)
    }

    /// Open watches of `user`, from every address (for tests and diagnostics).
    pub fn watches_of(&self, user: &str) -> usize {
        let m = self.watches.lock();
        m.iter().filter(|(k, _)| k.split_once(' ').is_some_and(|(_, u)| u == user)).map(|(_, n)| *n).sum()
    }
}

/// The name whose per-user limits (watch slots, the review rate) the authenticated
/// user `by` spends acting as `name`: its own, or the pair when it impersonates — an
/// impersonating front proxy (Pinniped, Teleport) serves each of its users with that user's
/// limits, as the apiserver's priority and fairness classifies by the impersonated user, and
/// an impersonator never spends the named user's own (a review: keyed by the impersonated user
/// alone, an impersonator could exhaust another user's slots; by the impersonator alone, a
/// front proxy's users shared one set). An impersonator's limits so multiply with the names it
/// uses: it is trusted with impersonation, which grants far more; its in-flight share and its
/// turn at the review seats stay its own.
pub fn acting<'a>(by: &'a str, name: &'a str) -> std::borrow::Cow<'a, str> {
    if by == name {
        std::borrow::Cow::Borrowed(name)
    } else {
        std::borrow::Cow::Owned(format!("{by}\0{name}"))
    }
}

/// The key of what is counted per user *and* client address (`--max-watches-per-user`,
/// `--authorization-review-qps`): the address, which holds no space, then the user (any text).
/// A DaemonSet's pods share one service account across the nodes (kube-proxy, CNI and log
/// agents), so a count per user alone held them all to one node's share (kube-proxy's 2–3
/// watches a node were refused, for good, past a few hundred nodes). One client *address*
/// gets no more than the bound under one identity; an identity used from many addresses (a
/// token copied into many pods, a host that binds many addresses: the loopback's 127/8, an
/// IPv6 prefix) gets the bound at each. The whole address, IPv6 too: hostNetwork pods on nodes
/// of one /64 subnet are many hosts. Behind a load balancer that hides client addresses every
/// client has the balancer's, and the bound is per user again.
pub fn user_at(user: &str, source: Option<IpAddr>) -> String {
    match source {
        Some(a) => format!("{} {user}", a.to_canonical()),
        None => format!("- {user}"),
    }
}

/// One of `user`'s `max` slots in `counts` (0: unlimited), or `None` when all are taken.
fn take_slot(counts: &Counts, user: &str, max: usize) -> Option<Slot> {
    let mut m = counts.lock();
    let n = m.entry(user.to_owned()).or_default();
    if max > 0 && *n >= max {
        return None;
    }
    *n += 1;
    Some(Slot { map: counts.clone(), user: user.to_owned() })
}

/// Holds one of a user's slots (a watch, or a share of the in-flight requests).
pub struct Slot {
    map: Counts,
    user: String,
}

/// One of a user's watch slots.
pub type WatchGuard = Slot;

impl Drop for Slot {
    fn drop(&mut self) {
        let mut m = self.map.lock();
        if let Some(n) = m.get_mut(&self.user) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.user);
            }
        }
    }
}

/// One non-long-running request's hold on the in-flight limits: its permit and, once its
/// caller is known, a slot of that user's share. Cloned into the request's extensions so that
/// `phase::authenticate` can add the slot; freed all at once.
#[derive(Clone)]
pub struct Ticket(Arc<Mutex<Hold>>);

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let h = self.0.lock();
        f.debug_struct("Ticket").field("held", &!h.released).field("cut", &h.cut).finish()
    }
}

#[derive(Default)]
struct Hold {
    permit: Option<OwnedSemaphorePermit>,
    /// The user's (or user and address's) share and the user's total.
    share: Option<(Slot, Slot)>,
    /// Let go (the body ended, or the watchdog freed it): nothing is held any more.
    released: bool,
    /// Since when the body has given a frame and waits for the client to take it (`None`: it
    /// waits for its source, which is not the client's doing).
    owed_since: Option<Instant>,
    /// Freed by the watchdog: the body ends with an error when next polled.
    cut: bool,
}

impl Ticket {
    /// A ticket holding no permit: the write-stall cut alone, for a long-running answer
    /// ([`InFlight::wrap`] with it).
    pub fn unlimited() -> Ticket {
        Ticket(Arc::default())
    }

    /// Frees the permit and the share.
    pub(crate) fn release(&self) {
        let mut h = self.0.lock();
        h.released = true;
        h.permit.take();
        h.share.take();
    }
}

/// A response body that keeps a guard (a watch slot) alive until the body is done or dropped.
pub struct Guarded<G> {
    inner: Body,
    _guard: G,
}

impl<G: Unpin + Send + 'static> Guarded<G> {
    pub fn wrap(resp: Response<Body>, guard: G) -> Response<Body> {
        resp.map(|inner| http_body_util::BodyExt::boxed_unsync(Guarded { inner, _guard: guard }))
    }
}

impl<G: Unpin> HttpBody for Guarded<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A non-long-running request's response body: holds the request's [`Ticket`] until the body
/// ends or is dropped, and ends the body with an error at the request's deadline. A watchdog
/// task frees the ticket at the deadline even when nobody polls the body (a client that
/// stopped reading: hyper polls a body only when it can write), and before it when the body
/// gave a frame and was not asked for the next one for `write_stall_timeout` (then the body is
/// cut too: it ends with an error if it is ever polled again). Either way the watchdog also
/// lets go of what the body still had to send (a list's snapshot and chunk, an indented copy),
/// which hyper would otherwise keep until the connection ends: a client that never reads
/// holds only this shell.
pub struct InFlight {
    inner: Shared,
    ticket: Ticket,
    /// `None`: no deadline of the proxy's own (a long-running answer: [`InFlight::stall_only`]).
    deadline: Option<std::pin::Pin<Box<Sleep>>>,
    watchdog: AbortHandle,
    done: bool,
}

/// The body an [`InFlight`] sends, which its watchdog empties when it cuts it.
type Shared = Arc<Mutex<Option<Body>>>;

impl InFlight {
    /// `cuts` counts the write-stall cuts (`watchcache_write_stall_cuts_total`).
    pub fn wrap(
        resp: Response<Body>,
        ticket: Ticket,
        deadline: Instant,
        stall: Duration,
        cuts: IntCounter,
    ) -> Response<Body> {
        Self::make(resp, ticket, Some(deadline), stall, cuts)
    }

    /// A long-running answer (a watch): no deadline of the proxy's own and no permit, only the
    /// write-stall cut (`stall`, non-zero).
    pub fn stall_only(resp: Response<Body>, stall: Duration, cuts: IntCounter) -> Response<Body> {
        Self::make(resp, Ticket::unlimited(), None, stall, cuts)
    }

    fn make(
        resp: Response<Body>,
        ticket: Ticket,
        deadline: Option<Instant>,
        stall: Duration,
        cuts: IntCounter,
    ) -> Response<Body> {
        ticket.0.lock().owed_since = Some(Instant::now());
        let (parts, inner) = resp.into_parts();
        let inner: Shared = Arc::new(Mutex::new(Some(inner)));
        let watchdog =
            tokio::spawn(watch(ticket.clone(), inner.clone(), deadline, stall, cuts)).abort_handle();
        let deadline = deadline.map(|d| Box::pin(tokio::time::sleep_until(d)));
        let body = InFlight { inner, ticket, deadline, watchdog, done: false };
        Response::from_parts(parts, http_body_util::BodyExt::boxed_unsync(body))
    }

    fn finish(&mut self) {
        self.done = true;
        self.ticket.release();
        self.watchdog.abort();
    }
}

/// Frees `ticket` at `deadline` (if any), or when its body has waited `stall` (non-zero) for
/// the client, and then lets go of the body's source (`inner`).
async fn watch(ticket: Ticket, inner: Shared, deadline: Option<Instant>, stall: Duration, cuts: IntCounter) {
    loop {
        let now = Instant::now();
        let next = {
            let mut h = ticket.0.lock();
            if h.released {
                return;
            }
            let stalled = h.owed_since.map(|t| t + stall).filter(|_| !stall.is_zero());
            if deadline.is_some_and(|d| now >= d) {
                None
            } else if stalled.is_some_and(|at| now >= at) {
                h.cut = true;
                cuts.inc();
                tracing::debug!(waited = ?stall, "the client took nothing of a response: in-flight permit freed, body cut");
                None
            } else if stall.is_zero() {
                // Neither a deadline nor a stall cut: nothing to watch for.
                let Some(d) = deadline else { return };
                Some(d)
            } else {
                // Not owed yet: look again a stall later (it may be owed by then).
                let at = stalled.unwrap_or(now + stall);
                Some(deadline.map_or(at, |d| at.min(d)))
            }
        };
        match next {
            Some(at) => tokio::time::sleep_until(at).await,
            None => {
                ticket.release();
                let source = inner.lock().take();
                drop(source);
                return;
            }
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.finish();
    }
}

impl HttpBody for InFlight {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        use std::future::Future;
        use std::task::Poll;
        if self.done {
            return Poll::Ready(None);
        }
        if self.ticket.0.lock().cut {
            self.finish();
            return Poll::Ready(Some(Err("the client took nothing of the response for too long".into())));
        }
        let past_deadline = match self.deadline.as_mut() {
            Some(d) => d.is_elapsed() || d.as_mut().poll(cx).is_ready(),
            None => false,
        };
        if past_deadline {
            self.finish();
            tracing::debug!("response body cut at the request timeout");
            return Poll::Ready(Some(Err("the request timeout expired while sending the response".into())));
        }
        let polled = match self.inner.lock().as_mut() {
            Some(inner) => std::pin::Pin::new(inner).poll_frame(cx),
            // Let go by the watchdog (cut or past the deadline: caught above).
            None => Poll::Ready(Some(Err("the response was given up".into()))),
        };
        match &polled {
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.finish(),
            Poll::Ready(Some(Ok(_))) => self.ticket.0.lock().owed_since = Some(Instant::now()),
            Poll::Pending => self.ticket.0.lock().owed_since = None,
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        // A source let go by the watchdog is not an end: the next poll says it failed.
        self.done || self.inner.lock().as_ref().is_some_and(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.lock().as_ref().map(|b| b.size_hint()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_single_chunked_transfer_encoding_is_accepted() {
        let req = |te: &[&str]| {
            let mut b = http::Request::post("/api/v1/namespaces/ns/configmaps");
            for v in te {
                b = b.header("transfer-encoding", *v);
            }
            b.body(()).unwrap()
        };
        assert!(unsupported_transfer_encoding(&req(&[])).is_none());
        assert!(unsupported_transfer_encoding(&req(&["chunked"])).is_none());
        assert!(unsupported_transfer_encoding(&req(&["Chunked"])).is_none());
        for bad in [&["gzip, chunked"][..], &["gzip"], &["chunked", "chunked"], &["identity"]] {
            let r = unsupported_transfer_encoding(&req(bad)).expect("refused");
            assert_eq!(r.status(), 501, "{bad:?}");
        }
    }

    fn req(uri: &str) -> Request<()> {
        Request::builder().uri(uri).body(()).unwrap()
    }

    #[test]
    fn sizes() {
        let l =
            Limits::new(LimitOptions { max_url_bytes: 20, max_header_bytes: 50, ..LimitOptions::default() });
        assert!(l.check_sizes(&req("/api/v1/pods")).is_ok());
        assert_eq!(l.check_sizes(&req("/api/v1/pods?limit=5000000")).unwrap_err().status(), 414);
        let big = Request::builder().uri("/").header("x-a", "b".repeat(60)).body(()).unwrap();
        assert_eq!(l.check_sizes(&big).unwrap_err().status(), 431);
    }

    #[tokio::test]
    async fn in_flight_and_watch_slots() {
        let l = Limits::new(LimitOptions {
            max_in_flight: 1,
            max_watches_per_user: 2,
            ..LimitOptions::default()
        });
        let p = l.admit().unwrap();
        let r = l.admit().unwrap_err();
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()["retry-after"], "1");
        // The apiserver's answer: Go's `http.Error`, plain text.
        assert_eq!(r.headers()["content-type"], "text/plain; charset=utf-8");
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
        let body = http_body_util::BodyExt::collect(r.into_body()).await;
        assert_eq!(&body.unwrap().to_bytes()[..], b"Too many requests, please try again later.\n");
        drop(p);
        assert!(l.admit().is_ok());
        let (one, two): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let a = l.watch_slot("u", Some(one)).unwrap();
        let _b = l.watch_slot("u", Some(one)).unwrap();
        assert!(l.watch_slot("u", Some(one)).is_err());
        // The same address in IPv6 form (a dual-stack listener) is the same client host.
        assert!(l.watch_slot("u", Some("::ffff:10.0.0.1".parse().unwrap())).is_err());
        assert!(l.watch_slot("v", Some(one)).is_ok(), "another user");
        let _c = l.watch_slot("u", Some(two)).unwrap();
        assert!(l.watch_slot("u", None).is_ok(), "no address: slots of their own");
        assert_eq!(l.watches_of("u"), 3, "open ones, every address");
        drop(a);
        assert_eq!(l.watches_of("u"), 2);
        assert!(l.watch_slot("u", Some(one)).is_ok());
        // A user whose name holds spaces or looks like an address is still only itself.
        let _d = l.watch_slot("10.0.0.1 u", Some(two)).unwrap();
        assert_eq!((l.watches_of("u"), l.watches_of("10.0.0.1 u")), (2, 1));
    }

    fn one_permit() -> Limits {
        Limits::new(LimitOptions { max_in_flight: 1, ..LimitOptions::default() })
    }

    /// A response whose body sends what the returned sender sends.
    fn streaming() -> (tokio::sync::mpsc::Sender<Bytes>, Response<Body>) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, BoxError>(Frame::data(b)), rx))
        });
        let body = http_body_util::BodyExt::boxed_unsync(http_body_util::StreamBody::new(stream));
        (tx, Response::new(body))
    }

    #[tokio::test(start_paused = true)]
    async fn the_permit_is_held_until_the_body_ends() {
        use http_body_util::BodyExt;
        let l = one_permit();
        let (tx, resp) = streaming();
        let resp = InFlight::wrap(
            resp,
            l.admit().unwrap(),
            Instant::now() + Duration::from_secs(60),
            Duration::ZERO,
            cuts(),
        );
        assert_eq!(l.admit().unwrap_err().status(), 429, "headers sent, body still running");
        let mut body = resp.into_body();
        tx.send(Bytes::from_static(b"a")).await.unwrap();
        assert!(body.frame().await.unwrap().is_ok());
        assert!(l.admit().is_err(), "still running");
        drop(tx);
        assert!(body.frame().await.is_none());
        assert!(l.admit().is_ok(), "freed when the body ended");
        // Dropping an unfinished body frees it too.
        let (_tx, resp) = streaming();
        let resp = InFlight::wrap(
            resp,
            l.admit().unwrap(),
            Instant::now() + Duration::from_secs(60),
            Duration::ZERO,
            cuts(),
        );
        assert!(l.admit().is_err());
        drop(resp);
        assert!(l.admit().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_deadline_the_body_is_cut_and_the_permit_freed_even_unpolled() {
        use http_body_util::BodyExt;
        let l = one_permit();
        let (tx, resp) = streaming();
        let resp = InFlight::wrap(
            resp,
            l.admit().unwrap(),
            Instant::now() + Duration::from_secs(60),
            Duration::ZERO,
            cuts(),
        );
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert!(l.admit().is_err());
        // Nobody polls the body (a client that stopped reading): the watchdog frees the permit.
        tokio::time::sleep(Duration::from_secs(1)).await;
        tokio::task::yield_now().await;
        assert!(l.admit().is_ok(), "freed at the deadline");
        assert!(tx.is_closed(), "and what the body had to send let go, unpolled");
        let mut body = resp.into_body();
        assert!(body.frame().await.unwrap().is_err(), "the body ends with an error");
        assert!(body.frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_user_holds_at_most_its_share_and_the_ticket_frees_both() {
        let l = Limits::new(LimitOptions {
            max_in_flight: 4,
            max_in_flight_per_user: 2,
            ..LimitOptions::default()
        });
        let (a1, a2, a3) = (l.admit().unwrap(), l.admit().unwrap(), l.admit().unwrap());
        assert!(l.share(&a1, "alice").is_ok() && l.share(&a2, "alice").is_ok());
        let r = l.share(&a3, "alice").unwrap_err();
        assert_eq!(
            (r.status(), &r.headers()["retry-after"]),
            (StatusCode::TOO_MANY_REQUESTS, &HeaderValue::from_static("1"))
        );
        drop(a3);
        let b = l.admit().unwrap();
        assert!(l.share(&b, "bob").is_ok(), "another user has their own share");
        assert_eq!((l.in_flight(), l.in_flight_of("alice")), (3, 2));
        a1.release();
        assert_eq!((l.in_flight(), l.in_flight_of("alice")), (2, 1), "permit and share go together");
    }

    /// A watch's start takes a share per user and client address (a DaemonSet's service
    /// account starts watches from every node at once), apart from the user's other requests.
    #[tokio::test(start_paused = true)]
    async fn a_watch_start_takes_a_share_per_user_and_address() {
        let l = Limits::new(LimitOptions {
            max_in_flight: 8,
            max_in_flight_per_user: 1,
            ..LimitOptions::default()
        });
        let (one, two): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let (a, b, c, d) = (l.admit().unwrap(), l.admit().unwrap(), l.admit().unwrap(), l.admit().unwrap());
        assert!(l.share_start(&a, "kube-proxy", Some(one)).is_ok());
        assert!(l.share_start(&b, "kube-proxy", Some(one)).is_err(), "one address: the user's share");
        assert!(l.share_start(&c, "kube-proxy", Some(two)).is_ok(), "another node: a share of its own");
        assert!(l.share(&d, "kube-proxy").is_ok(), "the user's other requests: their own share");
        a.release();
        let e = l.admit().unwrap();
        assert!(l.share_start(&e, "kube-proxy", Some(one)).is_ok(), "given back with the ticket");
    }

    /// One user holds at most three quarters of the permits in all, its starts from every
    /// address included: the others keep a quarter (before, one user at two addresses could
    /// hold them all: found by a review).
    #[tokio::test(start_paused = true)]
    async fn a_user_holds_at_most_three_quarters_of_the_permits_in_all() {
        let l = Limits::new(LimitOptions {
            max_in_flight: 8,
            max_in_flight_per_user: 4,
            ..LimitOptions::default()
        });
        let (one, two): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut held = Vec::new();
        for _ in 0..4 {
            let t = l.admit().unwrap();
            assert!(l.share(&t, "mallory").is_ok());
            held.push(t);
        }
        for _ in 0..2 {
            let t = l.admit().unwrap();
            assert!(l.share_start(&t, "mallory", Some(one)).is_ok());
            held.push(t);
        }
        let t = l.admit().unwrap();
        assert!(l.share_start(&t, "mallory", Some(two)).is_err(), "6 of 8: the user's total");
        drop(t);
        let (b1, b2) = (l.admit().unwrap(), l.admit().unwrap());
        assert!(l.share(&b1, "bob").is_ok() && l.share(&b2, "bob").is_ok(), "a quarter left for the others");
        assert!(l.admit().is_err(), "every permit is held");
        held.pop().unwrap().release();
        let t = l.admit().unwrap();
        assert!(l.share_start(&t, "mallory", Some(two)).is_ok(), "one of its own given back");
    }

    /// A counter of write-stall cuts of a test's own.
    fn cuts() -> IntCounter {
        IntCounter::new("cuts", "write-stall cuts").unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_the_client_takes_nothing_of_frees_its_ticket_at_the_stall_timeout() {
        use http_body_util::BodyExt;
        let l = Limits::new(LimitOptions {
            max_in_flight: 2,
            max_in_flight_per_user: 1,
            ..LimitOptions::default()
        });
        let stall = Duration::from_secs(10);
        let deadline = Instant::now() + Duration::from_secs(120);
        let ticket = l.admit().unwrap();
        l.share(&ticket, "alice").unwrap();
        let (tx, resp) = streaming();
        let counted = cuts();
        let mut body = InFlight::wrap(resp, ticket, deadline, stall, counted.clone()).into_body();
        // The source is slow (the body waits for it, not for the client): not a stall.
        assert!(futures_util::FutureExt::now_or_never(body.frame()).is_none(), "waits for its source");
        tokio::time::sleep(Duration::from_secs(50)).await;
        assert_eq!(l.in_flight_of("alice"), 1, "still held while the source is slow");
        // A frame is given, and the client does not ask for the next one.
        tx.send(Bytes::from_static(b"a")).await.unwrap();
        assert!(body.frame().await.unwrap().is_ok());
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!((l.in_flight(), l.in_flight_of("alice")), (1, 1));
        assert!(!tx.is_closed());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            (l.in_flight(), l.in_flight_of("alice")),
            (0, 0),
            "freed at the stall timeout, before the deadline"
        );
        // The client never asks again (hyper keeps the body while the stream lives): what it
        // had to send is let go all the same.
        assert!(tx.is_closed(), "the source let go at the cut, unpolled");
        assert_eq!(counted.get(), 1, "the cut is counted");
        assert!(!http_body::Body::is_end_stream(&body), "not a complete-looking end");
        assert!(body.frame().await.unwrap().is_err(), "and the body is cut");
    }
}
