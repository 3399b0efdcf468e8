//! Phase 11, the end of the stack: serve from the cache (`serve`) or forward upstream (`proxy`,
//! with the caller's identity, or the proxy's own with `--auth=none`), or answer the
//! apiserver's own refusal, as classification said.
//! What the cache served is marked [`FromCache`] for compression, what the upstream answered
//! [`FromUpstream`] (left as it is by `pretty`); every answer is counted.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;

use super::{
    arrived, missing, Classified, FromCache, FromUpstream, Next, Recorder, Req, RequestContext, Resp,
};
use crate::metrics::Served;
use crate::server::auth::{Caller, Credential};
use crate::server::body;
use crate::server::classify::{self, ForwardReason, RequestInfo};
use crate::server::limits;
use crate::server::proxy::{self, TrustedHeaders};
use crate::server::serve::{self, ServeOptions};
use crate::upstream::Upstream;

#[derive(Clone)]
pub struct Dispatch {
    pub upstream: Upstream,
    pub serve: Arc<ServeOptions>,
    /// Request-header authentication headers dropped from what is forwarded.
    pub trusted_headers: Arc<TrustedHeaders>,
    /// A long-running answer (a watch, served or forwarded; a followed log) its caller took
    /// nothing of for this long is cut (`--write-stall-timeout`; zero: never).
    pub write_stall_timeout: Duration,
    pub recorder: Recorder,
}

impl Next<Incoming> for Dispatch {
    fn run(&self, req: Req<Incoming>) -> impl Future<Output = Resp> + Send {
        // Boxed: serving and forwarding make a large future, and every phase before this one
        // would otherwise move it once more as it is built (measured: ~10 % of the proxy's CPU
        // on cached GETs went to those copies).
        let me = self.clone();
        Box::pin(async move { me.dispatch(req).await })
    }
}

/// What a forwarded request is counted as.
#[derive(Clone, Copy)]
struct Forwarded<'a> {
    verb: &'a str,
    resource: &'a str,
    arrived: tokio::time::Instant,
    /// A watch, a followed log, a proxy: no deadline of the proxy's own.
    long_running: bool,
}

/// What the earlier phases learned and dispatch needs, taken out of the request. Fails closed
/// (issue 32 §2): a request that reaches here without a `Caller` (authenticate did not run) or
/// without a decision (classify did not run) is answered 500 and logged, never forwarded with
/// the proxy's own credentials or served unauthorized.
#[allow(clippy::result_large_err)]
fn context<B>(req: &mut Req<B>) -> Result<(Caller, RequestInfo, String, Classified), Resp> {
    let ctx = req.extensions_mut().remove::<RequestContext>().unwrap_or_default();
    let Some(caller) = ctx.caller else { return Err(missing(req, "dispatch", "caller")) };
    let Some(classified) = ctx.classified else { return Err(missing(req, "dispatch", "decision")) };
    Ok((caller, ctx.info.unwrap_or_default(), ctx.label, classified))
}

impl Dispatch {
    async fn dispatch(&self, mut req: Req<Incoming>) -> Resp {
        let arrived = arrived(&req);
        let (caller, info, label, classified) = match context(&mut req) {
            Ok(c) => c,
            Err(resp) => {
                return self.recorder.refused(resp, "reject", "", arrived);
            }
        };
        let long_running = classify::is_long_running(&info);
        match classified {
            Classified::Forward(reason) => {
                let fwd = Forwarded { verb: &info.verb, resource: &label, arrived, long_running };
                self.forward(req, reason, &caller, fwd).await
            }
            Classified::Refuse { error, encoding } => {
                self.recorder.refused(body::error_ref_as(&error, encoding), &info.verb, &label, arrived)
            }
            Classified::Cache { cr, catalog, key } => {
                let Some((reader, prober)) = catalog.caches.get(&key) else {
                    let fwd = Forwarded { verb: &info.verb, resource: &label, arrived, long_running };
                    return self.forward(req, ForwardReason::NotCached, &caller, fwd).await;
                };
                let gr = reader.kind().group_resource();
                let verb = cr.plan.verb();
                let user = match caller.credential {
                    Credential::Trusted => None,
                    _ => Some(Arc::from(caller.user.name.as_str())),
                };
                let src = serve::Source { reader, prober, metrics: &self.recorder.0, user };
                match serve::serve(&cr, src, &self.serve, arrived).await {
                    serve::Outcome::Response(mut resp) => {
                        self.recorder.record(verb, &gr, resp.status().as_u16(), Served::Cache, arrived);
                        if verb == "watch" && resp.status() == http::StatusCode::OK {
                            // What an unread cached watch holds (a watch-list's snapshot, a
                            // replay's step, a full queue of frames) goes at the stall cut too.
                            resp = stall_cut(
                                resp,
                                self.write_stall_timeout,
                                self.recorder.0.write_stall_cuts("watch"),
                            );
                        }
                        if cr.repr.is_lean() {
                            self.recorder.0.drop_managed_fields(&gr, true);
                        }
                        resp.extensions_mut().insert(FromCache);
                        resp
                    }
                    serve::Outcome::Forward(reason) => {
                        let fwd = Forwarded { verb, resource: &gr, arrived, long_running };
                        self.forward(req, reason, &caller, fwd).await
                    }
                }
            }
        }
    }

