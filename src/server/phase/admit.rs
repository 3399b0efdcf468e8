//! Phase 4: the request's `RequestInfo` (into the extensions), then the in-flight limit and the
//! request timeout for what is not long-running. Before authentication, as in the apiserver's
//! handler chain (`WithMaxInFlightLimit` is outside `WithAuthentication`): whether a request is
//! long-running needs its `RequestInfo` only, and unauthenticated callers must not be able to
//! make the proxy send unbounded TokenReviews.
//!
//! Hand-written rather than tower's `ConcurrencyLimit` / `Timeout`: the permit is held until
//! the response *body* has been sent (`limits::InFlight`), not until the response future
//! resolves, and the refusal is the apiserver's 429 Status with `Retry-After`, not a pending
//! `poll_ready`; the timeout is the apiserver's 504 Status.

use std::sync::Arc;

use super::{arrived, pass, Next, Phase, Req, Resp};
use crate::metrics::Served;
use crate::server::classify;
use crate::server::limits;
use crate::server::Server;

#[derive(Clone)]
pub struct Admit(pub Arc<Server>);

impl<B: Send + Sync + 'static> Phase<B> for Admit {
    async fn call<S: Next<B>>(&self, mut req: Req<B>, next: &S) -> Resp {
        let arrived = arrived(&req);
        let info = classify::request_info(req.method(), req.uri().path(), req.uri().query());
        let long_running = classify::is_long_running(&info, req.uri().query());
        let verb = info.verb.clone();
        req.extensions_mut().insert(info);
        if long_running {
            return pass(next, req).await;
        }
        let permit = match self.0.limits.admit() {
            Ok(p) => p,
            Err(resp) => {
                self.0.record(&verb, "", 429, Served::Proxy, arrived);
                return resp;
            }
        };
        let deadline = tokio::time::Instant::now() + self.0.limits.opts.request_timeout;
        match tokio::time::timeout_at(deadline, pass(next, req)).await {
            // The permit stays taken until the body has been sent (or the deadline).
            Ok(resp) => limits::InFlight::wrap(resp, permit, deadline),
            Err(_) => {
                self.0.record(&verb, "", 504, Served::Proxy, arrived);
                limits::timed_out()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::classify::RequestInfo;
    use crate::server::phase::testing::{request, run_seen, server};
    use crate::server::Security;

    #[tokio::test]
    async fn request_info_goes_on_and_the_limit_counts_only_what_is_not_long_running() {
        let mut security = Security::default();
        security.limits.max_in_flight = 1;
        let s = server(security);
        let (resp, seen) = run_seen(Admit(s.clone()), request("/api/v1/namespaces/a/pods?limit=5")).await;
        assert_eq!(resp.status(), 200);
        let info = seen.unwrap().get::<RequestInfo>().cloned().unwrap();
        assert_eq!(
            (info.verb.as_str(), info.resource.as_str(), info.namespace.as_str()),
            ("list", "pods", "a")
        );
        // The answer holds the one permit until its body is dropped: a second request is 429,
        // a watch is not counted.
        let (again, reached) = run_seen(Admit(s.clone()), request("/api/v1/pods")).await;
        assert_eq!(again.status(), 429);
        assert!(reached.is_none());
        let (watch, reached) = run_seen(Admit(s.clone()), request("/api/v1/pods?watch=1")).await;
        assert_eq!(watch.status(), 200);
        assert!(reached.is_some());
        drop(resp);
        let (after, _) = run_seen(Admit(s), request("/api/v1/pods")).await;
        assert_eq!(after.status(), 200, "the permit came back with the body");
    }
}
