//! Phase 7: authentication and impersonation (`auth`), or the trusted caller of `--auth=none`;
//! the `Caller` goes into the extensions, and a non-long-running request takes a slot of its
//! user's in-flight share (`--max-requests-inflight-per-user`; 429 past it). The proxy's own
//! metrics (`/watchcache/metrics`) are answered here, to callers allowed `get` on that
//! non-resource URL, like the apiserver's.

use std::sync::Arc;

use super::{arrived, context_mut, pass, Next, Phase, Recorder, Req, Resp};
use crate::server::auth::{Attributes, Auth, Caller};
use crate::server::limits::{Limits, Ticket};
use crate::server::{health, proxy};

/// Renders the proxy's own metrics page.
pub type MetricsPage = Arc<dyn Fn() -> Resp + Send + Sync>;

#[derive(Clone)]
pub struct Authenticate {
    /// None with `--auth=none`: every caller is trusted, and has no in-flight share.
    pub auth: Option<Arc<Auth>>,
    pub limits: Arc<Limits>,
    pub metrics_page: MetricsPage,
    pub recorder: Recorder,
}

impl<B: Send + Sync + 'static> Phase<B> for Authenticate {
    async fn call<S: Next<B>>(&self, mut req: Req<B>, next: &S) -> Resp {
        let arrived = arrived(&req);
        // The request's attributes, which constrained impersonation's modes are asked on: made
        // only for a request that impersonates (not on every request's path).
        let impersonating = req.headers().keys().any(|k| k.as_str().starts_with("impersonate-"));
        let request = super::context(&req)
            .and_then(|c| c.info.as_ref())
            .filter(|_| impersonating)
            .map(super::authorize::attributes);
        let caller = match &self.auth {
            None => Caller::trusted(),
            Some(auth) => {
                let c = match auth.authenticate(&req, proxy::source(&req)).await {
                    Ok(c) => c,
                    Err(resp) => return self.recorder.refused(resp, "reject", "", arrived),
                };
                // The share of who authenticated, taken before impersonation's reviews: a
                // user's requests waiting on those reviews (one per distinct `Impersonate-User`,
                // coalesced) held every permit past its share (found by a review), and one
                // allowed to impersonate could spread its requests over the shares of the users
                // it names.
                if let Some(resp) = self.share(&req, &c.user.name) {
                    return self.recorder.refused(resp, "reject", "", arrived);
                }
                match auth.impersonate(c, req.headers(), request.as_ref(), proxy::source(&req)).await {
                    Ok(c) => c,
                    Err(resp) => return self.recorder.refused(resp, "reject", "", arrived),
                }
            }
        };
        if req.uri().path() == health::METRICS_PATH
            && (req.method() == http::Method::GET || req.method() == http::Method::HEAD)
        {
            if let Some(auth) = &self.auth {
                let a = Attributes {
                    verb: "get".into(),
                    path: Some(health::METRICS_PATH.into()),
                    ..Attributes::default()
                };
                if let Err(resp) =
                    auth.authorize(&caller.effective, &a, proxy::source(&req), &caller.user.name).await
                {
                    return resp;
                }
            }
            return (self.metrics_page)();
        }
        context_mut(&mut req).caller = Some(caller);
        pass(next, req).await
    }
}

impl Authenticate {
    /// A slot of `user`'s share on the ticket `admit` took (what is not long-running has one),
    /// or the refusal. Per-user limits need users: none with `--auth=none` (never called then).
    fn share<B>(&self, req: &Req<B>, user: &str) -> Option<Resp> {
        let ticket = req.extensions().get::<Ticket>()?;
        // A watch's start (`admit`): per user and client address, as its watch slot.
        let watch = super::context(req).and_then(|c| c.info.as_ref()).is_some_and(|i| i.verb == "watch");
        let shared = if watch {
            let source = req.extensions().get::<proxy::PeerAddr>().map(|p| p.0.ip());
            self.limits.share_start(ticket, user, source)
        } else {
            self.limits.share(ticket, user)
        };
        shared.err()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::server::phase::testing::{request, run_seen, text};

    #[tokio::test]
    async fn the_caller_goes_on_and_metrics_are_answered_here() {
        let metrics = Arc::new(Metrics::new());
        let m = metrics.clone();
        let a = Authenticate {
            auth: None,
            limits: Arc::new(Limits::new(Default::default())),
            metrics_page: Arc::new(move || http::Response::new(crate::server::body::full(m.render()))),
            recorder: Recorder(metrics),
        };
        let (_, seen) = run_seen(a.clone(), request("/api/v1/pods")).await;
        let ctx = seen.unwrap().get::<super::super::RequestContext>().cloned().unwrap();
        assert_eq!(
            ctx.caller.map(|c| c.user.name.clone()).as_deref(),
            Some("system:unsecured"),
            "--auth=none: the trusted caller"
        );
        let (resp, seen) = run_seen(a, request(health::METRICS_PATH)).await;
        assert!(seen.is_none());
        assert_eq!(resp.status(), 200);
        assert!(text(resp).await.contains("watchcache_"), "the proxy's own metrics");
    }
}
