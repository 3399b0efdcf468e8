//! Phase 7: authorization of what is answered here — the cache's reads and the apiserver's own
//! refusals of bad requests (`auth`, the `RequestInfo`'s attributes, exactly as the
//! apiserver's `WithAuthorization` builds them), with `--auth=upstream`.
//! Forwarded requests are authorized by the upstream itself (impersonated or with the
//! caller's own credentials) and pass untouched.

use std::sync::Arc;

use super::{arrived, pass, Classified, Next, Phase, Req, ResourceLabel, Resp};
use crate::metrics::Served;
use crate::server::auth::Caller;
use crate::server::classify::RequestInfo;
use crate::server::{attributes, Server};

#[derive(Clone)]
pub struct Authorize(pub Arc<Server>);

impl<B: Send + Sync + 'static> Phase<B> for Authorize {
    async fn call<S: Next<B>>(&self, req: Req<B>, next: &S) -> Resp {
        let Some(auth) = &self.0.auth else { return pass(next, req).await };
        let (Some(caller), Some(info)) =
            (req.extensions().get::<Caller>(), req.extensions().get::<RequestInfo>())
        else {
            return pass(next, req).await;
        };
        // What is answered here: the cache's reads, and the apiserver's own refusals (it
        // authorizes before its handlers validate, so a caller without the right gets 403).
        let classified = req.extensions().get::<Classified>();
        if !matches!(classified, Some(Classified::Cache { .. } | Classified::Refuse { .. })) {
            return pass(next, req).await;
        }
        if let Err(resp) = auth.authorize(&caller.effective, &attributes(info)).await {
            let code = resp.status().as_u16();
            match classified {
                Some(Classified::Cache { cr, catalog, key }) => {
                    let gr =
                        catalog.caches.get(key).map(|(r, _)| r.kind().group_resource()).unwrap_or_default();
                    self.0.record(cr.plan.verb(), &gr, code, Served::Proxy, arrived(&req));
                }
                _ => {
                    let label = req.extensions().get::<ResourceLabel>().map(|l| l.0.as_str()).unwrap_or("");
                    self.0.record(&info.verb, label, code, Served::Proxy, arrived(&req));
                }
            }
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
