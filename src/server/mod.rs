//! The front door: listener, per-request pipeline and health endpoints.
//!
//! Every request passes the phases of a tower stack (`stack`, assembled in one place; each
//! phase a file of `phase`, unit-tested alone): **guard** (a `Transfer-Encoding` it does not
//! take; `--auth=none`'s loopback guard: Host, path, method, Origin) → **health** (`/healthz`,
//! `/livez`, `/readyz`; authentication only for their detail) → **sizes** (URL / header) →
//! **admit** (the apiserver's `RequestInfo`; non-long-running requests: in-flight permit held
//! until the response body ends, timeout; before authentication, as the apiserver) →
//! **authenticate** + impersonate (`auth`; the proxy's own metrics at `/watchcache/metrics`
//! for callers allowed `get` on that non-resource URL, like the apiserver's `/metrics`
//! (which, with `/debug/*`, is forwarded upstream: the apiserver's own)) → **classify** (pure,
//! `classify`) → **authorize** (`auth`, cache-served reads only, with the `RequestInfo`'s
//! attributes) → **watch slot** (per user, served or forwarded) → **compress** (large cached
//! answers `gzip`'d when asked) → **dispatch**: serve from the cache (`serve`) or forward
//! upstream (`proxy`, with the caller's identity, or the proxy's own with `--auth=none`). Built
//! by `app`, which hands it the caches' readers, the upstream client and the [`auth::Auth`] (none
//! with `--auth=none`: every caller trusted, forwarded requests unchanged).
//!
//! Connections: `listener` accepts (and terminates TLS, `tls`), `conn` serves each with the
//! protocol it speaks and drains it on shutdown; an HTTP/2 connection runs once for all the
//! streams that sent (`coalesce`) and writes what that poll produced at its end (`batch` in the
//! clear, `tlsio` over TLS, which also keeps TLS records full).

pub mod auth;
pub mod batch;
pub mod body;
pub mod catalog;
pub mod classify;
pub mod coalesce;
pub mod conn;
pub mod consistent;
pub mod flights;
pub mod gzip;
pub mod health;
pub mod limits;
pub mod listener;
pub mod loopback;
pub mod phase;
pub mod proxy;
pub mod serve;
pub mod stack;
pub mod tls;
pub mod tlsio;

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

use auth::{Attributes, Auth, Caller};
pub use body::Body;
use classify::{ForwardReason, RequestInfo};
use limits::{LimitOptions, Limits};
use serve::ServeOptions;

use crate::cache::Reader;
use crate::metrics::{Metrics, Served};
use crate::upstream::Upstream;

/// Everything a request handler needs; shared by all connections.
pub struct Server {
    resources: catalog::Resources,
    upstream: Upstream,
    serve: ServeOptions,
    metrics: Arc<Metrics>,
    shutting_down: tokio::sync::watch::Receiver<bool>,
    auth: Option<Auth>,
    limits: Limits,
    loopback: Option<loopback::Guard>,
    trusted_headers: proxy::TrustedHeaders,
}

/// What `/readyz` looks at (`Server::readiness`).
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    pub shutting_down: bool,
    /// Every cache: (group/resource, synced).
    pub caches: Vec<(String, bool)>,
    /// Synced caches with no proof of being current for too long: (group/resource, why).
    pub stale: Vec<(String, String)>,
    /// Caches not ready because the consistency check found them different from the upstream
    /// (relisting): (group/resource, why).
    pub not_ready: Vec<(String, String)>,
    /// Configured resources not cached yet that block readiness: (name, why).
    pub missing: Vec<(String, String)>,
    /// What a wildcard skipped (never blocks readiness): (name, reason label, detail).
    pub skipped: Vec<(String, &'static str, String)>,
}

/// What a server checks; the default (no auth, default limits, no browser guard) is what
/// in-process tests use.
#[derive(Default)]
pub struct Security {
    pub auth: Option<Auth>,
    pub limits: LimitOptions,
    /// `--auth=none`'s Host / path / method / Origin filters (`loopback`).
    pub loopback: Option<loopback::Guard>,
    /// Request-header authentication headers dropped from forwarded requests.
    pub trusted_headers: proxy::TrustedHeaders,
}

