//! The front door: listener, per-request pipeline and health endpoints.
//!
//! Every request passes named phases: **classify** (pure, `classify`) → **serve from cache**
//! (`serve`) | **forward upstream** (`proxy`). `/healthz`, `/livez`, `/readyz` and
//! `/metrics` are answered here. Built by `app`, which hands it the caches' readers and the
//! upstream client.

pub mod body;
pub mod classify;
pub mod consistent;
pub mod health;
pub mod listener;
pub mod proxy;
pub mod serve;

use std::collections::HashMap;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

pub use body::Body;
use classify::{ForwardReason, Route};
use serve::{ServeOptions, Served};

use crate::cache::Reader;
use crate::metrics::Metrics;
use crate::resource::ResourceKind;
use crate::upstream::Upstream;

/// Everything a request handler needs; shared by all connections.
pub struct Server {
    kinds: Vec<Arc<ResourceKind>>,
    readers: HashMap<(String, String, String), (Reader, Arc<consistent::Prober>)>,
    upstream: Upstream,
    serve: ServeOptions,
    metrics: Arc<Metrics>,
    shutting_down: tokio::sync::watch::Receiver<bool>,
}

impl Server {
    pub fn new(
        readers: Vec<Reader>,
        upstream: Upstream,
        serve: ServeOptions,
        metrics: Arc<Metrics>,
        shutting_down: tokio::sync::watch::Receiver<bool>,
    ) -> Server {
        let kinds = readers.iter().map(|r| Arc::new(r.kind().clone())).collect();
        let readers = readers
            .into_iter()
            .map(|r| {
                let k = r.kind().clone();
                let prober = consistent::Prober::new(upstream.clone(), k.clone());
                ((k.group, k.version, k.resource), (r, prober))
            })
            .collect();
        Server { kinds, readers, upstream, serve, metrics, shutting_down }
    }

    /// Handles one request: health, then classify → serve | forward.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let arrived = tokio::time::Instant::now();
        if let Some(resp) = health::handle(&self, &req) {
            return resp;
        }
        let accept = req.headers().get(http::header::ACCEPT).and_then(|v| v.to_str().ok());
        let route =
            classify::classify(req.method(), req.uri().path(), req.uri().query(), accept, &self.kinds[..]);
        match route {
            Route::Reject(e) => {
                self.metrics.request("reject", e.to_status().code.as_u16());
                body::error(e)
            }
            Route::Forward(reason) => self.forward(req, reason).await,
            Route::Cache(cr) => {
                let key = (cr.kind.group.clone(), cr.kind.version.clone(), cr.kind.resource.clone());
                let Some((reader, prober)) = self.readers.get(&key) else {
                    return self.forward(req, ForwardReason::NotCached).await;
                };
                let src = serve::Source { reader, prober };
                match serve::serve(&cr, src, &self.serve, arrived).await {
                    Served::Response(resp) => {
                        self.metrics.request(cr.plan.verb(), resp.status().as_u16());
                        resp
                    }
                    Served::Forward(reason) => self.forward(req, reason).await,
                }
            }
        }
    }

    async fn forward(&self, req: Request<Incoming>, reason: ForwardReason) -> Response<Body> {
        self.metrics.forwarded(reason.as_str());
        tracing::debug!(method = %req.method(), path = %req.uri().path(), reason = reason.as_str(), "forward upstream");
        proxy::forward(&self.upstream, req).await
    }

    /// Whether every cache has synced and the server is not shutting down.
    pub fn ready(&self) -> Result<(), Vec<String>> {
        let mut not_ready: Vec<String> = self
            .readers
            .values()
            .map(|(r, _)| r)
            .filter(|r| !r.progress().ready)
            .map(|r| format!("cache {} not synced", r.kind().group_resource()))
            .collect();
        if *self.shutting_down.borrow() {
            not_ready.push("shutting down".into());
        }
        if not_ready.is_empty() {
            Ok(())
        } else {
            not_ready.sort();
            Err(not_ready)
        }
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn readers(&self) -> impl Iterator<Item = &Reader> {
        self.readers.values().map(|(r, _)| r)
    }
}
