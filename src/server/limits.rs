//! Request limits: URL and header sizes (414 / 431), in-flight non-long-running requests and
//! watches per user (429 + `Retry-After`), and the timeout of non-long-running requests (504).
//!
//! Called by `Server::handle` before and around the request's work; which requests are
//! long-running is `classify::is_long_running` (from the request's `RequestInfo`). An in-flight
//! permit is held until the response body ends ([`InFlight`]), but never past the request's
//! deadline: then the body is cut (like the apiserver's timeout filter aborting a response
//! already started) and the permit is freed even if the client stopped reading.

// The `Err` of these checks is the refusal response itself, built once per refused request.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body::{Body as HttpBody, Frame, SizeHint};
use parking_lot::Mutex;
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
    pub max_watches_per_user: usize,
    pub request_timeout: Duration,
}

impl Default for LimitOptions {
    fn default() -> Self {
        LimitOptions {
            max_url_bytes: 16 * 1024,
            max_header_bytes: 1024 * 1024,
            max_in_flight: 400,
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
    watches: Arc<Mutex<HashMap<String, usize>>>,
}

fn plain(code: StatusCode, text: &'static str) -> Response<Body> {
    let mut r = Response::new(body::full(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// The apiserver's max-in-flight answer.
pub fn too_many() -> Response<Body> {
    body::error(Error::TooManyRequests {
        message: "Too many requests, please try again later.".into(),
        retry_after: 1,
    })
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
    let v = serde_json::json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
        "message":"Timeout: request did not complete within the allotted timeout","reason":"Timeout",
        "details":{},"code":504});
    let mut r = Response::new(body::full(Bytes::from(v.to_string())));
    *r.status_mut() = StatusCode::GATEWAY_TIMEOUT;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

impl Limits {
    pub fn new(opts: LimitOptions) -> Limits {
        let permits = if opts.max_in_flight == 0 { Semaphore::MAX_PERMITS } else { opts.max_in_flight };
        Limits { in_flight: Arc::new(Semaphore::new(permits)), permits, watches: Arc::default(), opts }
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

    /// A permit for one non-long-running request, or 429.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, Response<Body>> {
        self.in_flight.clone().try_acquire_owned().map_err(|_| too_many())
    }

    /// A slot for one more watch of `user`, or 429. The slot is freed when the guard drops.
    pub fn watch_slot(&self, user: &str) -> Result<WatchGuard, Response<Body>> {
        let mut m = self.watches.lock();
        let n = m.entry(user.to_owned()).or_default();
        if self.opts.max_watches_per_user > 0 && *n >= self.opts.max_watches_per_user {
            return Err(too_many());
        }
        *n += 1;
        Ok(WatchGuard { map: self.watches.clone(), user: user.to_owned() })
    }

    /// Open watches of `user` (for tests and metrics).
    pub fn watches_of(&self, user: &str) -> usize {
        self.watches.lock().get(user).copied().unwrap_or(0)
    }
}

/// Holds one of a user's watch slots.
pub struct WatchGuard {
    map: Arc<Mutex<HashMap<String, usize>>>,
    user: String,
}

impl Drop for WatchGuard {
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

/// A non-long-running request's response body: holds the in-flight permit until the body ends
/// or is dropped, and ends the body with an error at the request's deadline. A watchdog task
/// frees the permit at the deadline even when nobody polls the body (a client that stopped
/// reading: hyper polls a body only when it can write).
pub struct InFlight {
    inner: Body,
    permit: Arc<Mutex<Option<OwnedSemaphorePermit>>>,
    deadline: std::pin::Pin<Box<Sleep>>,
    watchdog: AbortHandle,
    done: bool,
}

impl InFlight {
    pub fn wrap(resp: Response<Body>, permit: OwnedSemaphorePermit, deadline: Instant) -> Response<Body> {
        let permit = Arc::new(Mutex::new(Some(permit)));
        let held = permit.clone();
        let watchdog = tokio::spawn(async move {
            tokio::time::sleep_until(deadline).await;
            held.lock().take();
        })
        .abort_handle();
        let deadline = Box::pin(tokio::time::sleep_until(deadline));
        resp.map(|inner| {
            http_body_util::BodyExt::boxed_unsync(InFlight { inner, permit, deadline, watchdog, done: false })
        })
    }

    fn finish(&mut self) {
        self.done = true;
        self.permit.lock().take();
        self.watchdog.abort();
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
        if self.deadline.is_elapsed() || self.deadline.as_mut().poll(cx).is_ready() {
            self.finish();
            tracing::debug!("response body cut at the request timeout");
            return Poll::Ready(Some(Err("the request timeout expired while sending the response".into())));
        }
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.finish();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
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

    #[test]
    fn in_flight_and_watch_slots() {
        let l = Limits::new(LimitOptions {
            max_in_flight: 1,
            max_watches_per_user: 2,
            ..LimitOptions::default()
        });
        let p = l.admit().unwrap();
        let r = l.admit().unwrap_err();
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()["retry-after"], "1");
        drop(p);
        assert!(l.admit().is_ok());
        let a = l.watch_slot("u").unwrap();
        let _b = l.watch_slot("u").unwrap();
        assert!(l.watch_slot("u").is_err());
        assert!(l.watch_slot("v").is_ok());
        drop(a);
        assert_eq!(l.watches_of("u"), 1);
        assert!(l.watch_slot("u").is_ok());
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
        let resp = InFlight::wrap(resp, l.admit().unwrap(), Instant::now() + Duration::from_secs(60));
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
        let resp = InFlight::wrap(resp, l.admit().unwrap(), Instant::now() + Duration::from_secs(60));
        assert!(l.admit().is_err());
        drop(resp);
        assert!(l.admit().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_deadline_the_body_is_cut_and_the_permit_freed_even_unpolled() {
        use http_body_util::BodyExt;
        let l = one_permit();
        let (_tx, resp) = streaming();
        let resp = InFlight::wrap(resp, l.admit().unwrap(), Instant::now() + Duration::from_secs(60));
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert!(l.admit().is_err());
        // Nobody polls the body (a client that stopped reading): the watchdog frees the permit.
        tokio::time::sleep(Duration::from_secs(1)).await;
        tokio::task::yield_now().await;
        assert!(l.admit().is_ok(), "freed at the deadline");
        let mut body = resp.into_body();
        assert!(body.frame().await.unwrap().is_err(), "the body ends with an error");
        assert!(body.frame().await.is_none());
    }
}
