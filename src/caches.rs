//! The lifecycle of the caches: which configured resources the upstream serves (discovery at
//! start, with what is missing retried in the background), one cache and reflector per found
//! resource, and rediscovery — every `--rediscovery-interval` and whenever a reflector gets
//! 404 for its resource — so that a CRD that changes its served version, or is deleted, is
//! followed: a changed resource gets a new cache, a vanished one is no longer served (its
//! requests are forwarded) and is looked for again.
//!
//! With the wildcard `--resources '*'` the set itself follows discovery: every round caches
//! what appeared (a CRD just installed; also rung by a request for a resource not cached),
//! retires what went away, and reports what it skips (forbidden to list, aggregated APIs).
//! A wildcard resource that has not synced within [`SYNC_BOUND`] is taken out of service
//! (forwarded, reported, not blocking `/readyz`) until it has.
//!
//! Used by `app` (start and wiring); grows and shrinks `server::catalog` (the catalog alone:
//! it never sees the `Server`).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::cache::{self, CacheOptions, Reader};
use crate::metrics::Metrics;
use crate::reflector::{self, ReflectorOptions};
use crate::resource::ResourceKind;
use crate::server::catalog::{Missing, Resources};
use crate::state::{self, Warm};
use crate::upstream::{Round, SkipReason, Skipped, Upstream, UpstreamError};
use crate::wanted::Wanted;

/// How long the first discovery may take before the proxy starts without it (and retries).
const FIRST_DISCOVERY: Duration = Duration::from_secs(10);

/// How long a wildcard resource may take to sync before it is forwarded and reported instead
/// of holding `/readyz` (named resources keep blocking readiness until they sync).
pub const SYNC_BOUND: Duration = Duration::from_secs(60);

/// How long a resource must have been found gone or changed (round after round) before its
/// cache is retired: an apiserver replica restarting answers discovery without its CRDs' groups
/// until it has registered them, and one round that met it retired every CRD cache — every
/// watch ended, every resource relisted cold — on every replica of the proxy (a review).
pub const CONFIRM_AFTER: Duration = Duration::from_secs(3);

/// A suspicion not renewed by a round for this long is forgotten: a round much later that
/// finds the resource gone again starts over (a review: one from long before made a single
/// passing miss count as confirmed). Longer than a round may take (each of its requests may
/// take up to a minute), or a slow upstream would keep every suspicion new.
const SUSPECT_FORGET: Duration = Duration::from_secs(180);

/// Resources a rediscovery round found gone or changed, by name, with when first and last
/// found so.
#[derive(Default)]
struct Suspects(std::collections::HashMap<String, (std::time::Instant, std::time::Instant)>);

impl Suspects {
    /// Whether `name`, found gone or changed at `now`, has been so for [`CONFIRM_AFTER`]
    /// (then it is no longer a suspect: it is acted on); `None` for a new suspicion (not
    /// confirmed either: the caller has a round made again in `CONFIRM_AFTER`).
    fn confirmed(&mut self, name: &str, now: std::time::Instant) -> Option<bool> {
        let entry = self.0.entry(name.to_owned()).or_insert((now, now));
        let new = entry.0 == now || now.saturating_duration_since(entry.1) > SUSPECT_FORGET;
        if new {
            *entry = (now, now);
            return None;
        }
        entry.1 = now;
        let confirmed = now.saturating_duration_since(entry.0) >= CONFIRM_AFTER;
        if confirmed {
            self.0.remove(name);
        }
        Some(confirmed)
    }

    /// `name` was found as cached: what was found before was a passing state.
    fn cleared(&mut self, name: &str) {
        self.0.remove(name);
    }
}

/// What the first discovery gave: resources to cache, named resources missing (retried), and
/// resources a wildcard skipped.
pub struct Discovered {
    pub found: Vec<(String, ResourceKind, bool)>,
    pub missing: Vec<(String, Missing)>,
    pub skipped: Vec<Skipped>,
}

