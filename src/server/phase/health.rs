//! Phase 2: `/healthz`, `/livez`, `/readyz` (and their per-check paths), answered here in the
//! apiserver's format (`server::health`). They report on the server as a whole, so this phase
//! holds it; a caller is authenticated only for the detail: the root paths are public (probes
//! have no credentials), a caller is looked at only when it asks for `verbose`, and per-check
//! paths need `get` on the path (401 / 403).

use std::sync::Arc;

use super::{pass, Next, Phase, Req, Resp};
use crate::server::auth::Attributes;
use crate::server::health::{self, Access};
use crate::server::{proxy, Server};

#[derive(Clone)]
pub struct Health {
    pub server: Arc<Server>,
}

impl<B: Send + Sync + 'static> Phase<B> for Health {
    async fn call<S: Next<B>>(&self, req: Req<B>, next: &S) -> Resp {
        if let Some((endpoint, sub)) = health::route(req.uri().path()) {
            // A health path past the URL or header limits goes on to their phase (414 / 431):
            // never a 1 MiB path authenticated and put in a SubjectAccessReview.
            let sized = self.server.limits.check_sizes(&req).is_ok();
            if sized && (req.method() == http::Method::GET || req.method() == http::Method::HEAD) {
                let access = match access(&self.server, &req, sub.is_some()).await {
                    Ok(a) => a,
                    Err(resp) => return resp,
                };
                return health::handle(&self.server, &req, endpoint, sub, access);
            }
        }
        pass(next, req).await
    }
}

/// Who may see the detailed checks: everyone with `--auth=none`; else a caller allowed `get` on
/// the path. One that fails authentication or authorization gets the public checks at the
/// root paths, and its refusal at a per-check path.
// The `Err` is the refusal response itself, as in `limits`.
#[allow(clippy::result_large_err)]
async fn access<B>(server: &Server, req: &Req<B>, per_check: bool) -> Result<Access, Resp> {
    let Some(auth) = server.auth() else {
        return Ok(Access::Unsecured);
    };
    let verbose =
        req.uri().query().is_some_and(|q| form_urlencoded::parse(q.as_bytes()).any(|(k, _)| k == "verbose"));
    if !per_check && !verbose {
        return Ok(Access::Public);
    }
    let caller = match auth.authenticate(req, proxy::source(req)).await {
        Ok(c) => c,
        Err(resp) if per_check => return Err(resp),
        Err(_) => return Ok(Access::Public),
    };
    let a =
        Attributes { verb: "get".into(), path: Some(req.uri().path().to_owned()), ..Attributes::default() };
    match auth.authorize(&caller.effective, &a, proxy::source(req), &caller.user.name).await {
        Ok(()) => Ok(Access::Detailed),
        Err(resp) if per_check => Err(resp),
        Err(_) => Ok(Access::Public),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::phase::testing::{request, run, server};

    #[tokio::test]
    async fn health_paths_are_answered_here_the_rest_passes() {
        let s = server(Default::default());
        let (resp, reached) = run(Health { server: s.clone() }, request("/livez")).await;
        assert_eq!(resp.status(), 200);
        assert!(!reached);
        let (resp, reached) = run(Health { server: s.clone() }, request("/readyz?verbose")).await;
        assert!(!reached);
        // No cache is synced here, yet nothing blocks: the verbose answer lists the checks.
        let body = crate::server::phase::testing::text(resp).await;
        assert!(body.contains("[+]ping ok"), "{body}");
        let (_, reached) = run(Health { server: s.clone() }, request("/api/v1/pods")).await;
        assert!(reached);
        // Past the URL limit (16 KiB): for the size limits' phase, not answered here.
        let long = format!("/readyz/{}", "x".repeat(20 << 10));
        let (_, reached) = run(Health { server: s.clone() }, request(&long)).await;
        assert!(reached, "a health path past the URL limit goes on to its 414");
        let (resp, reached) =
            run(Health { server: s }, request(&format!("/readyz/{}", "x".repeat(100)))).await;
        assert!(!reached && resp.status() != 414);
    }
}
