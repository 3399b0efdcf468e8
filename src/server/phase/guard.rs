//! Phase 1: refusals before anything else: a `Transfer-Encoding` the apiserver does not take,
//! and with `--auth=none` the loopback guard (Host, path, method, Origin). Stamps the request
//! with [`Arrived`] for every later phase's metrics.

use std::sync::Arc;

use super::{pass, Arrived, Next, Phase, Recorder, Req, Resp};
use crate::server::limits;
use crate::server::loopback::LoopbackGuard;

#[derive(Clone)]
pub struct Guard {
    /// `--auth=none`'s filters; none otherwise.
    pub loopback: Option<Arc<LoopbackGuard>>,
    pub recorder: Recorder,
}

impl<B: Send + Sync + 'static> Phase<B> for Guard {
    async fn call<S: Next<B>>(&self, mut req: Req<B>, next: &S) -> Resp {
        let arrived = tokio::time::Instant::now();
        req.extensions_mut().insert(Arrived(arrived));
        if let Some(resp) = limits::unsupported_transfer_encoding(&req) {
            return self.recorder.refused(resp, "reject", "", arrived);
        }
        if let Some(guard) = &self.loopback {
            if let Err(resp) = guard.check(&req) {
                return self.recorder.refused(resp, "reject", "", arrived);
            }
        }
        pass(next, req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::phase::testing::{request, run};

    #[tokio::test]
    async fn chunked_and_gzip_bodies_are_refused_before_the_rest() {
        let g = Guard { loopback: None, recorder: Recorder::default() };
        let mut req = request("/api/v1/pods");
        req.headers_mut().insert("transfer-encoding", "gzip, chunked".parse().unwrap());
        let (resp, reached) = run(g.clone(), req).await;
        assert_eq!(resp.status(), 501, "the apiserver's answer to a coding it does not take");
        assert!(!reached);
        let (resp, reached) = run(g, request("/api/v1/pods")).await;
        assert_eq!(resp.status(), 200);
        assert!(reached, "the rest of the stack is called, with Arrived set");
    }
}
