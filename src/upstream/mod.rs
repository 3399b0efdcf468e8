//! The client to the real kube-apiserver: where the connection comes from, the TLS and HTTP
//! clients, and the few requests the proxy makes (discovery, LIST pages, WATCH streams) plus the
//! pass-through of callers' requests.
//!
//! Called by `app` (builds one [`Upstream`] from [`UpstreamOptions`] and logs
//! [`Upstream::describe`]), by `reflector` ([`Upstream::list_page`], [`Upstream::watch`],
//! [`Upstream::get_json`] for consistent-read probes), by `server::proxy`
//! ([`Upstream::forward`]) and by `bench` (as a plain client).
//!
//! # Layout
//!
//! | file | owns |
//! | --- | --- |
//! | `config.rs` | [`UpstreamOptions`] → a resolved source (URL, TLS material, auth) |
//! | `errors.rs` | [`ConfigError`] and `one_line`, shared by `config`, `auth` and `client` |
//! | `auth.rs` | the proxy's own credentials; token files re-read every minute |
//! | `tls.rs` | rustls client configs (with and without the client certificate) and connectors |
//! | `client.rs` | the three pooled HTTP clients and the own-request helpers ([`Upstream::get_json`]) |
//! | `lanes.rs` | the own and forwarding clients' connections in lanes of at most N requests each |
//! | `discovery.rs` | [`Upstream::discover`]: "group/resource" → [`ResourceKind`] |
//! | `list.rs` | [`Upstream::list_page`] and zero-copy [`ListPage`] parsing |
//! | `watch.rs` | [`Upstream::watch`] and the [`WatchStream`] line splitter |
//! | `forward.rs` | [`Upstream::forward`]: pass-through without the proxy's credentials, upgrades |
//! | `splice.rs` | an upgraded session's copy both ways, ended when one side closed and all is quiet |
//! | `rechunk.rs` | joins a forwarded body's ready small chunks into fewer, larger writes |
//!
//! Three clients, one reason each: the *own* client carries the proxy's identity (bearer token,
//! client certificate) and is only used for the proxy's own requests; the *forward* client
//! carries no credentials at all, so a caller can never borrow the proxy's identity; the
//! *upgrade* client is the forward client restricted to HTTP/1.1, because `exec`, `attach` and
//! `port-forward` upgrade the connection and HTTP/2 has no `Upgrade`.

mod auth;
mod client;
mod config;
mod discovery;
mod errors;
mod exec;
mod forward;
mod identity;
mod lanes;
mod list;
mod rechunk;
mod splice;
mod tls;
mod watch;

#[cfg(test)]
mod exec_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod testutil;

use std::sync::Arc;

use bytes::Bytes;

pub use auth::Credentials;
pub use client::PREFIX_ESCAPE;
pub use config::{hide_userinfo, resolve, Resolved, TlsSettings};
pub use config::{ConfigError, UpstreamOptions};
pub use discovery::{name_of, Everything, Round, SkipReason, Skipped};
pub(crate) use errors::parse_error_at;
pub(crate) use forward::upgrade_protocol;
pub use forward::HeldWhileUpgraded;
pub use identity::{Identity, IdentitySlot};
pub use lanes::{Leased, DEFAULT_STREAMS_PER_CONNECTION, MAX_STREAMS_PER_CONNECTION};
pub use list::{ListPage, MetadataPage, Pages, Selection};
pub use tls::client_config;
pub use watch::{RawEvent, WatchStream};

#[allow(unused_imports)] // used by the docs above
use crate::resource::ResourceKind;

/// The boxed error of streamed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of a forwarded response: the upstream body, streamed as it arrives.
pub type BoxBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// Why a request to the upstream failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// Connecting, TLS, I/O or a timeout: the upstream could not be talked to.
    #[error("upstream unreachable: {0}")]
    Transport(String),
    /// The upstream answered with a non-2xx status; `status` is its `Status` object when the
    /// body was one.
    #[error("upstream answered HTTP {code}: {}", status_message(.status, .body))]
    Status { code: u16, status: Option<serde_json::Value>, body: Bytes },
    /// The upstream answered 2xx with a body that could not be read as expected.
    #[error("unexpected upstream response: {0}")]
    Decode(String),
    /// Discovery did not find a wanted resource, or it cannot be listed and watched.
    #[error("discovery: {0}")]
    Discovery(String),
}

impl UpstreamError {
    /// True when the upstream says the requested resourceVersion is gone: HTTP 410, or a
    /// `Status` with code 410 or reason `Expired` / `Gone` (also inside a watch ERROR event,
    /// see [`RawEvent::error`]).
    pub fn is_gone(&self) -> bool {
        match self {
            UpstreamError::Status { code, status, .. } => {
                *code == 410
                    || status.as_ref().is_some_and(|s| {
                        s.get("code").and_then(|c| c.as_u64()) == Some(410)
                            || matches!(s.get("reason").and_then(|r| r.as_str()), Some("Expired" | "Gone"))
                    })
            }
            _ => false,
        }
    }

