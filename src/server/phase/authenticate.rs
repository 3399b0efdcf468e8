//! Phase 5: authentication and impersonation (`auth`), or the trusted caller of `--auth=none`;
//! the `Caller` goes into the extensions, and a non-long-running request takes a slot of its
//! user's in-flight share (`--max-requests-inflight-per-user`; 429 past it). The proxy's own metrics (`/watchcache/metrics`) are
//! answered here, to callers allowed `get` on that non-resource URL, like the apiserver's.

use std::sync::Arc;

use super::{arrived, pass, Next, Phase, Req, Resp};
use crate::metrics::Served;
use crate::server::auth::Attributes;
use crate::server::health;
use crate::server::Server;

#[derive(Clone)]
pub struct Authenticate(pub Arc<Server>);

impl<B: Send + Sync + 'static> Phase<B> for Authenticate {
    async fn call<S: Next<B>>(&self, mut req: Req<B>, next: &S) -> Resp {
        let arrived = arrived(&req);
        let caller = match self.0.authenticate(&req).await {
            Ok(c) => c,
            Err(resp) => {
                self.0.record("reject", "", resp.status().as_u16(), Served::Proxy, arrived);
                return resp;
            }
        };
        if req.uri().path() == health::METRICS_PATH
            && (req.method() == http::Method::GET || req.method() == http::Method::HEAD)
        {
            if let Some(auth) = &self.0.auth {
                let a = Attributes {
                    verb: "get".into(),
                    path: Some(health::METRICS_PATH.into()),
                    ..Attributes::default()
                };
                if let Err(resp) = auth.authorize(&caller.effective, &a).await {
                    return resp;
                }
            }
            return health::metrics(&self.0);
        }
        if let Err(resp) = self.0.in_flight_share(&req, &caller) {
            self.0.record("reject", "", 429, Served::Proxy, arrived);
            return resp;
        }
        req.extensions_mut().insert(caller);
        pass(next, req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::auth::Caller;
    use crate::server::phase::testing::{request, run_seen, server};

    #[tokio::test]
    async fn the_caller_goes_on_and_metrics_are_answered_here() {
        let s = server(Default::default());
        let (_, seen) = run_seen(Authenticate(s.clone()), request("/api/v1/pods")).await;
        assert!(seen.unwrap().get::<Caller>().is_some(), "--auth=none: the trusted caller");
        let (resp, seen) = run_seen(Authenticate(s), request(health::METRICS_PATH)).await;
        assert!(seen.is_none());
        assert_eq!(resp.status(), 200);
        let body = crate::server::phase::testing::text(resp).await;
        assert!(body.contains("watchcache_"), "the proxy's own metrics");
    }
}
