//! Phase 9: authorization of what is answered here — the cache's reads and the apiserver's own
//! refusals of bad requests (`auth`, the `RequestInfo`'s attributes, exactly as the
//! apiserver's `WithAuthorization` builds them), with `--auth=upstream`.
//! Forwarded requests are authorized by the upstream itself (impersonated or with the
//! caller's own credentials) and pass untouched.

use std::sync::Arc;

use super::{arrived, context, missing, pass, Classified, Next, Phase, Recorder, Req, Resp};
use crate::server::auth::{self, Attributes, Auth};
use crate::server::classify::RequestInfo;

#[derive(Clone)]
pub struct Authorize {
    /// None with `--auth=none`: nothing is authorized here.
    pub auth: Option<Arc<Auth>>,
    pub recorder: Recorder,
}

impl<B: Send + Sync + 'static> Phase<B> for Authorize {
    async fn call<S: Next<B>>(&self, req: Req<B>, next: &S) -> Resp {
        let Some(auth) = &self.auth else { return pass(next, req).await };
        // What is answered here: the cache's reads, and the apiserver's own refusals (it
        // authorizes before its handlers validate, so a caller without the right gets 403).
        // Only a decision to forward passes unasked; anything else without the caller and
        // its attributes is refused (issue 32 §2: fails closed if a phase did not run).
        let ctx = context(&req);
        let classified = ctx.and_then(|c| c.classified.as_ref());
        if matches!(classified, Some(Classified::Forward(_))) {
            return pass(next, req).await;
        }
        let (Some(ctx), Some(classified)) = (ctx, classified) else {
            return self.recorder.refused(
                missing(&req, "authorize", "decision"),
                "reject",
                "",
                arrived(&req),
            );
        };
        let (Some(caller), Some(info)) = (&ctx.caller, &ctx.info) else {
            return self.recorder.refused(missing(&req, "authorize", "caller"), "reject", "", arrived(&req));
        };
        if let Err(resp) = auth
            .authorize(
                &caller.effective,
                &attributes(info),
                crate::server::proxy::source(&req),
                &caller.user.name,
            )
            .await
        {
            return match classified {
                Classified::Cache { cr, catalog, key } => {
                    let gr =
                        catalog.caches.get(key).map(|(r, _)| r.kind().group_resource()).unwrap_or_default();
                    self.recorder.refused(resp, cr.plan.verb(), &gr, arrived(&req))
                }
                _ => self.recorder.refused(resp, &info.verb, &ctx.label, arrived(&req)),
            };
        }
        pass(next, req).await
    }
}

/// The authorization attributes of a request: its `RequestInfo`, exactly as the apiserver's
/// `WithAuthorization` filter builds them (`GetAuthorizerAttributes`), e.g. `GET
/// /api/v1/namespaces/X` is about namespace X *and* name X.
pub fn attributes(info: &RequestInfo) -> Attributes {
    if !info.is_resource_request {
        return Attributes {
            verb: info.verb.clone(),
            path: Some(info.path.clone()),
            ..Attributes::default()
        };
    }
    Attributes {
        verb: info.verb.clone(),
        group: info.api_group.clone(),
        version: info.api_version.clone(),
        resource: info.resource.clone(),
        subresource: info.subresource.clone(),
        namespace: info.namespace.clone(),
        name: info.name.clone(),
        path: None,
        field_selector: auth::selectors::field(&info.field_selector),
        label_selector: auth::selectors::label(&info.label_selector),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::phase::testing::{request, run, upstream};

    #[tokio::test]
    async fn without_auth_or_for_forwarded_requests_nothing_is_asked() {
        let s = Authorize { auth: None, recorder: Recorder::default() };
        let mut req = request("/api/v1/pods");
        super::super::context_mut(&mut req).classified =
            Some(Classified::Forward(crate::server::classify::ForwardReason::Write));
        let (_, reached) = run(s, req).await;
        assert!(reached);
    }

    /// Issue 32 §2: with authorization on, a request whose caller, attributes or decision are
    /// missing (a phase skipped or reordered) is refused, never passed on unasked.
    #[tokio::test]
    async fn a_request_missing_what_authorization_needs_is_refused() {
        use crate::server::classify::ForwardReason;
        let auth = Auth::new(upstream(), Default::default(), Default::default());
        let s = Authorize { auth: Some(Arc::new(auth)), recorder: Recorder::default() };
        let (resp, reached) = run(s.clone(), request("/api/v1/pods")).await;
        assert_eq!((resp.status().as_u16(), reached), (500, false), "nothing set");
        let mut req = request("/api/v1/pods");
        super::super::context_mut(&mut req).caller = Some(crate::server::auth::Caller::trusted());
        let (resp, reached) = run(s.clone(), req).await;
        assert_eq!((resp.status().as_u16(), reached), (500, false), "no attributes, no decision");
        // A decision to forward passes: the upstream authorizes it.
        let mut req = request("/api/v1/pods");
        super::super::context_mut(&mut req).classified = Some(Classified::Forward(ForwardReason::Write));
        let (_, reached) = run(s, req).await;
        assert!(reached);
    }
}