    /// True for the apiserver's 504 for a resourceVersion newer than its own (its watch cache
    /// behind, its storage restored): a `Status` whose `details.causes` hold
    /// `ResourceVersionTooLarge` (client-go's `isTooLargeResourceVersionError`).
    pub fn is_too_large_rv(&self) -> bool {
        let UpstreamError::Status { status: Some(s), .. } = self else { return false };
        s.pointer("/details/causes").and_then(serde_json::Value::as_array).is_some_and(|causes| {
            causes.iter().any(|c| c.get("reason").and_then(|r| r.as_str()) == Some("ResourceVersionTooLarge"))
        })
    }

    /// The `retryAfterSeconds` of a Status answer (a 429 under APF, a watch cache not ready
    /// yet: the cacher scales it with how long it has been down), zero without one.
    pub fn retry_after(&self) -> std::time::Duration {
        match self {
            UpstreamError::Status { status: Some(s), .. } => s
                .pointer("/details/retryAfterSeconds")
                .and_then(serde_json::Value::as_u64)
                .map_or(std::time::Duration::ZERO, std::time::Duration::from_secs),
            _ => std::time::Duration::ZERO,
        }
    }

    /// Whether the same request may succeed later: a 429, a 5xx, or no answer (a connection
    /// refused or reset, a timeout) — not a 4xx refusal, nor an answer that cannot be read.
    pub fn is_transient(&self) -> bool {
        match self {
            UpstreamError::Status { code, .. } => *code == 429 || (500..600).contains(code),
            UpstreamError::Transport(_) => true,
            UpstreamError::Decode(_) | UpstreamError::Discovery(_) => false,
        }
    }

    /// The HTTP status code of a `Status` error.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            UpstreamError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// The `message` of a `Status`, else the start of the body, on one line.
fn status_message(status: &Option<serde_json::Value>, body: &Bytes) -> String {
    let text = match status.as_ref().and_then(|s| s.get("message")).and_then(|m| m.as_str()) {
        Some(m) => m.to_owned(),
        None => String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
    };
    config::one_line(&text)
}

/// Told about every own request of the proxy (the metrics implement it; `upstream` does not
/// know them). `code` is `None` when no answer came (transport error, timeout).
pub trait Observer: Send + Sync {
    fn upstream_request(&self, method: &str, code: Option<u16>, secs: f64);
    /// `client` (`own`, `forward`, `forward_own`) now has `lanes` connections' worth of lanes.
    fn upstream_lanes(&self, client: &str, lanes: usize);
}

/// A handle on the upstream apiserver. Cheap to clone: every clone shares the same pooled
/// connections and credentials.
#[derive(Clone)]
pub struct Upstream {
    inner: Arc<client::Inner>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream").field("base_url", &self.inner.base_url).finish_non_exhaustive()
    }
}

impl Upstream {
    /// Resolves where the connection comes from (`--upstream`, kubeconfig, in-cluster) and builds
    /// the clients. Does no network I/O; a missing or broken configuration is a one-line error.
    pub fn new(opts: &UpstreamOptions) -> Result<Upstream, ConfigError> {
        let resolved = config::resolve(opts)?;
        Ok(Upstream { inner: Arc::new(client::Inner::build(resolved, opts.max_streams_per_connection)?) })
    }

    /// Reports every own request, and the lanes of every client, from now on to `observer`
    /// (set once, by `app`; later calls are ignored). The lanes made before are reported now.
    pub fn observe(&self, observer: std::sync::Arc<dyn Observer>) {
        if self.inner.observer.set(observer.clone()).is_ok() {
            let i = &self.inner;
            for (name, lanes) in [
                ("own", i.own.lanes()),
                ("forward", i.forward.lanes()),
                ("forward_own", i.forward_own.lanes()),
            ] {
                observer.upstream_lanes(name, lanes);
            }
        }
    }

    /// The upstream's base URL without a trailing slash, e.g. `https://10.0.0.1:6443`.
    pub fn base_url(&self) -> &str {
        &self.inner.base_url
    }

    /// Whether a caller's `path` could leave the base URL's path prefix (a `.` or `..`
    /// segment under a prefix): such a request is never sent (`server::proxy` answers 400).
    pub fn escapes_prefix(&self, path: &str) -> bool {
        self.inner.escapes_prefix(path)
    }

    /// One line for the startup log: URL, where it came from and the kind of credentials.
    /// Never contains a secret.
    pub fn describe(&self) -> String {
        self.inner.describe()
    }
}
