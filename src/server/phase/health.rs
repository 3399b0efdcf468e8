//! Phase 2: `/healthz`, `/livez`, `/readyz` (and their per-check paths), answered here in the
//! apiserver's format; authentication only for their detail (`Server::health_access`).

use std::sync::Arc;

use super::{pass, Next, Phase, Req, Resp};
use crate::server::health;
use crate::server::Server;

#[derive(Clone)]
pub struct Health(pub Arc<Server>);

impl<B: Send + Sync + 'static> Phase<B> for Health {
    async fn call<S: Next<B>>(&self, req: Req<B>, next: &S) -> Resp {
        if let Some((endpoint, sub)) = health::route(req.uri().path()) {
            if req.method() == http::Method::GET || req.method() == http::Method::HEAD {
                let access = match self.0.health_access(&req, sub.is_some()).await {
                    Ok(a) => a,
                    Err(resp) => return resp,
                };
                return health::handle(&self.0, &req, endpoint, sub, access);
            }
        }
        pass(next, req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::phase::testing::{request, run, server};

    #[tokio::test]
    async fn health_paths_are_answered_here_the_rest_passes() {
        let s = server(Default::default());
        let (resp, reached) = run(Health(s.clone()), request("/livez")).await;
        assert_eq!(resp.status(), 200);
        assert!(!reached);
        let (resp, reached) = run(Health(s.clone()), request("/readyz?verbose")).await;
        assert!(!reached);
        // No cache is synced here, yet nothing blocks: the verbose answer lists the checks.
        let body = crate::server::phase::testing::text(resp).await;
        assert!(body.contains("[+]ping ok"), "{body}");
        let (_, reached) = run(Health(s), request("/api/v1/pods")).await;
        assert!(reached);
    }
}
