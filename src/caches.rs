//! The lifecycle of the caches: which configured resources the upstream serves (discovery at
//! start, with what is missing retried in the background), one cache and reflector per found
//! resource, and rediscovery — every `--rediscovery-interval` and whenever a reflector gets
//! 404 for its resource — so that a CRD that changes its served version, or is deleted, is
//! followed: a changed resource gets a new cache, a vanished one is no longer served (its
//! requests are forwarded) and is looked for again.
//!
//! Used by `app` (start and wiring); grows and shrinks `server::catalog`.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::cache::{self, CacheOptions, Reader};
use crate::metrics::Metrics;
use crate::reflector::{self, ReflectorOptions};
use crate::resource::ResourceKind;
use crate::server::catalog::Missing;
use crate::server::{listener, Server};
use crate::upstream::{Upstream, UpstreamError};

/// How long the first discovery may take before the proxy starts without it (and retries).
const FIRST_DISCOVERY: Duration = Duration::from_secs(10);

/// The configured resources the upstream describes (with their configured names), and the
/// others with why they are missing. Only a resource the upstream shows cannot be cached (no
/// list or watch verb) is an error; an unreachable upstream or a resource it does not serve
/// (yet) is retried in the background.
pub async fn discover(
    upstream: &Upstream,
    wanted: &[String],
) -> Result<(Vec<(String, ResourceKind)>, Vec<(String, Missing)>), String> {
    let all = tokio::time::timeout(FIRST_DISCOVERY, upstream.discover(wanted)).await;
    let err = match all {
        Ok(Ok(kinds)) => return Ok((wanted.iter().cloned().zip(kinds).collect(), Vec::new())),
        Ok(Err(e)) => e,
        Err(_) => UpstreamError::Transport(format!("no answer within {FIRST_DISCOVERY:?}")),
    };
    if !matches!(err, UpstreamError::Discovery(_)) {
        // The upstream cannot be asked: every resource waits for it.
        let m = missing(&err)?;
        tracing::warn!(error = %err, "discovery failed; serving (not ready), retrying in the background");
        return Ok((Vec::new(), wanted.iter().map(|w| (w.clone(), m.clone())).collect()));
    }
    let (mut found, mut absent) = (Vec::new(), Vec::new());
    for w in wanted {
        match upstream.discover(std::slice::from_ref(w)).await {
            Ok(k) => found.extend(k.into_iter().map(|k| (w.clone(), k))),
            Err(e) => {
                tracing::warn!(resource = %w, error = %e, "not cached yet; forwarding its requests, retrying discovery");
                absent.push((w.clone(), missing(&e)?));
            }
        }
    }
    Ok((found, absent))
}

/// Why a resource is missing, or the error that must stop the start.
fn missing(e: &UpstreamError) -> Result<Missing, String> {
    match e {
        UpstreamError::Discovery(m) if m.contains("cannot be cached") => Err(format!("discovery: {e}")),
        UpstreamError::Discovery(_) => Ok(Missing { reason: e.to_string(), blocks_readiness: false }),
        _ => Ok(Missing { reason: e.to_string(), blocks_readiness: true }),
    }
}

/// One running cache.
struct Cached {
    name: String,
    kind: ResourceKind,
    /// Stops its reflector (which then ends the cache's watches).
    stop: Arc<watch::Sender<bool>>,
}

/// Starts, retires and replaces caches.
#[derive(Clone)]
pub struct Caching {
    pub upstream: Upstream,
    pub cache_opts: CacheOptions,
    pub metrics: Arc<Metrics>,
    /// The proxy's shutdown.
    pub stop: watch::Receiver<bool>,
    pub reflectors: Arc<Mutex<Vec<JoinHandle<()>>>>,
    pub reflector_opts: ReflectorOptions,
    /// Rung by a reflector that got 404 for its resource.
    pub rediscover: Arc<Notify>,
    caches: Arc<Mutex<Vec<Cached>>>,
}

impl Caching {
    pub fn new(
        upstream: Upstream,
        cache_opts: CacheOptions,
        metrics: Arc<Metrics>,
        stop: watch::Receiver<bool>,
        reflector_opts: ReflectorOptions,
    ) -> Caching {
        let rediscover = Arc::new(Notify::new());
        let reflector_opts = ReflectorOptions { on_not_found: Some(rediscover.clone()), ..reflector_opts };
        Caching {
            upstream,
            cache_opts,
            metrics,
            stop,
            reflectors: Arc::default(),
            reflector_opts,
            rediscover,
            caches: Arc::default(),
        }
    }