impl Server {
    pub fn new(
        readers: Vec<Reader>,
        upstream: Upstream,
        serve: ServeOptions,
        metrics: Arc<Metrics>,
        shutting_down: tokio::sync::watch::Receiver<bool>,
        security: Security,
    ) -> Server {
        let resources = catalog::Resources::default();
        for r in readers {
            resources.add(&upstream, r);
        }
        Server {
            resources,
            upstream,
            serve,
            metrics,
            shutting_down,
            auth: security.auth,
            limits: Limits::new(security.limits),
            loopback: security.loopback,
            trusted_headers: security.trusted_headers,
        }
    }

    /// Handles one request: the phases of `stack` (see the module doc).
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        use phase::Next;
        stack::stack(&self).run(req).await
    }

    /// Who may see the detailed health checks: everyone with `--auth=none`; else a caller
    /// allowed `get` on the path. The root paths are public (probes have no credentials): a
    /// caller is only looked at when it asks for `verbose`, and one that fails authentication
    /// or authorization gets the public checks. Per-check paths are not public: 401 / 403.
    // The `Err` is the refusal response itself, as in `limits`.
    #[allow(clippy::result_large_err)]
    async fn health_access<B>(
        &self,
        req: &Request<B>,
        per_check: bool,
    ) -> Result<health::Access, Response<Body>> {
        let Some(auth) = &self.auth else {
            return Ok(health::Access::Detailed);
        };
        let verbose = req
            .uri()
            .query()
            .is_some_and(|q| form_urlencoded::parse(q.as_bytes()).any(|(k, _)| k == "verbose"));
        if !per_check && !verbose {
            return Ok(health::Access::Public);
        }
        let caller = match auth.authenticate(req, source(req)).await {
            Ok(c) => c,
            Err(resp) if per_check => return Err(resp),
            Err(_) => return Ok(health::Access::Public),
        };
        let a = Attributes {
            verb: "get".into(),
            path: Some(req.uri().path().to_owned()),
            ..Attributes::default()
        };
        match auth.authorize(&caller.effective, &a).await {
            Ok(()) => Ok(health::Access::Detailed),
            Err(resp) if per_check => Err(resp),
            Err(_) => Ok(health::Access::Public),
        }
    }

    /// Authentication and impersonation, or the trusted caller of `--auth=none`.
    async fn authenticate<B>(&self, req: &Request<B>) -> Result<Caller, Response<Body>> {
        let Some(auth) = &self.auth else {
            return Ok(Caller::trusted());
        };
        let caller = auth.authenticate(req, source(req)).await?;
        auth.impersonate(caller, req.headers()).await
    }

    /// Adds a slot of the caller's in-flight share to the request's ticket (what is not
    /// long-running has one, from `admit`), or 429. Per-user limits need users: none with
    /// `--auth=none`.
    #[allow(clippy::result_large_err)]
    fn in_flight_share<B>(&self, req: &Request<B>, caller: &Caller) -> Result<(), Response<Body>> {
        match req.extensions().get::<limits::Ticket>() {
            Some(ticket) if self.auth.is_some() => self.limits.share(ticket, &caller.effective.name),
            _ => Ok(()),
        }
    }

    /// In-flight requests of a user (tests, diagnostics).
    pub fn in_flight_of(&self, user: &str) -> usize {
        self.limits.in_flight_of(user)
    }

    /// A slot for one more watch of the caller (served or forwarded), or 429. Per-user limits
    /// need users: none with `--auth=none`.
    // The `Err` is the refusal response itself, as in `limits`.
    #[allow(clippy::result_large_err)]
    fn watch_slot(
        &self,
        info: &RequestInfo,
        caller: &Caller,
    ) -> Result<Option<limits::WatchGuard>, Response<Body>> {
        if info.verb != "watch" || self.auth.is_none() {
            return Ok(None);
        }
        match self.limits.watch_slot(&caller.effective.name) {
            Ok(g) => Ok(Some(g)),
            Err(resp) => {
                self.metrics.request("watch", "", 429, Served::Proxy);
                Err(resp)
            }
        }
    }

    async fn forward(
        &self,
        req: Request<Incoming>,
        reason: ForwardReason,
        caller: &Caller,
        f: Forwarded<'_>,
    ) -> Response<Body> {
        self.metrics.forwarded(reason.as_str());
        tracing::debug!(method = %req.method(), path = %req.uri().path(), reason = reason.as_str(), "forward upstream");
        let resp = proxy::forward(&self.upstream, req, caller, &self.trusted_headers).await;
        self.record(f.verb, f.resource, resp.status().as_u16(), Served::Upstream(reason.as_str()), f.arrived);
        resp
    }

    /// Counts an answered request; its time to the response headers unless it is a watch.
    fn record(&self, verb: &str, resource: &str, code: u16, served: Served, arrived: tokio::time::Instant) {
        self.metrics.request(verb, resource, code, served);
        if verb != "watch" {
            self.metrics.request_duration(verb, resource, served, arrived.elapsed().as_secs_f64());
        }
    }

    /// Non-long-running requests holding an in-flight permit now.
    pub fn in_flight(&self) -> usize {
        self.limits.in_flight()
    }

    /// Open watches of a user, served or forwarded (tests, diagnostics).
    pub fn watches_of(&self, user: &str) -> usize {
        self.limits.watches_of(user)
    }

    /// What `/readyz` checks: caches synced and not stale, configured resources cached,
    /// not shutting down.
    pub fn readiness(&self) -> Readiness {
        let mut st = Readiness { shutting_down: *self.shutting_down.borrow(), ..Readiness::default() };
        for r in self.readers() {
            let gr = r.kind().group_resource();
            let progress = r.progress();
            st.caches.push((gr.clone(), progress.ready));
            if let (false, Some(why)) = (progress.ready, r.relist_reason()) {
                st.not_ready.push((gr.clone(), why));
            }
            if r.progress().ready && serve::too_stale(&r, &self.serve) {
                let s = r.staleness().unwrap_or_default();
                st.stale.push((gr, format!("no proof of being current for {}s", s.as_secs())));
            }
        }
        st.caches.sort();
        for (name, m) in self.resources.missing() {
            if m.blocks_readiness {
                st.missing.push((name, m.reason));
            }
        }
        for (name, s) in self.resources.skipped() {
            st.skipped.push((name, s.reason.as_str(), s.detail));
        }
        st
    }

    /// Whether every cache has synced, every configured resource the upstream can be asked
    /// about is cached, and the server is not shutting down; else why not.
    pub fn ready(&self) -> Result<(), Vec<String>> {
        let st = self.readiness();
        let mut not_ready: Vec<String> = Vec::new();
        for (gr, synced) in &st.caches {
            if !synced {
                not_ready.push(format!("cache {gr} not synced"));
            }
        }
        not_ready.extend(st.stale.iter().map(|(gr, why)| format!("cache {gr} stale: {why}")));
        not_ready.extend(st.missing.iter().map(|(n, why)| format!("resource {n} not cached yet: {why}")));
        if st.shutting_down {
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

    /// The caches now.
    pub fn readers(&self) -> Vec<Reader> {
        self.resources.snapshot().caches.values().map(|(r, _)| r.clone()).collect()
    }

    /// The cached resources (grown by `app` as discovery retries find them).
    pub fn resources(&self) -> &catalog::Resources {
        &self.resources
    }

    /// The upstream client (for caches added later).
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }
}

/// What a forwarded request is counted as.
#[derive(Clone, Copy)]
struct Forwarded<'a> {
    verb: &'a str,
    resource: &'a str,
    arrived: tokio::time::Instant,
}

/// The `group/resource` of a request about a cached resource, else empty (uncached resources,
/// discovery, non-resource paths are not labelled: their names come from callers).
/// The address a request came from (`listener` attaches it), for per-source review shares.
fn source<B>(req: &Request<B>) -> Option<std::net::IpAddr> {
    req.extensions().get::<proxy::PeerAddr>().map(|p| p.0.ip())
}

fn cached_resource(info: &RequestInfo, kinds: &[Arc<crate::resource::ResourceKind>]) -> String {
    if !info.is_resource_request {
        return String::new();
    }
    kinds
        .iter()
        .find(|k| k.group == info.api_group && k.resource == info.resource)
        .map(|k| k.group_resource())
        .unwrap_or_default()
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
