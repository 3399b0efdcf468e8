//! Request limits: URL and header sizes (414 / 431), in-flight non-long-running requests and
//! watches per user (429 + `Retry-After`), and the timeout of non-long-running requests (504).
//!
//! Called by `Server::handle` before and around the request's work.

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

/// Whether a request may run for long (watches, logs, exec/attach/port-forward, proxy): such
/// requests are exempt from the in-flight limit and the request timeout, like the apiserver's.
pub fn is_long_running<B>(req: &Request<B>) -> bool {
    let path = req.uri().path();
    let query = req.uri().query().unwrap_or("");
    let watch_param = form_urlencoded::parse(query.as_bytes())
        .any(|(k, v)| (k == "watch" || k == "follow") && (v == "true" || v == "1"));
    let segs: Vec<&str> = path.split('/').collect();
    let watch_prefix = match segs.get(1) {
        Some(&"api") => segs.get(3) == Some(&"watch"),
        Some(&"apis") => segs.get(4) == Some(&"watch"),
        _ => false,
    };
    let long_sub = matches!(segs.last(), Some(&("exec" | "attach" | "portforward" | "proxy" | "log")))
        || segs.contains(&"proxy");
    watch_param || watch_prefix || long_sub || req.headers().contains_key(header::UPGRADE)
}

impl Limits {
    pub fn new(opts: LimitOptions) -> Limits {
        let permits = if opts.max_in_flight == 0 { Semaphore::MAX_PERMITS } else { opts.max_in_flight };
        Limits { in_flight: Arc::new(Semaphore::new(permits)), watches: Arc::default(), opts }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uri: &str) -> Request<()> {
        Request::builder().uri(uri).body(()).unwrap()
    }

    #[test]
    fn long_running_requests() {
        assert!(is_long_running(&req("/api/v1/pods?watch=true")));
        assert!(is_long_running(&req("/api/v1/watch/pods")));
        assert!(is_long_running(&req("/apis/apps/v1/watch/namespaces/a/deployments")));
        assert!(is_long_running(&req("/api/v1/namespaces/a/pods/p/exec?command=ls")));
        assert!(is_long_running(&req("/api/v1/namespaces/a/pods/p/log?follow=true")));
        assert!(!is_long_running(&req("/api/v1/pods?watch=false")));
        assert!(!is_long_running(&req("/api/v1/namespaces/watch/pods")));
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
}