    /// Creates the cache of `kind` (configured as `name`) and spawns its reflector, which stops
    /// at shutdown or when the cache is retired.
    pub fn spawn(&self, name: &str, kind: ResourceKind) -> Reader {
        tracing::info!(resource = %kind.group_resource(), version = %kind.version, namespaced = kind.namespaced, builtin = kind.builtin, "caching");
        self.metrics.cache_added(&kind.group_resource());
        let (stop, stop_rx) = watch::channel(false);
        let stop = Arc::new(stop);
        let mut shutdown = self.stop.clone();
        let on_shutdown = stop.clone();
        tokio::spawn(async move {
            listener::until_true(&mut shutdown).await;
            on_shutdown.send_replace(true);
        });
        self.caches.lock().push(Cached { name: name.to_owned(), kind: kind.clone(), stop });
        let (writer, reader) = cache::new(kind, self.cache_opts.clone());
        self.reflectors.lock().push(tokio::spawn(reflector::run(
            self.upstream.clone(),
            writer,
            self.reflector_opts.clone(),
            self.metrics.clone(),
            stop_rx,
        )));
        reader
    }

    /// Stops serving the cache configured as `name`: its requests are forwarded from now on,
    /// its reflector stops and its watches end (clients re-watch, upstream).
    fn retire(&self, name: &str, server: &Server) {
        let mut caches = self.caches.lock();
        caches.retain(|c| {
            if c.name != name {
                return true;
            }
            server.resources().remove(&c.kind);
            c.stop.send_replace(true);
            false
        });
    }

    /// Retries the discovery of `name` (1 s doubling to 30 s) until it is found, then caches
    /// it; stops at shutdown.
    pub async fn retry_discovery(self, name: String, server: Arc<Server>) {
        let mut delay = Duration::from_secs(1);
        let mut stop = self.stop.clone();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = listener::until_true(&mut stop) => return,
            }
            delay = (delay * 2).min(Duration::from_secs(30));
            match self.upstream.discover(std::slice::from_ref(&name)).await {
                Ok(kinds) => {
                    for kind in kinds {
                        let reader = self.spawn(&name, kind);
                        server.resources().add(&self.upstream, reader);
                    }
                    server.resources().clear_missing(&name);
                    tracing::info!(resource = %name, "discovered; now cached");
                    return;
                }
                Err(e) => match missing(&e) {
                    Ok(m) => {
                        tracing::debug!(resource = %name, error = %e, "still not discovered");
                        server.resources().set_missing(&name, m);
                    }
                    Err(fatal) => {
                        tracing::error!(resource = %name, "{fatal}; not cached");
                        server
                            .resources()
                            .set_missing(&name, Missing { reason: fatal, blocks_readiness: false });
                        return;
                    }
                },
            }
        }
    }

    /// Rediscovers the cached resources every `interval` (zero: only when a reflector got 404)
    /// until shutdown; see the module doc.
    pub async fn rediscover_loop(self, interval: Duration, server: Arc<Server>) {
        let mut stop = self.stop.clone();
        loop {
            let tick = async {
                if interval.is_zero() {
                    std::future::pending::<()>().await
                } else {
                    tokio::time::sleep(interval).await
                }
            };
            tokio::select! {
                _ = tick => {}
                _ = self.rediscover.notified() => {}
                _ = listener::until_true(&mut stop) => return,
            }
            self.rediscover_once(&server).await;
        }
    }

    async fn rediscover_once(&self, server: &Arc<Server>) {
        let cached: Vec<(String, ResourceKind)> =
            self.caches.lock().iter().map(|c| (c.name.clone(), c.kind.clone())).collect();
        for (name, kind) in cached {
            match self.upstream.discover(std::slice::from_ref(&name)).await {
                Ok(now) if now.first() == Some(&kind) => {}
                Ok(now) => {
                    tracing::warn!(resource = %name, was = %kind.version, "the upstream serves it differently now; caching it anew");
                    self.retire(&name, server);
                    for k in now {
                        let reader = self.spawn(&name, k);
                        server.resources().add(&self.upstream, reader);
                    }
                }
                Err(e @ UpstreamError::Discovery(_)) => {
                    tracing::warn!(resource = %name, error = %e, "the upstream no longer serves it; forwarding its requests, looking for it again");
                    self.retire(&name, server);
                    match missing(&e) {
                        Ok(m) => server.resources().set_missing(&name, m),
                        Err(fatal) => server
                            .resources()
                            .set_missing(&name, Missing { reason: fatal, blocks_readiness: false }),
                    }
                    tokio::spawn(self.clone().retry_discovery(name, server.clone()));
                }
                // The upstream cannot be asked right now: keep the cache.
                Err(e) => tracing::debug!(resource = %name, error = %e, "rediscovery failed"),
            }
        }
    }
}
