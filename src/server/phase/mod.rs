//! The phases of the request path, one file each, in the order `server::stack` assembles them:
//! `guard` → `health` → `sizes` → `admit` → `compress` → `pretty` → `authenticate` →
//! `classify` → `authorize` → `watch_slot` → `dispatch` (serve from the cache or forward); and what they
//! share: the [`Phase`] trait (a phase looks at the request, answers it itself or passes it on
//! with [`pass`], and may change the answer on its way back), its tower `Layer`/`Service`
//! ([`PhaseLayer`], [`Phased`]), and what phases learn for later ones, carried in the request's
//! extensions: [`Arrived`] and one typed [`RequestContext`] (the `RequestInfo`, the `Caller`,
//! [`Classified`], the metrics label).
//! Each phase is built (by `server::stack`) with exactly the collaborators it uses — the
//! limits, the auth caches, the catalog, the upstream, the [`Recorder`] — and is the whole of
//! its work; each is unit-tested alone, with a stub for the rest of the stack (`testing`).
//! A phase that finds missing what an earlier one must have set refuses the request (500),
//! never defaults to trust.

pub mod admit;
pub mod authenticate;
pub mod authorize;
pub mod classify;
pub mod compress;
pub mod dispatch;
pub mod guard;
pub mod health;
pub mod pretty;
pub mod sizes;
pub mod watch_slot;

#[cfg(test)]
pub(crate) mod testing;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use hyper::body::Incoming;
use tower::{Layer, Service};

use super::auth::Caller;
use super::catalog::Catalog;
use super::classify::{CacheRequest, ForwardReason, RequestInfo};
use super::Body;
use crate::metrics::{Metrics, Served};

pub type Req<B = Incoming> = Request<B>;
pub type Resp = Response<Body>;
type BoxFuture = Pin<Box<dyn Future<Output = Result<Resp, Infallible>> + Send>>;

/// When the request arrived (metrics count from here).
#[derive(Clone, Copy, Debug)]
pub struct Arrived(pub tokio::time::Instant);

/// When `req` arrived (set by `guard`; now, for a phase tested alone).
pub fn arrived<B>(req: &Req<B>) -> tokio::time::Instant {
    req.extensions().get::<Arrived>().map_or_else(tokio::time::Instant::now, |a| a.0)
}

/// What classification decided, for the phases after it.
#[derive(Clone)]
pub enum Classified {
    /// Served from this cache (of the catalog as it was when the request was classified).
    Cache {
        cr: Box<CacheRequest>,
        catalog: Arc<Catalog>,
        key: super::catalog::Key,
    },
    Forward(ForwardReason),
    /// The apiserver's own refusal of the request (bad list options, selectors: 400 / 422),
    /// answered here once the caller is authorized as the apiserver would first (its handlers
    /// validate after `WithAuthorization`); `encoding`: how its Status is written.
    Refuse {
        error: Arc<crate::error::Error>,
        encoding: crate::server::classify::ErrorEncoding,
    },
}

/// What the phases learn about a request, in one typed place: the request's extensions hold
/// one `RequestContext`, which `admit` (the `RequestInfo`), `authenticate` (the `Caller`) and
/// `classify` (the decision and the metrics label) fill in, and later phases read. Each part is
/// an `Option`: a phase that needs a part an earlier phase did not set refuses the request
/// (500, logged), never defaults to trust.
#[derive(Clone, Default)]
pub struct RequestContext {
    pub info: Option<RequestInfo>,
    pub caller: Option<Caller>,
    pub classified: Option<Classified>,
    /// The `group/resource` label of the request (cached resources only; empty otherwise).
    pub label: String,
}

/// The request's context (empty if no phase set anything yet).
pub fn context<B>(req: &Req<B>) -> Option<&RequestContext> {
    req.extensions().get::<RequestContext>()
}

/// The request's context, to fill in.
pub fn context_mut<B>(req: &mut Req<B>) -> &mut RequestContext {
    req.extensions_mut().get_or_insert_default::<RequestContext>()
}

/// The 500 of a phase that finds missing what an earlier phase must have set (a phase skipped
/// or reordered): logged, never passed on.
pub fn missing<B>(req: &Req<B>, phase: &str, what: &str) -> Resp {
    tracing::error!(phase, what, path = %req.uri().path(), "request is missing what an earlier phase sets; refused");
    super::body::error(crate::error::Error::Internal(format!("the request path is missing its {what}")))
}

