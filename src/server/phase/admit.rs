//! Phase 4: the request's `RequestInfo` (into the extensions), then the in-flight limit and the
//! request timeout for what is not long-running (and the limit alone for the start of a watch
//! that begins with a read upstream, until its stream begins); the request's `limits::Ticket` goes into the
//! extensions too (`authenticate` adds its caller's share). Before authentication, unlike the
//! apiserver's handler chain (there `WithAuthentication` runs first and `WithMaxInFlightLimit`
//! after it): whether a request is long-running needs its `RequestInfo` only, and
//! unauthenticated callers must not be able to make the proxy send unbounded TokenReviews; the
//! requests waiting on a review hold their permits in a bounded number of seats
//! (`auth::waiting`), so those of one source cannot hold them all.
//!
//! Hand-written rather than tower's `ConcurrencyLimit` / `Timeout`: the permit is held until
//! the response *body* has been sent (`limits::InFlight`), not until the response future
//! resolves, and the refusal is the apiserver's 429 Status with `Retry-After`, not a pending
//! `poll_ready`; the timeout is the apiserver's 504 Status.

use std::sync::Arc;

use super::{arrived, context_mut, pass, Next, Phase, Recorder, Req, Resp};
use crate::server::classify;
use crate::server::limits::{self, Limits};

#[derive(Clone)]
pub struct Admit {
    pub limits: Arc<Limits>,
    pub recorder: Recorder,
}

impl<B: Send + Sync + 'static> Phase<B> for Admit {
    async fn call<S: Next<B>>(&self, mut req: Req<B>, next: &S) -> Resp {
        let arrived = arrived(&req);
        let info = classify::request_info(req.method(), req.uri().path(), req.uri().query());
        let long_running = classify::is_long_running(&info);
        let starts_with_a_read = long_running && classify::starts_with_a_read(&info, req.uri().query());
        let verb = info.verb.clone();
        let deadline_filtered = !classify::apiserver_long_running(&info, req.uri().path());
        context_mut(&mut req).info = Some(info);
        if long_running && !starts_with_a_read {
            return pass(next, req).await;
        }
        let mut timeout = self.limits.opts.request_timeout;
        if !long_running && deadline_filtered {
            // The apiserver's `WithRequestDeadline`, which runs before its in-flight limit and
            // authentication: `?timeout=` shortens the deadline, and one Go cannot read is 400
            // (a review: it was ignored by what the cache served).
            match user_timeout(req.uri().query()) {
                Ok(Some(t)) if t < timeout => timeout = t,
                Ok(_) => {}
                Err(message) => {
                    let accept =
                        req.headers().get(http::header::ACCEPT).map(|v| std::str::from_utf8(v.as_bytes()));
                    // One the proxy cannot write as the apiserver would goes on, to be forwarded.
                    let known = match accept {
                        None => classify::error_encoding_known(None),
                        Some(Ok(a)) => classify::error_encoding_known(Some(a)),
                        Some(Err(_)) => None,
                    };
                    if let Some(how) = known {
                        let resp =
                            crate::server::body::error_as(crate::error::Error::BadRequest(message), how);
                        return self.recorder.refused(resp, &verb, "", arrived);
                    }
                }
            }
        }
        let ticket = match self.limits.admit() {
            Ok(t) => t,
            Err(resp) => return self.recorder.refused(resp, &verb, "", arrived),
        };
        // `authenticate` adds the caller's share to the ticket.
        req.extensions_mut().insert(ticket.clone());
        if starts_with_a_read {
            // Held while the watch starts (its read upstream, made as the proxy), let go when
            // its stream begins: a caller cannot have more such reads in the air than its
            // in-flight share, whatever its watch slots. Not for ever: a start that has not
            // begun streaming within twice `--request-timeout`, and not before a cache-served
            // start gives up its own read and proof (then it is forwarded), is answered 504.
            let own = crate::server::consistent::READ_TIMEOUT + crate::server::consistent::PROOF_WAIT;
            let deadline = tokio::time::Instant::now() + (self.limits.opts.request_timeout * 2).max(own);
            let started = tokio::time::timeout_at(deadline, pass(next, req)).await;
            ticket.release();
            return match started {
                Ok(resp) => resp,
                Err(_) => self.recorder.refused(limits::timed_out(), &verb, "", arrived),
            };
        }
        let deadline = tokio::time::Instant::now() + timeout;
        match tokio::time::timeout_at(deadline, pass(next, req)).await {
            // The ticket stays taken until the body has been sent (or the deadline, or the
            // client stopped taking it).
            // Not a forwarded one: its body holds an upstream connection's stream until sent,
            // which the permit bounds (a review).
            Ok(resp)
                if resp.extensions().get::<super::FromUpstream>().is_none()
                    && http_body::Body::size_hint(resp.body())
                        .exact()
                        .is_some_and(|n| n <= BUFFERED_ANSWER) =>
            {
                // Whole and small (an error Status, a small object): its permit is free now, as
                // the apiserver's in-flight seat is once its handler has returned, the answer in
                // Go's write buffer. Held until sent, a client opening its HTTP/2 streams with no
                // window (`SETTINGS_INITIAL_WINDOW_SIZE` 0) held one per refusal for the
                // write-stall timeout: ~40 requests a second without credentials, each a 401,
                // held them all (found by a review).
                ticket.release();
                resp
            }
            Ok(resp) => {
                let (stall, cuts) =
                    (self.limits.opts.write_stall_timeout, self.recorder.0.write_stall_cuts("response"));
                limits::InFlight::wrap(resp, ticket, deadline, stall, cuts)
            }
            Err(_) => self.recorder.refused(limits::timed_out(), &verb, "", arrived),
        }
    }
}

