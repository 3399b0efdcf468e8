//! Phase 7: authorization of what the cache serves (`auth`, the `RequestInfo`'s attributes,
//! exactly as the apiserver's `WithAuthorization` builds them), with `--auth=upstream`.
//! Forwarded requests are authorized by the upstream itself (impersonated or with the
//! caller's own credentials) and pass untouched.

use std::sync::Arc;

use super::{arrived, pass, Classified, Next, Phase, Req, Resp};
use crate::metrics::Served;
use crate::server::auth::Caller;
use crate::server::classify::RequestInfo;
use crate::server::{attributes, Server};

#[derive(Clone)]
pub struct Authorize(pub Arc<Server>);

impl<B: Send + Sync + 'static> Phase<B> for Authorize {
    async fn call<S: Next<B>>(&self, req: Req<B>, next: &S) -> Resp {
        let (Some(auth), Some(Classified::Cache { cr, catalog, key })) =
            (&self.0.auth, req.extensions().get::<Classified>())
        else {
            return pass(next, req).await;
        };
        let (Some(caller), Some(info)) =
            (req.extensions().get::<Caller>(), req.extensions().get::<RequestInfo>())
        else {
            return pass(next, req).await;
        };
        if let Err(resp) = auth.authorize(&caller.effective, &attributes(info)).await {
            let arrived = arrived(&req);
            let gr = catalog.caches.get(key).map(|(r, _)| r.kind().group_resource()).unwrap_or_default();
            self.0.record(cr.plan.verb(), &gr, resp.status().as_u16(), Served::Proxy, arrived);
            return resp;
        }
        pass(next, req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::phase::testing::{request, run, server};

    #[tokio::test]
    async fn without_auth_or_for_forwarded_requests_nothing_is_asked() {
        let s = server(Default::default());
        let mut req = request("/api/v1/pods");
        req.extensions_mut().insert(Classified::Forward(crate::server::classify::ForwardReason::Write));
        let (_, reached) = run(Authorize(s), req).await;
        assert!(reached);
    }
}