/// Marks an answer the cache served (compression applies to those only).
#[derive(Clone, Copy, Debug)]
pub struct FromCache;

/// Marks an answer forwarded from the upstream, which is its own (never indented here: the
/// upstream saw the same query and user agent).
#[derive(Clone, Copy, Debug)]
pub struct FromUpstream;

/// How every phase counts what it answers: one request in `watchcache_requests_total` (and
/// its time to the response headers unless it is a watch). The one way a phase records a
/// refusal is [`Recorder::refused`].
#[derive(Clone, Default)]
pub struct Recorder(pub Arc<Metrics>);

impl Recorder {
    /// Counts an answered request.
    pub fn record(
        &self,
        verb: &str,
        resource: &str,
        code: u16,
        served: Served,
        arrived: tokio::time::Instant,
    ) {
        self.0.request(verb, resource, code, served);
        if verb != "watch" {
            self.0.request_duration(verb, resource, served, arrived.elapsed().as_secs_f64());
        }
    }

    /// Counts `resp`, a refusal by the proxy itself (`verb="reject"` before the verb is known,
    /// no resource label), and returns it.
    pub fn refused(&self, resp: Resp, verb: &str, resource: &str, arrived: tokio::time::Instant) -> Resp {
        self.record(verb, resource, resp.status().as_u16(), Served::Proxy, arrived);
        resp
    }
}

/// The rest of the stack, as a phase sees it. Phases call it statically: the whole stack is
/// one future, boxed once at the top (`Phased`'s tower `Service`), not a boxed future per
/// phase (measured: boxing and moving one future per phase cost ~10 µs per request).
pub trait Next<B>: Clone + Send + Sync + 'static {
    fn run(&self, req: Req<B>) -> impl Future<Output = Resp> + Send;
}

/// Passes the request on to the rest of the stack.
pub async fn pass<B, S: Next<B>>(next: &S, req: Req<B>) -> Resp {
    next.run(req).await
}

/// One phase of the request path.
pub trait Phase<B>: Clone + Send + Sync + 'static {
    fn call<S: Next<B>>(&self, req: Req<B>, next: &S) -> impl Future<Output = Resp> + Send;
}

/// A phase as a tower `Layer`.
#[derive(Clone)]
pub struct PhaseLayer<P>(pub P);

impl<P: Clone, S> Layer<S> for PhaseLayer<P> {
    type Service = Phased<P, S>;
    fn layer(&self, inner: S) -> Phased<P, S> {
        Phased { phase: self.0.clone(), inner }
    }
}

/// A phase in front of the rest of the stack, as a tower `Service`.
#[derive(Clone)]
pub struct Phased<P, S> {
    phase: P,
    inner: S,
}

impl<B: Send + Sync + 'static, P: Phase<B>, S: Next<B>> Next<B> for Phased<P, S> {
    fn run(&self, req: Req<B>) -> impl Future<Output = Resp> + Send {
        self.phase.call(req, &self.inner)
    }
}

impl<B: Send + Sync + 'static, P: Phase<B>, S: Next<B>> Service<Req<B>> for Phased<P, S> {
    type Response = Resp;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Every phase and the dispatch are always ready: limits are phases of their own.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req<B>) -> BoxFuture {
        let me = self.clone();
        Box::pin(async move { Ok(me.run(req).await) })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use tower::{ServiceBuilder, ServiceExt};

    use super::testing::{request, server, Stub};
    use super::*;

    /// Phases compose as tower layers; the result is a tower `Service` that answers in front
    /// and passes the rest on.
    #[tokio::test]
    async fn phases_compose_as_tower_layers() {
        let s = server(Default::default());
        let stub = Stub::default();
        let stack = ServiceBuilder::new()
            .layer(PhaseLayer(guard::Guard { loopback: None, recorder: Recorder::default() }))
            .layer(PhaseLayer(health::Health { server: s }))
            .service(stub.clone());
        let resp = stack.clone().oneshot(request("/healthz")).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert!(!stub.reached.load(Ordering::SeqCst), "health answered in front");
        let _ = stack.oneshot(request("/api/v1/pods")).await.unwrap();
        assert!(stub.reached.load(Ordering::SeqCst));
        let seen = stub.seen.lock().take().unwrap();
        assert!(seen.get::<Arrived>().is_some(), "what guard learned travels on");
    }
}