/// The first discovery of `wanted`: the named resources (see [`discover`]) and, with a
/// wildcard, everything else the upstream serves. A wildcard whose discovery fails is retried
/// by the rediscovery loop (recorded as missing under `*`, blocking readiness meanwhile).
pub async fn discover_wanted(upstream: &Upstream, wanted: &Wanted) -> Result<Discovered, String> {
    let (found, missing) = discover(upstream, &wanted.named).await?;
    let mut out = Discovered {
        found: found.into_iter().map(|(n, k)| (n, k, false)).collect(),
        missing,
        skipped: Vec::new(),
    };
    if !wanted.all {
        return Ok(out);
    }
    let excluded = |g: &str, r: &str| wanted.is_excluded(g, r) || wanted.names(g, r);
    let everything =
        tokio::time::timeout(FIRST_DISCOVERY, Round::new(upstream).everything(&excluded, &[])).await;
    match everything {
        Ok(Ok(all)) => {
            out.found.extend(all.kinds.into_iter().map(|(n, k)| (n, k, true)));
            out.skipped = all.skipped;
        }
        Ok(Err(e)) => {
            out.missing.push(("*".into(), Missing { reason: e.to_string(), blocks_readiness: true }))
        }
        Err(_) => out.missing.push((
            "*".into(),
            Missing {
                reason: format!("discovery: no answer within {FIRST_DISCOVERY:?}"),
                blocks_readiness: true,
            },
        )),
    }
    Ok(out)
}

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
    /// Found by the wildcard (follows discovery), not named.
    wild: bool,
    /// Stops its reflector (which then ends the cache's watches).
    stop: Arc<watch::Sender<bool>>,
    reader: Reader,
}

/// A cache `--cache-memory-limit` dropped: what it takes to start it again.
struct DroppedCache {
    name: String,
    kind: ResourceKind,
    wild: bool,
    /// What it measured when dropped.
    bytes: u64,
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
    /// Rung by a reflector that got 404 for its resource (and, with a wildcard, by requests
    /// for resources not cached).
    pub rediscover: Arc<Notify>,
    caches: Arc<Mutex<Vec<Cached>>>,
    /// Caches `--cache-memory-limit` dropped, by name (`memory`): not running, forwarded.
    dropped: Arc<Mutex<Vec<DroppedCache>>>,
    pub wanted: Arc<Wanted>,
    /// States loaded from `--state-dir`, each put into its cache before its reflector runs.
    warm: Option<Arc<Warm>>,
    /// Cached resources found gone or changed, not yet for [`CONFIRM_AFTER`].
    suspects: Arc<Mutex<Suspects>>,
    /// Held while a cache moves between `caches` and `dropped` (a drop, a readmission) or leaves
    /// both (a retirement): each sees the others whole.
    moves: Arc<Mutex<()>>,
    /// Kinds dropped for `--cache-memory-limit` since [`Caching::dropped_kinds`] was last
    /// asked, readmitted or not: their state files must go all the same.
    dropped_since: Arc<Mutex<Vec<ResourceKind>>>,
}