    /// Sends the request upstream with the caller's identity (`proxy::forward`) and counts it.
    async fn forward(
        &self,
        req: Req<Incoming>,
        reason: ForwardReason,
        caller: &Caller,
        f: Forwarded<'_>,
    ) -> Resp {
        self.recorder.0.forwarded(reason.as_str());
        let accept = req.headers().get(http::header::ACCEPT).and_then(|v| v.to_str().ok());
        if req.method() == http::Method::GET && classify::asks_to_drop_managed_fields(accept) {
            self.recorder.0.drop_managed_fields(f.resource, false);
        }
        tracing::debug!(method = %req.method(), path = %req.uri().path(), reason = reason.as_str(), "forward upstream");
        let mut resp = proxy::forward(&self.upstream, req, caller, &self.trusted_headers).await;
        if f.long_running && resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
            resp = stall_cut(resp, self.write_stall_timeout, self.recorder.0.write_stall_cuts("watch"));
        }
        resp.extensions_mut().insert(FromUpstream);
        self.recorder.record(
            f.verb,
            f.resource,
            resp.status().as_u16(),
            Served::Upstream(reason.as_str()),
            f.arrived,
        );
        resp
    }
}

/// A long-running answer is cut once its caller has taken nothing of it for `stall`, and what
/// it holds let go. Forwarded: what the upstream sends it waits in the proxy's connection to
/// the upstream (up to a stream's window, 1 MiB) while the caller does not read — 1 000 watches
/// of a caller that never reads would hold a gigabyte. Served from the cache: a watch-list's
/// snapshot of the store (which keeps every version the store replaced since), a replay's step,
/// and the queue of a watcher the cache closed for being too slow (1 000 frames, kept past the
/// history's) — all of it until the connection ended, as hyper polls a body only when it can
/// send. The upstream's watch, and the cache's slow-watcher cut, end a watch that cannot keep up
/// too; the client watches again from its last resourceVersion. A watch with nothing to send
/// is never cut (it waits for its source, not for the caller).
fn stall_cut(resp: Resp, stall: Duration, cuts: prometheus::IntCounter) -> Resp {
    if stall.is_zero() {
        return resp;
    }
    // No deadline of the proxy's own: the upstream (or the cache) ends the watch at its timeout.
    limits::InFlight::stall_only(resp, stall, cuts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::phase::testing::request;

    /// Issue 32 §2: nothing defaults to trust. Without a caller, or without a decision, the
    /// request is refused with 500; with both, they come out as the earlier phases left them.
    #[test]
    fn a_request_without_a_caller_or_a_decision_is_refused() {
        let forward = || Classified::Forward(ForwardReason::Write);
        let mut req = request("/api/v1/pods");
        super::super::context_mut(&mut req).classified = Some(forward());
        assert_eq!(context(&mut req).err().map(|r| r.status().as_u16()), Some(500), "no caller");
        let mut req = request("/api/v1/pods");
        super::super::context_mut(&mut req).caller = Some(Caller::trusted());
        assert_eq!(context(&mut req).err().map(|r| r.status().as_u16()), Some(500), "no decision");
        let mut req = request("/api/v1/pods");
        super::super::context_mut(&mut req).caller = Some(Caller::trusted());
        super::super::context_mut(&mut req).classified = Some(forward());
        let Ok((caller, _, _, classified)) = context(&mut req) else { panic!("complete") };
        assert_eq!(caller.user.name, "system:unsecured");
        assert!(matches!(classified, Classified::Forward(ForwardReason::Write)));
    }

    /// An upstream answer whose frames the test sends.
    fn streaming() -> (tokio::sync::mpsc::Sender<bytes::Bytes>, Resp) {
        use http_body_util::BodyExt;
        let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(4);
        let frames = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, body::BoxError>(hyper::body::Frame::data(b)), rx))
        });
        (tx, http::Response::new(http_body_util::StreamBody::new(frames).boxed_unsync()))
    }

    /// A forwarded watch whose caller stopped taking it (hyper never polls the body again:
    /// HTTP/2 with no window) is let go at the write-stall timeout — the upstream's stream with
    /// it — while one that waits for its upstream is never cut.
    #[tokio::test(start_paused = true)]
    async fn a_forwarded_watch_nobody_reads_is_let_go_at_the_write_stall_timeout() {
        use http_body_util::BodyExt;
        let (tx, upstream) = streaming();
        let counted = prometheus::IntCounter::new("cuts", "write-stall cuts").unwrap();
        let mut cut = stall_cut(upstream, Duration::from_secs(10), counted.clone()).into_body();
        // An idle watch: the body waits for its upstream, for as long as it takes.
        assert!(futures_util::FutureExt::now_or_never(cut.frame()).is_none());
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!tx.is_closed(), "an idle watch is not cut");
        tx.send(bytes::Bytes::from_static(b"{\"type\":\"ADDED\"}\n")).await.unwrap();
        assert!(cut.frame().await.unwrap().is_ok());
        // The caller takes nothing more.
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(!tx.is_closed());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(tx.is_closed(), "the upstream's stream let go, the body never polled");
        assert_eq!(counted.get(), 1, "counted once");
        assert!(cut.frame().await.unwrap().is_err(), "cut, not ended");
        // Zero: never cut.
        let (tx, upstream) = streaming();
        let mut kept = stall_cut(upstream, Duration::ZERO, counted.clone()).into_body();
        tx.send(bytes::Bytes::from_static(b"x")).await.unwrap();
        assert!(kept.frame().await.unwrap().is_ok());
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!tx.is_closed());
        assert_eq!(counted.get(), 1, "never cut, never counted");
    }
}
