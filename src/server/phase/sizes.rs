//! Phase 3: URL and header sizes (`--max-url-bytes`, `--max-header-bytes`): the apiserver's
//! 414 / 431 before anything is parsed further.

use std::sync::Arc;

use super::{arrived, pass, Next, Phase, Req, Resp};
use crate::metrics::Served;
use crate::server::Server;

#[derive(Clone)]
pub struct Sizes(pub Arc<Server>);

impl<B: Send + Sync + 'static> Phase<B> for Sizes {
    async fn call<S: Next<B>>(&self, req: Req<B>, next: &S) -> Resp {
        if let Err(resp) = self.0.limits.check_sizes(&req) {
            let arrived = arrived(&req);
            self.0.record("reject", "", resp.status().as_u16(), Served::Proxy, arrived);
            return resp;
        }
        pass(next, req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::phase::testing::{request, run, server};
    use crate::server::Security;

    #[tokio::test]
    async fn an_overlong_url_is_refused_here() {
        let mut security = Security::default();
        security.limits.max_url_bytes = 64;
        let s = server(security);
        let (resp, reached) =
            run(Sizes(s.clone()), request(&format!("/api/v1/pods?x={}", "a".repeat(100)))).await;
        assert_eq!(resp.status(), 414);
        assert!(!reached);
        let (_, reached) = run(Sizes(s), request("/api/v1/pods")).await;
        assert!(reached);
    }
}