impl Caching {
    pub fn new(
        upstream: Upstream,
        cache_opts: CacheOptions,
        metrics: Arc<Metrics>,
        stop: watch::Receiver<bool>,
        reflector_opts: ReflectorOptions,
        wanted: Wanted,
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
            dropped: Arc::default(),
            wanted: Arc::new(wanted),
            warm: None,
            suspects: Arc::default(),
            dropped_since: Arc::default(),
            moves: Arc::default(),
        }
    }

    /// Fills each cache from its saved state (if one was loaded and passes its checks) before
    /// its reflector starts.
    pub fn with_warm(self, warm: Arc<Warm>) -> Caching {
        Caching { warm: Some(warm), ..self }
    }

    /// The caches running now.
    pub fn readers(&self) -> Vec<Reader> {
        self.caches.lock().iter().map(|c| c.reader.clone()).collect()
    }

    /// Creates the cache of `kind` (configured as `name`) and spawns its reflector, which stops
    /// at shutdown or when the cache is retired.
    pub fn spawn(&self, name: &str, kind: ResourceKind) -> Reader {
        self.spawn_as(name, kind, false)
    }

    fn spawn_as(&self, name: &str, kind: ResourceKind, wild: bool) -> Reader {
        tracing::info!(resource = %kind.group_resource(), version = %kind.version, namespaced = kind.namespaced, builtin = kind.builtin, "caching");
        self.metrics.cache_added(&kind.group_resource());
        let (stop, stop_rx) = watch::channel(false);
        let stop = Arc::new(stop);
        let mut shutdown = self.stop.clone();
        let on_shutdown = stop.clone();
        let mut retired = stop.subscribe();
        // Gone with the cache when it is retired (a review: one task per cache ever made lived
        // until shutdown, and caches are made again at each version change or readmission).
        tokio::spawn(async move {
            tokio::select! {
                _ = crate::shutdown::until_true(&mut shutdown) => {
                    on_shutdown.send_replace(true);
                }
                _ = retired.wait_for(|s| *s) => {}
            }
        });
        let saved = self.warm.as_ref().and_then(|w| w.take(&kind));
        let (mut writer, reader) = cache::new(kind.clone(), self.cache_opts.clone());
        self.caches.lock().push(Cached {
            name: name.to_owned(),
            kind,
            wild,
            stop: stop.clone(),
            reader: reader.clone(),
        });
        let (upstream, opts, metrics) =
            (self.upstream.clone(), self.reflector_opts.clone(), self.metrics.clone());
        let warm = self.warm.clone();
        let mut reflectors = self.reflectors.lock();
        reflectors.retain(|h| !h.is_finished());
        reflectors.push(tokio::spawn(async move {
            if let Some(saved) = saved {
                // The restore's checks are asked again while the upstream is busy: a shutdown
                // meanwhile does not wait for them (`reflector::run` then stops at once).
                let mut stop = stop_rx.clone();
                tokio::select! {
                    _ = state::restore(&upstream, &mut writer, saved, &metrics, warm.as_deref()) => {}
                    _ = crate::shutdown::until_true(&mut stop) => {}
                }
            }
            reflector::run(upstream, writer, opts, metrics, stop_rx).await
        }));
        reader
    }

    /// The caches running now, with their configured names (`memory` measures them).
    pub fn running(&self) -> Vec<(String, Reader)> {
        self.caches.lock().iter().map(|c| (c.name.clone(), c.reader.clone())).collect()
    }

    /// The caches `--cache-memory-limit` dropped, with what each measured then.
    pub fn dropped(&self) -> Vec<(String, u64)> {
        self.dropped.lock().iter().map(|d| (d.name.clone(), d.bytes)).collect()
    }

    /// The kinds of the caches `--cache-memory-limit` dropped, and of those it dropped since the
    /// last call and took back since (`state::save` removes their files: a cache taken back and
    /// not synced yet neither rewrote nor removed the state it had before the drop).
    pub fn dropped_kinds(&self) -> Vec<ResourceKind> {
        let mut kinds: Vec<ResourceKind> = self.dropped.lock().iter().map(|d| d.kind.clone()).collect();
        for k in std::mem::take(&mut *self.dropped_since.lock()) {
            if !kinds.contains(&k) {
                kinds.push(k);
            }
        }
        kinds
    }

    /// Stops caching `name` for `--cache-memory-limit` (`memory`): its requests are forwarded
    /// (reason `memory_limit`) from now on, its reflector stops and its watches end (clients
    /// re-watch, upstream); its memory goes once the reads in flight on it are answered.
    pub fn drop_for_memory(&self, name: &str, bytes: u64, why: String, catalog: &Resources) {
        let _moves = self.moves.lock();
        let mut caches = self.caches.lock();
        let Some(i) = caches.iter().position(|c| c.name == name) else { return };
        let c = caches.remove(i);
        // Released first: a readmission racing this drop sees it (`Resources::readmit`).
        c.reader.release_at_stop();
        catalog.set_dropped(&c.kind, why);
        c.stop.send_replace(true);
        let mut since = self.dropped_since.lock();
        if !since.contains(&c.kind) {
            since.push(c.kind.clone());
        }
        drop(since);
        self.dropped.lock().push(DroppedCache { name: c.name, kind: c.kind, wild: c.wild, bytes });
    }

    /// Caches the dropped `name` again. Its requests stay forwarded until it has synced, so a
    /// comeback never makes the proxy unready.
    pub fn readmit(&self, name: &str, catalog: &Arc<Resources>) {
        // From `dropped` to `caches` as one step: a retirement meanwhile found it in neither
        // (a review).
        let moving = self.moves.lock();
        let d = {
            let mut dropped = self.dropped.lock();
            let Some(i) = dropped.iter().position(|d| d.name == name) else { return };
            dropped.remove(i)
        };
        let reader = self.spawn_as(&d.name, d.kind, d.wild);
        let stop = self.caches.lock().iter().find(|c| c.name == d.name).map(|c| c.stop.subscribe());
        drop(moving);
        let (catalog, upstream) = (catalog.clone(), self.upstream.clone());
        tokio::spawn(async move {
            let Some(mut stop) = stop else { return };
            let mut progress = reader.subscribe();
            tokio::select! {
                _ = progress.wait_for(|p| p.ready) => {}
                _ = crate::shutdown::until_true(&mut stop) => return,
            }
            // Not if dropped again as it synced (`Resources::readmit`).
            if catalog.readmit(&upstream, reader) {
                tracing::info!(resource = %d.name, "back under --cache-memory-limit: served from the cache again");
            }
        });
    }

    /// Stops serving the cache configured as `name`: its requests are forwarded from now on,
    /// its reflector stops and its watches end (clients re-watch, upstream).
    fn retire(&self, name: &str, catalog: &Resources) {
        let _moves = self.moves.lock();
        self.dropped.lock().retain(|d| {
            if d.name != name {
                return true;
            }
            catalog.remove(&d.kind);
            false
        });
        let mut caches = self.caches.lock();
        caches.retain(|c| {
            if c.name != name {
                return true;
            }
            // Released before it leaves the catalog: a readmission, or a wildcard cache's late
            // sync, that was past its wait puts it back no more (`Resources::readmit`; a
            // review: the stopped cache was served, ready and frozen, until --max-staleness).
            c.reader.release_at_stop();
            catalog.remove(&c.kind);
            c.stop.send_replace(true);
            false
        });
    }

    /// Retries the discovery of `name` (1 s doubling to 30 s) until it is found, then caches
    /// it; stops at shutdown.
    pub async fn retry_discovery(self, name: String, catalog: Arc<Resources>) {
        let mut delay = Duration::from_secs(1);
        let mut stop = self.stop.clone();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = crate::shutdown::until_true(&mut stop) => return,
            }
            delay = (delay * 2).min(Duration::from_secs(30));
            match self.upstream.discover(std::slice::from_ref(&name)).await {
                Ok(kinds) => {
                    for kind in kinds {
                        let reader = self.spawn(&name, kind);
                        catalog.add(&self.upstream, reader);
                    }
                    catalog.clear_missing(&name);
                    tracing::info!(resource = %name, "discovered; now cached");
                    return;
                }
                Err(e) => match missing(&e) {
                    Ok(m) => {
                        tracing::debug!(resource = %name, error = %e, "still not discovered");
                        catalog.set_missing(&name, m);
                    }
                    Err(fatal) => {
                        tracing::error!(resource = %name, "{fatal}; not cached");
                        catalog.set_missing(&name, Missing { reason: fatal, blocks_readiness: false });
                        return;
                    }
                },
            }
        }
    }

    /// Rediscovers the cached resources every `interval` (zero: only when a reflector got 404)
    /// until shutdown; see the module doc.
    pub async fn rediscover_loop(self, interval: Duration, catalog: Arc<Resources>) {
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
                _ = crate::shutdown::until_true(&mut stop) => return,
            }
            self.rediscover_once(&catalog).await;
        }
    }

    async fn rediscover_once(&self, catalog: &Arc<Resources>) {
        let mut round = Round::new(&self.upstream);
        let cached: Vec<(String, ResourceKind)> =
            self.caches.lock().iter().filter(|c| !c.wild).map(|c| (c.name.clone(), c.kind.clone())).collect();
        for (name, kind) in cached {
            let checked = round.recheck(&name, &kind).await;
            match &checked {
                Ok(None) => self.suspects.lock().cleared(&name),
                Ok(Some(_)) | Err(UpstreamError::Discovery(_)) if !self.suspected_confirmed(&name) => {
                    continue
                }
                _ => {}
            }
            match checked.map(|k| k.map(|k| vec![k])) {
                Ok(None) => {}
                Ok(Some(now)) => {
                    tracing::warn!(resource = %name, was = %kind.version, "the upstream serves it differently now; caching it anew");
                    self.retire(&name, catalog);
                    for k in now {
                        let reader = self.spawn(&name, k);
                        catalog.add(&self.upstream, reader);
                    }
                }
                Err(e @ UpstreamError::Discovery(_)) => {
                    tracing::warn!(resource = %name, error = %e, "the upstream no longer serves it; forwarding its requests, looking for it again");
                    self.retire(&name, catalog);
                    match missing(&e) {
                        Ok(m) => catalog.set_missing(&name, m),
                        Err(fatal) => {
                            catalog.set_missing(&name, Missing { reason: fatal, blocks_readiness: false })
                        }
                    }
                    tokio::spawn(self.clone().retry_discovery(name, catalog.clone()));
                }
                // The upstream cannot be asked right now: keep the cache.
                Err(e) => tracing::debug!(resource = %name, error = %e, "rediscovery failed"),
            }
        }
        if self.wanted.all {
            self.rediscover_wildcard(&mut round, catalog).await;
        }
        self.report(catalog);
    }

    /// Retries a wildcard discovery that failed at start (1 s doubling to 30 s) until one round
    /// succeeds; stops at shutdown.
    pub async fn retry_wildcard(self, catalog: Arc<Resources>) {
        let mut delay = Duration::from_secs(1);
        let mut stop = self.stop.clone();
        while catalog.missing().contains_key("*") {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = crate::shutdown::until_true(&mut stop) => return,
            }
            delay = (delay * 2).min(Duration::from_secs(30));
            self.rediscover_wildcard(&mut Round::new(&self.upstream), &catalog).await;
            self.report(&catalog);
        }
    }

    /// Starts caching a resource the wildcard found, in service at once; if it has not synced
    /// within [`SYNC_BOUND`] it is taken out of service (forwarded, reported, not blocking
    /// `/readyz`) until it has.
    pub fn spawn_wild(&self, name: &str, kind: ResourceKind, catalog: &Arc<Resources>) -> Reader {
        let reader = self.spawn_as(name, kind, true);
        catalog.add(&self.upstream, reader.clone());
        let stop = self.caches.lock().iter().find(|c| c.name == name).map(|c| c.stop.subscribe());
        let Some(mut stop) = stop else { return reader };
        let (catalog, upstream, name, out) =
            (catalog.clone(), self.upstream.clone(), name.to_owned(), reader.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(SYNC_BOUND) => {}
                _ = crate::shutdown::until_true(&mut stop) => return,
            }
            if reader.progress().ready {
                return;
            }
            tracing::warn!(resource = %name, bound = ?SYNC_BOUND, "not synced in time; forwarding its requests until it is");
            catalog.remove(reader.kind());
            let reason = format!("not synced within {}s; forwarded until it is", SYNC_BOUND.as_secs());
            catalog.set_missing(&name, Missing { reason, blocks_readiness: false });
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    // Dropped for --cache-memory-limit or retired: not a resource waiting for
                    // its sync any more (`/readyz?verbose` and `skipped_resources` said so for
                    // good, even once it was readmitted and served).
                    _ = crate::shutdown::until_true(&mut stop) => {
                        catalog.clear_missing(&name);
                        return;
                    }
                }
                if reader.progress().ready {
                    catalog.add(&upstream, reader);
                    catalog.clear_missing(&name);
                    tracing::info!(resource = %name, "synced; now served from the cache");
                    return;
                }
            }
        });
        out
    }

    /// The wildcard's caches, running or dropped for `--cache-memory-limit` (a dropped one is
    /// not cached anew by a round, only by `readmit`).
    fn wild_caches(&self) -> Vec<(String, ResourceKind)> {
        let running: Vec<_> =
            self.caches.lock().iter().filter(|c| c.wild).map(|c| (c.name.clone(), c.kind.clone())).collect();
        let dropped: Vec<_> =
            self.dropped.lock().iter().filter(|d| d.wild).map(|d| (d.name.clone(), d.kind.clone())).collect();
        [running, dropped].concat()
    }

    /// Whether `name`, found gone or changed by this round, has been so for [`CONFIRM_AFTER`];
    /// a new suspicion has a round made again then (rounds may otherwise be minutes apart).
    fn suspected_confirmed(&self, name: &str) -> bool {
        match self.suspects.lock().confirmed(name, std::time::Instant::now()) {
            Some(confirmed) => confirmed,
            None => {
                tracing::info!(resource = %name, "rediscovery found it gone or changed; kept until a round {CONFIRM_AFTER:?} later agrees");
                let (again, mut stop) = (self.rediscover.clone(), self.stop.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        _ = tokio::time::sleep(CONFIRM_AFTER) => again.notify_one(),
                        _ = crate::shutdown::until_true(&mut stop) => {}
                    }
                });
                false
            }
        }
    }

    /// One wildcard round: caches what appeared, retires what went away or is now excluded,
    /// re-caches what changed version, and records what is skipped. A round that cannot reach
    /// the upstream changes nothing.
    async fn rediscover_wildcard(&self, round: &mut Round<'_>, catalog: &Arc<Resources>) {
        let wanted = self.wanted.clone();
        let excluded = |g: &str, r: &str| wanted.is_excluded(g, r) || wanted.names(g, r);
        let known: Vec<ResourceKind> = self.wild_caches().into_iter().map(|(_, k)| k).collect();
        let all = match round.everything(&excluded, &known).await {
            Ok(all) => all,
            Err(e) => {
                tracing::debug!(error = %e, "wildcard rediscovery failed; keeping the caches");
                return;
            }
        };
        catalog.clear_missing("*");
        let cached = self.wild_caches();
        let unread = |k: &ResourceKind| all.unread.iter().any(|(g, v)| *g == k.group && *v == k.version);
        // Cached in a group-version this round could not read: kept as is, not placed elsewhere.
        let kept: Vec<&String> = cached.iter().filter(|(_, k)| unread(k)).map(|(n, _)| n).collect();
        let mut suspected = Vec::new();
        for (name, kind) in &cached {
            if kept.contains(&name) {
                tracing::debug!(resource = %name, "its group-version's discovery failed this round; kept");
                continue;
            }
            if all.kinds.iter().any(|(n, k)| n == name && k == kind) {
                self.suspects.lock().cleared(name);
                continue;
            }
            if !self.suspected_confirmed(name) {
                suspected.push(name);
                continue;
            }
            if all.kinds.iter().any(|(n, _)| n == name) {
                tracing::warn!(resource = %name, was = %kind.version, "the upstream serves it differently now; caching it anew")
            } else {
                tracing::info!(resource = %name, "no longer served by the upstream (or excluded); forwarding its requests")
            }
            self.retire(name, catalog);
            catalog.clear_missing(name);
        }
        for (name, kind) in all.kinds {
            if !kept.contains(&&name)
                && !suspected.contains(&&name)
                && !cached.iter().any(|(n, k)| *n == name && *k == kind)
            {
                tracing::info!(resource = %name, "found by the wildcard; caching it");
                self.spawn_wild(&name, kind, catalog);
            }
        }
        for s in &all.skipped {
            tracing::debug!(resource = %s.name, reason = s.reason.as_str(), detail = %s.detail, "skipped by the wildcard");
        }
        catalog.set_skipped(all.skipped);
    }

    /// The cached/skipped metrics.
    pub fn report(&self, catalog: &Resources) {
        let skipped = catalog.skipped();
        let missing = catalog.missing();
        let count = |r: SkipReason| skipped.values().filter(|s| s.reason == r).count();
        let not_synced = missing.values().filter(|m| m.reason.starts_with("not synced within")).count();
        self.metrics.resources(
            catalog.snapshot().kinds.len(),
            &[
                (SkipReason::Forbidden.as_str(), count(SkipReason::Forbidden)),
                (SkipReason::Aggregated.as_str(), count(SkipReason::Aggregated)),
                (SkipReason::Failed.as_str(), count(SkipReason::Failed)),
                ("not_synced", not_synced),
            ],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Caching against an upstream nobody answers, an empty catalog, and the configmaps kind.
    fn configmaps_caching() -> (Caching, Upstream, Arc<Resources>, ResourceKind, watch::Sender<bool>) {
        let upstream = Upstream::new(&crate::upstream::UpstreamOptions {
            upstream: Some("http://127.0.0.1:9".into()),
            ..Default::default()
        })
        .unwrap();
        let (stop, stop_rx) = watch::channel(false);
        let caching = Caching::new(
            upstream.clone(),
            CacheOptions::default(),
            Arc::new(Metrics::new()),
            stop_rx,
            ReflectorOptions::default(),
            Wanted::default(),
        );
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        (caching, upstream, Arc::new(Resources::default()), kind, stop)
    }

    /// A retired cache is never put back in the catalog by a task that was already past its
    /// wait (a readmission after a drop, a wildcard cache's late sync).
    #[tokio::test]
    async fn a_retired_cache_is_not_put_back_in_the_catalog() {
        let (caching, upstream, catalog, kind, _stop) = configmaps_caching();
        let reader = caching.spawn("configmaps", kind.clone());
        assert!(catalog.readmit(&upstream, reader.clone()), "a running cache is added");
        caching.retire("configmaps", &catalog);
        assert!(!catalog.readmit(&upstream, reader), "retired: not added again");
        assert!(caching.readers().is_empty());
    }

    /// A cache dropped for the memory limit and taken back before the saver asked is still
    /// among the dropped kinds once: its state file goes even so.
    #[tokio::test]
    async fn a_cache_dropped_and_taken_back_between_saves_is_reported_dropped_once() {
        let (caching, upstream, catalog, kind, _stop) = configmaps_caching();
        catalog.readmit(&upstream, caching.spawn("configmaps", kind.clone()));
        caching.drop_for_memory("configmaps", 1_000, "over the limit".into(), &catalog);
        caching.readmit("configmaps", &catalog);
        assert_eq!(caching.readers().len(), 1, "running again");
        assert_eq!(caching.dropped_kinds(), std::slice::from_ref(&kind), "dropped since the last save");
        assert!(caching.dropped_kinds().is_empty(), "reported once");
        // Dropped and still dropped: reported as long as it is, once per call.
        caching.drop_for_memory("configmaps", 1_000, "over the limit".into(), &catalog);
        assert_eq!(caching.dropped_kinds(), std::slice::from_ref(&kind));
        assert_eq!(caching.dropped_kinds(), [kind]);
    }

    /// A resource found gone or changed is acted on only once found so for `CONFIRM_AFTER`,
    /// round after round; one round that finds it as cached clears what came before.
    #[test]
    fn a_resource_is_retired_only_when_rounds_agree_for_a_while() {
        let mut s = Suspects::default();
        let t = std::time::Instant::now();
        let w = "widgets.example.com";
        assert_eq!(s.confirmed(w, t), None, "one round: a replica restarting; a new suspicion");
        assert_eq!(s.confirmed(w, t + Duration::from_secs(1)), Some(false));
        assert_eq!(s.confirmed(w, t + CONFIRM_AFTER), Some(true), "still gone 3 s later");
        // Acted on: found gone again later is a new suspicion.
        assert_eq!(s.confirmed(w, t + CONFIRM_AFTER * 2), None);
        // Back in between: the time starts over.
        s.cleared(w);
        assert_eq!(s.confirmed(w, t + CONFIRM_AFTER * 3), None);
        assert_eq!(s.confirmed("gadgets.example.com", t + CONFIRM_AFTER * 4), None, "each on its own");
        assert_eq!(s.confirmed(w, t + CONFIRM_AFTER * 4), Some(true));
        // A suspicion no round renewed for long is forgotten: one miss much later is new.
        let later = t + Duration::from_secs(600);
        assert_eq!(s.confirmed("gadgets.example.com", later), None, "not confirmed by its old time");
    }
}
