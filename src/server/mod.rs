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
//! clear, `tlsio` over TLS, which also keeps TLS records full). `crate::warn_gate` holds back warnings
//! a caller could repeat at will.

pub mod auth;
pub mod batch;
pub mod body;
pub mod catalog;
pub mod classify;
pub mod coalesce;
pub mod conn;
pub mod consistent;
pub mod crowd;
pub mod flights;
pub mod gzip;
pub mod health;
pub mod indent;
pub mod limits;
pub mod listener;
pub mod loopback;
pub mod phase;
pub mod proxy;
pub mod serve;
pub mod stack;
pub mod state;
pub mod tls;
pub mod tlsio;

use auth::Auth;
pub use body::Body;
use limits::LimitOptions;
pub use state::Server;

/// What `/readyz` looks at (`Server::readiness`).
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    pub shutting_down: bool,
    /// Every cache: (group/resource, synced).
    pub caches: Vec<(String, bool)>,
    /// Synced caches with no proof of being current for too long: (group/resource, why).
    pub stale: Vec<(String, String)>,
    /// Caches not synced now that the upstream had proven in this process (relisting: the
    /// upstream's 410, a difference the consistency check found): reported, never blocking
    /// unless stale with every other (`upstream_away`). A restored state's relist before any
    /// proof is a cold start's, and blocks.
    pub resyncing: Vec<String>,
    /// Caches not ready because the consistency check found them different from the upstream
    /// (relisting): (group/resource, why).
    pub not_ready: Vec<(String, String)>,
    /// Configured resources not cached yet that block readiness: (name, why).
    pub missing: Vec<(String, String)>,
    /// What a wildcard skipped (never blocks readiness): (name, reason label, detail).
    pub skipped: Vec<(String, &'static str, String)>,
    /// What `--cache-memory-limit` stopped caching (never blocks readiness: its requests are
    /// forwarded, answered as they would be without the proxy): (group/resource, why).
    pub dropped: Vec<(String, String)>,
    /// Caches that cannot parse an object the upstream sent (never blocks readiness: their
    /// requests are forwarded until a full list parses whole): (group/resource, why).
    pub unparsable: Vec<(String, String)>,
}

impl Readiness {
    /// Why the proxy is not ready (empty: ready). A cache blocks while it has never synced
    /// (a new replica takes no traffic before it holds the data); once it has, its relist or
    /// staleness does not: its reads are answered meanwhile (429 while it relists, as the
    /// apiserver's cache answers; forwarded while stale), and every replica of a fleet relists
    /// and goes stale together — all of them unready left the Service with no endpoint, and
    /// every client of every resource with nothing (found by a review). Staleness blocks only
    /// when every synced cache is stale: the upstream is away.
    pub fn blocking(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (gr, synced) in &self.caches {
            if !synced && !self.resyncing.contains(gr) {
                out.push(format!("cache {gr} not synced"));
            }
        }
        if self.upstream_away() {
            out.extend(self.stale.iter().map(|(gr, why)| format!("cache {gr} stale: {why}")));
        }
        out.extend(self.missing.iter().map(|(n, why)| format!("resource {n} not cached yet: {why}")));
        if self.shutting_down {
            out.push("shutting down".into());
        }
        out.sort();
        out
    }

    /// Every synced or relisting cache is stale (and one is): the upstream's streams, or its
    /// lists, are away.
    pub fn upstream_away(&self) -> bool {
        let live = self.caches.iter().filter(|(gr, synced)| *synced || self.resyncing.contains(gr)).count();
        !self.stale.is_empty() && self.stale.len() >= live
    }
}

/// What a server checks; the default (no auth, default limits, no browser guard) is what
/// in-process tests use.
#[derive(Default)]
pub struct Security {
    pub auth: Option<Auth>,
    pub limits: LimitOptions,
    /// `--auth=none`'s Host / path / method / Origin filters (`loopback`).
    pub loopback: Option<loopback::LoopbackGuard>,
    /// Request-header authentication headers dropped from forwarded requests.
    pub trusted_headers: proxy::TrustedHeaders,
}
