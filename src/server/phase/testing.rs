//! Test helpers for the phases: an upstream nobody listens on (and a `Server` with no caches,
//! for the health phase, which reports on one), a synced configmaps cache, requests with a
//! `String` body, and a stub for the rest of the stack that says whether it
//! was reached and what the earlier phases left in the extensions.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::{Request, Response};

use super::{Next, Phase, Req, Resp};
use crate::metrics::Metrics;
use crate::server::{body, Security, Server};
use crate::upstream::{Upstream, UpstreamOptions};

/// A whole server (the health phase reports on one).
pub fn server(security: Security) -> Arc<Server> {
    let (_tx, rx) = tokio::sync::watch::channel(false);
    Arc::new(Server::new(Vec::new(), upstream(), Default::default(), Arc::new(Metrics::new()), rx, security))
}

/// An upstream client nobody answers for.
pub fn upstream() -> Upstream {
    let opts = UpstreamOptions { upstream: Some("http://127.0.0.1:9".into()), ..Default::default() };
    Upstream::new(&opts).unwrap()
}

/// A synced, empty configmaps cache (its writer must live as long as the test).
pub fn configmaps() -> (crate::cache::Writer, crate::cache::Reader) {
    let kind = crate::resource::ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
    let (mut w, r) = crate::cache::new(kind, Default::default());
    w.replace(Vec::new(), crate::resource::Rv(5));
    (w, r)
}

pub fn request(path_and_query: &str) -> Req<String> {
    Request::get(path_and_query).body(String::new()).unwrap()
}

/// Runs `phase` with a stub behind it that answers 200; whether the stub was reached.
pub async fn run<P: Phase<String>>(phase: P, req: Req<String>) -> (Resp, bool) {
    let (resp, seen) = run_seen(phase, req).await;
    (resp, seen.is_some())
}

/// The rest of the stack, stubbed: records that it was reached and the extensions it got,
/// answers 200 (a body of unknown length, as a served list's: it holds its permit until sent).
#[derive(Clone, Default)]
pub struct Stub {
    pub reached: Arc<AtomicBool>,
    pub seen: Arc<parking_lot::Mutex<Option<http::Extensions>>>,
}

impl Next<String> for Stub {
    async fn run(&self, req: Req<String>) -> Resp {
        self.reached.store(true, Ordering::SeqCst);
        *self.seen.lock() = Some(req.extensions().clone());
        Response::new(body::chunks(vec![bytes::Bytes::from_static(b"ok")]))
    }
}

/// Like [`run`], with the request the stub saw (its extensions), if it was reached.
pub async fn run_seen<P: Phase<String>>(phase: P, req: Req<String>) -> (Resp, Option<http::Extensions>) {
    let stub = Stub::default();
    let resp = phase.call(req, &stub).await;
    let seen = stub.seen.lock().take();
    (resp, seen)
}

/// A response's body as text.
pub async fn text(resp: Resp) -> String {
    use http_body_util::BodyExt;
    let b = resp.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    String::from_utf8_lossy(&b).into_owned()
}
