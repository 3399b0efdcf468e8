//! Phase 5: gzip of large answers the cache served (`server::gzip`, as the apiserver
//! compresses its own); forwarded answers keep the upstream's encoding. Inside `admit`: a gzip
//! encoder holds ~¼ MiB of state from its first byte, and what `admit`'s in-flight guard lets
//! go at a write-stall cut or the deadline (a client that never reads: hyper keeps the body
//! until the connection ends) must include it; outside `pretty`, so that an indented answer is
//! what is compressed.

use super::{pass, FromCache, Next, Phase, Req, Resp};
use crate::server::gzip;

#[derive(Clone)]
pub struct Compress;

impl<B: Send + Sync + 'static> Phase<B> for Compress {
    async fn call<S: Next<B>>(&self, req: Req<B>, next: &S) -> Resp {
        let accepted = req.headers().get(http::header::ACCEPT_ENCODING).cloned();
        let resp = pass(next, req).await;
        match accepted {
            Some(v) if resp.extensions().get::<FromCache>().is_some() => {
                let mut headers = http::HeaderMap::new();
                headers.insert(http::header::ACCEPT_ENCODING, v);
                gzip::maybe_compress(&headers, resp)
            }
            _ => resp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::phase::testing::{request, run};

    #[tokio::test]
    async fn only_what_the_cache_served_is_compressed() {
        // The stub's small answer is not marked FromCache: untouched whatever is accepted.
        let mut req = request("/api/v1/pods");
        req.headers_mut().insert("accept-encoding", "gzip".parse().unwrap());
        let (resp, reached) = run(Compress, req).await;
        assert!(reached);
        assert!(resp.headers().get("content-encoding").is_none());
    }
}
