//! The server's shared state: the catalog of caches, the upstream client, the limits, the auth
//! caches, the metrics — each behind its own `Arc`, so that `stack` hands every phase exactly
//! the collaborators it uses. Also what the process asks of the server as a whole: readiness
//! (`/readyz`, `app`'s wait), in-flight and watch counts (tests, diagnostics), the catalog
//! (`caches` grows it).
//!
//! Built by `app` (and the phase tests' `testing`); read by `stack`, `health`, `caches`.

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

use super::auth::Auth;
use super::limits::Limits;
use super::loopback::LoopbackGuard;
use super::serve::{self, ServeOptions};
use super::{catalog, proxy, stack, Body, Readiness, Security};
use crate::cache::Reader;
use crate::metrics::Metrics;
use crate::upstream::Upstream;

/// Everything the request path shares; one per listener, shared by all connections.
pub struct Server {
    pub(super) resources: Arc<catalog::Resources>,
    pub(super) upstream: Upstream,
    pub(super) serve: Arc<ServeOptions>,
    pub(super) metrics: Arc<Metrics>,
    shutting_down: tokio::sync::watch::Receiver<bool>,
    pub(super) auth: Option<Arc<Auth>>,
    pub(super) limits: Arc<Limits>,
    pub(super) loopback: Option<Arc<LoopbackGuard>>,
    pub(super) trusted_headers: Arc<proxy::TrustedHeaders>,
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
            resources: Arc::new(resources),
            upstream,
            serve: Arc::new(serve),
            metrics,
            shutting_down,
            auth: security.auth.map(Arc::new),
            limits: Arc::new(Limits::new(security.limits)),
            loopback: security.loopback.map(Arc::new),
            trusted_headers: Arc::new(security.trusted_headers),
        }
    }

    /// Handles one request: the phases of `stack` (see the module doc of `server`).
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        use super::phase::Next;
        stack::stack(&self).run(req).await
    }

    /// The authenticator and authorizer; none with `--auth=none`.
    pub fn auth(&self) -> Option<&Arc<Auth>> {
        self.auth.as_ref()
    }

    /// Non-long-running requests holding an in-flight permit now.
    pub fn in_flight(&self) -> usize {
        self.limits.in_flight()
    }

    /// In-flight requests of a user (tests, diagnostics).
    pub fn in_flight_of(&self, user: &str) -> usize {
        self.limits.in_flight_of(user)
    }

    /// Open watches of a user, served or forwarded (tests, diagnostics).
    pub fn watches_of(&self, user: &str) -> usize {
        self.limits.watches_of(user)
    }

    /// What `/readyz` checks: caches synced once and not all stale, configured resources
    /// cached, not shutting down ([`Readiness::blocking`]).
    pub fn readiness(&self) -> Readiness {
        let mut st = Readiness { shutting_down: *self.shutting_down.borrow(), ..Readiness::default() };
        for r in self.readers() {
            let gr = r.kind().group_resource();
            let progress = r.progress();
            if progress.unservable {
                // Forwarded, answered as without the proxy: reported, never blocking.
                st.unparsable.push((gr, progress.last_error.unwrap_or_default()));
                continue;
            }
            st.caches.push((gr.clone(), progress.ready));
            // Relisting after the upstream proved the cache in this process (a list, an event,
            // a bookmark, a watch accepted from its RV) — not a restored state's relist before
            // any such proof, which is a cold start's (`docs/reliability.md`, warm restarts).
            let resyncing = !progress.ready && r.proven_here();
            if resyncing {
                st.resyncing.push(gr.clone());
            }
            if let (false, Some(why)) = (progress.ready, r.relist_reason()) {
                st.not_ready.push((gr.clone(), why));
            }
            // A relist that has not landed within `--max-staleness` is stale too.
            if (r.progress().ready || resyncing) && serve::too_stale(&r, &self.serve) {
                let s = r.staleness().unwrap_or_default();
                st.stale.push((gr, format!("no proof of being current for {}s", s.as_secs())));
            }
        }
        st.caches.sort();
        st.unparsable.sort();
        for (name, m) in self.resources.missing() {
            if m.blocks_readiness {
                st.missing.push((name, m.reason));
            }
        }
        for (name, s) in self.resources.skipped() {
            st.skipped.push((name, s.reason.as_str(), s.detail));
        }
        st.dropped = self.resources.snapshot().dropped.values().cloned().collect();
        st.dropped.sort();
        st
    }

    /// Whether every cache has synced, every configured resource the upstream can be asked
    /// about is cached, and the server is not shutting down; else why not.
    pub fn ready(&self) -> Result<(), Vec<String>> {
        let not_ready = self.readiness().blocking();
        if not_ready.is_empty() {
            Ok(())
        } else {
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

    /// The same, shared (for `caches`, which grows and shrinks it).
    pub fn catalog(&self) -> Arc<catalog::Resources> {
        self.resources.clone()
    }

    /// The upstream client (for caches added later).
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }
}
