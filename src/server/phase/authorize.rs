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
        // What is answered here: the cache's reads, and the apiserver's own refusals (it
        // authorizes before its handlers validate, so a caller without the right gets 403).
        // Only a decision to forward passes unasked; anything else without the caller and
        // its attributes is refused (issue 32 §2: fails closed if a phase did not run).
        let classified = req.extensions().get::<Classified>();
        if matches!(classified, Some(Classified::Forward(_))) {
            return pass(next, req).await;
        }
        let (Some(caller), Some(info), Some(_)) =
            (req.extensions().get::<Caller>(), req.extensions().get::<RequestInfo>(), classified)
        else {
            tracing::error!(path = %req.uri().path(), "request reached authorization without its caller, attributes or decision; refused");
            let resp = crate::server::body::error(crate::error::Error::Internal(
                "the request path is missing what authorization needs".into(),
            ));
            self.0.record("reject", "", 500, Served::Proxy, arrived(&req));
            return resp;
        };
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

    /// Issue 32 §2: with authorization on, a request whose caller, attributes or decision are
    /// missing (a phase skipped or reordered) is refused, never passed on unasked.
    #[tokio::test]
    async fn a_request_missing_what_authorization_needs_is_refused() {
        use crate::server::classify::ForwardReason;
        let upstream = crate::upstream::Upstream::new(&crate::upstream::UpstreamOptions {
            upstream: Some("http://127.0.0.1:9".into()),
            ..Default::default()
        })
        .unwrap();
        let auth = crate::server::auth::Auth::new(upstream, Default::default(), Default::default());
        let s = server(crate::server::Security { auth: Some(auth), ..Default::default() });
        let (resp, reached) = run(Authorize(s.clone()), request("/api/v1/pods")).await;
        assert_eq!((resp.status().as_u16(), reached), (500, false), "nothing set");
        let mut req = request("/api/v1/pods");
        req.extensions_mut().insert(Caller::trusted());
        let (resp, reached) = run(Authorize(s.clone()), req).await;
        assert_eq!((resp.status().as_u16(), reached), (500, false), "no attributes, no decision");
        // A decision to forward passes: the upstream authorizes it.
        let mut req = request("/api/v1/pods");
        req.extensions_mut().insert(Classified::Forward(ForwardReason::Write));
        let (_, reached) = run(Authorize(s), req).await;
        assert!(reached);
    }
}
