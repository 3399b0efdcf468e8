//! Phase 3: URL and header sizes (`--max-url-bytes`, `--max-header-bytes`): the apiserver's
//! 414 / 431 before anything is parsed further.

use std::sync::Arc;

use super::{arrived, pass, Next, Phase, Recorder, Req, Resp};
use crate::server::limits::Limits;

#[derive(Clone)]
pub struct Sizes {
    pub limits: Arc<Limits>,
    pub recorder: Recorder,
}

impl<B: Send + Sync + 'static> Phase<B> for Sizes {
    async fn call<S: Next<B>>(&self, req: Req<B>, next: &S) -> Resp {
        if let Err(resp) = self.limits.check_sizes(&req) {
            return self.recorder.refused(resp, "reject", "", arrived(&req));
        }
        pass(next, req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::limits::LimitOptions;
    use crate::server::phase::testing::{request, run};

    #[tokio::test]
    async fn an_overlong_url_is_refused_here() {
        let limits = Arc::new(Limits::new(LimitOptions { max_url_bytes: 64, ..Default::default() }));
        let s = Sizes { limits, recorder: Recorder::default() };
        let (resp, reached) = run(s.clone(), request(&format!("/api/v1/pods?x={}", "a".repeat(100)))).await;
        assert_eq!(resp.status(), 414);
        assert!(!reached);
        let (_, reached) = run(s, request("/api/v1/pods")).await;
        assert!(reached);
    }
}