/// An answer this small and whole frees its permit once made: what Go's HTTP/2 and HTTP/1.1
/// response writers buffer (4 KiB) before a write waits for the client.
const BUFFERED_ANSWER: u64 = 4096;

/// The `timeout` query parameter as the apiserver's `parseTimeout` reads it: absent or empty is
/// none, zero or negative is none (the server's own), else Go's `time.ParseDuration` or the
/// 400's message.
fn user_timeout(query: Option<&str>) -> Result<Option<std::time::Duration>, String> {
    let Some(value) = query.and_then(|q| crate::params::query_value_bytes(q, "timeout")) else {
        return Ok(None);
    };
    if value.is_empty() {
        return Ok(None);
    }
    match crate::go_duration::parse(&value) {
        Ok(ns) => Ok(u64::try_from(ns).ok().filter(|ns| *ns > 0).map(std::time::Duration::from_nanos)),
        Err(e) => Err(format!("invalid timeout specified in the request URL - {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::limits::LimitOptions;
    use crate::server::phase::testing::{request, run_seen};
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn request_info_goes_on_and_the_limit_counts_only_what_is_not_long_running() {
        let limits = Arc::new(Limits::new(LimitOptions { max_in_flight: 1, ..Default::default() }));
        let s = Admit { limits, recorder: Recorder::default() };
        let (resp, seen) = run_seen(s.clone(), request("/api/v1/namespaces/a/pods?limit=5")).await;
        assert_eq!(resp.status(), 200);
        let info = seen.unwrap().get::<super::super::RequestContext>().and_then(|c| c.info.clone()).unwrap();
        assert_eq!(
            (info.verb.as_str(), info.resource.as_str(), info.namespace.as_str()),
            ("list", "pods", "a")
        );
        // The answer holds the one permit until its body is dropped: a second request is 429,
        // a watch from an RV is not counted; one whose RV is unset starts with a read upstream
        // and needs a permit to start.
        let (again, reached) = run_seen(s.clone(), request("/api/v1/pods")).await;
        assert_eq!(again.status(), 429);
        assert!(reached.is_none());
        let (watch, reached) = run_seen(s.clone(), request("/api/v1/pods?watch=1&resourceVersion=7")).await;
        assert_eq!(watch.status(), 200);
        assert!(reached.is_some());
        let (watch_list, reached) =
            run_seen(s.clone(), request("/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersion="))
                .await;
        assert_eq!(watch_list.status(), 429);
        assert!(reached.is_none());
        drop(resp);
        let (after, _) = run_seen(s.clone(), request("/api/v1/pods")).await;
        assert_eq!(after.status(), 200, "the permit came back with the body");
        drop(after);
        // A watch's start holds the permit only until its stream begins.
        let (watch_list, reached) =
            run_seen(s.clone(), request("/api/v1/pods?watch=1&sendInitialEvents=true")).await;
        assert_eq!(watch_list.status(), 200);
        assert!(reached.is_some());
        let (after, _) = run_seen(s, request("/api/v1/pods")).await;
        assert_eq!(after.status(), 200, "the streaming watch holds no permit");
        drop(watch_list);
    }

    /// The rest of the stack refusing: a 401 Status, whole and small.
    #[derive(Clone)]
    struct Refuses;

    impl crate::server::phase::Next<String> for Refuses {
        async fn run(&self, _req: Req<String>) -> Resp {
            crate::server::body::error_as(crate::error::Error::Unauthorized, classify::ErrorEncoding::Json)
        }
    }

    /// A whole answer of at most 4 KiB (a refusal) frees its permit once made, as the
    /// apiserver's seat is freed once its handler returned: a client that never takes it (an
    /// HTTP/2 stream with no window) holds none (a review: ~40 unauthenticated requests a
    /// second held every permit for the write-stall timeout). One of unknown length holds it,
    /// as does a forwarded one (its body holds an upstream stream).
    #[tokio::test]
    async fn a_small_whole_answer_frees_its_permit_before_it_is_sent() {
        let limits = Arc::new(Limits::new(LimitOptions { max_in_flight: 1, ..Default::default() }));
        let s = Admit { limits, recorder: Recorder::default() };
        let refused = s.call(request("/api/v1/pods"), &Refuses).await;
        assert_eq!(refused.status(), 401);
        // Not read, not dropped: the permit is free.
        let (next, _) = run_seen(s.clone(), request("/api/v1/pods")).await;
        assert_eq!(next.status(), 200);
        // That one (of unknown length) holds it.
        let (again, _) = run_seen(s.clone(), request("/api/v1/pods")).await;
        assert_eq!(again.status(), 429);
        drop((refused, next));
        // A small forwarded answer holds it too.
        let forwarded = s.call(request("/api/v1/pods"), &Forwards).await;
        assert_eq!(forwarded.status(), 200);
        let (again, _) = run_seen(s.clone(), request("/api/v1/pods")).await;
        assert_eq!(again.status(), 429, "held by the forwarded answer");
        drop(forwarded);
    }

    /// The rest of the stack forwarding: a small whole answer from the upstream.
    #[derive(Clone)]
    struct Forwards;

    impl crate::server::phase::Next<String> for Forwards {
        async fn run(&self, _req: Req<String>) -> Resp {
            let mut resp = http::Response::new(crate::server::body::full("{}"));
            resp.extensions_mut().insert(crate::server::phase::FromUpstream);
            resp
        }
    }

    /// The rest of the stack, never answering (an upstream read that hangs).
    #[derive(Clone)]
    struct Hangs;

    impl crate::server::phase::Next<String> for Hangs {
        async fn run(&self, _req: Req<String>) -> Resp {
            std::future::pending().await
        }
    }

    /// A watch's start that holds a permit (RV unset: it reads upstream first) does not hold it
    /// for ever when that read hangs: 504 after twice the request timeout, the permit back.
    #[tokio::test(start_paused = true)]
    async fn a_watch_start_that_hangs_gives_its_permit_back() {
        use std::time::Duration;
        let opts =
            LimitOptions { max_in_flight: 1, request_timeout: Duration::from_secs(60), ..Default::default() };
        let s = Admit { limits: Arc::new(Limits::new(opts)), recorder: Recorder::default() };
        let started = tokio::time::Instant::now();
        let resp = s.call(request("/api/v1/pods?watch=1&sendInitialEvents=true"), &Hangs).await;
        assert_eq!(resp.status(), 504);
        assert_eq!(started.elapsed(), Duration::from_secs(120));
        let (after, _) = run_seen(s, request("/api/v1/pods")).await;
        assert_eq!(after.status(), 200, "the permit came back");
    }

    /// `?timeout=` as the apiserver's `WithRequestDeadline` takes it: Go's duration, before the
    /// in-flight limit; shorter than `--request-timeout` it is the deadline; one Go cannot read
    /// is 400 with Go's text, unless the proxy cannot write that 400 as the apiserver would (a
    /// YAML client: forwarded); a watch's is not read.
    #[tokio::test(start_paused = true)]
    async fn the_timeout_parameter_is_the_apiservers() {
        use std::time::Duration;
        let opts =
            LimitOptions { max_in_flight: 1, request_timeout: Duration::from_secs(60), ..Default::default() };
        let s = Admit { limits: Arc::new(Limits::new(opts)), recorder: Recorder::default() };
        let (resp, reached) = run_seen(s.clone(), request("/api/v1/pods?timeout=abc&limit=1")).await;
        assert_eq!((resp.status().as_u16(), reached.is_some()), (400, false));
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            status["message"],
            r#"invalid timeout specified in the request URL - time: invalid duration "abc""#
        );
        assert_eq!(status["reason"], "BadRequest");
        let msg = |q: &str| {
            let s = s.clone();
            let q = q.to_owned();
            async move {
                let body = run_seen(s, request(&format!("/api/v1/pods?{q}"))).await.0.into_body();
                let v: serde_json::Value =
                    serde_json::from_slice(&body.collect().await.unwrap().to_bytes()).unwrap();
                v["message"].as_str().unwrap().to_owned()
            }
        };
        // The key as Go reads it, escaped or not.
        assert!(msg("t%69meout=abc").await.ends_with(r#"invalid duration "abc""#));
        assert_eq!(
            msg("timeout=5").await,
            r#"invalid timeout specified in the request URL - time: missing unit in duration "5""#
        );
        assert_eq!(
            msg("timeout=1%FFs").await,
            r#"invalid timeout specified in the request URL - time: unknown unit "\xffs" in duration "1\xffs""#
        );
        // The first value counts; empty, zero and negative are the server's own.
        for fine in
            ["timeout=&timeout=abc", "timeout=0", "timeout=-1s", "timeout=1s&timeout=abc", "timeout=1%ZZ"]
        {
            let (resp, reached) = run_seen(s.clone(), request(&format!("/api/v1/pods?{fine}"))).await;
            assert_eq!((resp.status().as_u16(), reached.is_some()), (200, true), "{fine}");
        }
        let mut yaml = request("/api/v1/pods?timeout=abc");
        yaml.headers_mut().insert(http::header::ACCEPT, http::HeaderValue::from_static("application/yaml"));
        assert!(run_seen(s.clone(), yaml).await.1.is_some(), "the apiserver's to answer in YAML");
        assert!(run_seen(s.clone(), request("/api/v1/pods?watch=1&resourceVersion=5&timeout=abc"))
            .await
            .1
            .is_some());
        // What the apiserver's deadline filter leaves alone (its long-running check): exec,
        // attach, port-forward, logs, proxy, /debug/pprof/.
        for alone in [
            "/api/v1/namespaces/a/pods/p/exec?command=ls&timeout=abc",
            "/api/v1/namespaces/a/pods/p/log?timeout=abc",
            "/debug/pprof/profile?seconds=1&timeout=abc",
        ] {
            assert!(run_seen(s.clone(), request(alone)).await.1.is_some(), "{alone}");
        }
        // An Accept past ASCII is still one the proxy can answer (as `classify` reads it).
        let mut utf8 = request("/api/v1/pods?timeout=abc");
        utf8.headers_mut().insert(
            http::header::ACCEPT,
            http::HeaderValue::from_bytes("application/json;x=é".as_bytes()).unwrap(),
        );
        assert_eq!(run_seen(s.clone(), utf8).await.0.status().as_u16(), 400);
        // A short one is the deadline; a long one is not.
        let started = tokio::time::Instant::now();
        assert_eq!(s.call(request("/api/v1/pods?timeout=1500ms"), &Hangs).await.status(), 504);
        assert_eq!(started.elapsed(), Duration::from_millis(1500));
        let started = tokio::time::Instant::now();
        assert_eq!(s.call(request("/api/v1/pods?timeout=2h"), &Hangs).await.status(), 504);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    /// Why admit is not tower's `ConcurrencyLimit` and `Timeout` (the README's claim, checked):
    /// both are done once the response *future* resolves, while a LIST's body is still being
    /// sent. A response whose body has not ended: tower's limit of 1 admits the next request
    /// at once, and tower's timeout lets the body run past it.
    #[tokio::test(start_paused = true)]
    async fn tower_limit_and_timeout_end_with_the_response_future_not_the_body() {
        use std::time::Duration;
        use tower::{Service, ServiceBuilder, ServiceExt};
        let (tx, rx) =
            tokio::sync::mpsc::channel::<Result<http_body::Frame<bytes::Bytes>, std::convert::Infallible>>(1);
        let rx = std::sync::Mutex::new(Some(rx));
        let mut svc = ServiceBuilder::new().concurrency_limit(1).timeout(Duration::from_millis(10)).service(
            tower::service_fn(move |_: ()| {
                let rx = rx.lock().unwrap().take();
                async move {
                    // A body that ends when `tx` says so (or at once for later requests).
                    let body = match rx {
                        Some(rx) => http_body_util::StreamBody::new(tokio_stream_of(rx)).boxed_unsync(),
                        None => http_body_util::Empty::new().map_err(|e| match e {}).boxed_unsync(),
                    };
                    Ok::<_, std::convert::Infallible>(http::Response::new(body))
                }
            }),
        );
        let first = svc.ready().await.unwrap().call(()).await.unwrap();
        // The first body is still open, and the limit of 1 already admits another request.
        let ready = tokio::time::timeout(Duration::from_millis(1), svc.ready()).await;
        assert!(ready.is_ok(), "tower's permit went back with the response future");
        // Past the timeout, the first body still runs: tower's timeout did not cut it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        tx.send(Ok(http_body::Frame::data(bytes::Bytes::from_static(b"late")))).await.unwrap();
        drop(tx);
        let body = http_body_util::BodyExt::collect(first.into_body()).await.unwrap().to_bytes();
        assert_eq!(&body[..], b"late");
    }

    /// An mpsc receiver as a stream of body frames.
    fn tokio_stream_of<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Send + 'static {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
