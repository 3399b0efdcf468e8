//! The cached resources the server answers for. It grows while the proxy runs: a resource
//! whose discovery failed at start (upstream not up yet, CRD not installed) is added once a
//! retry finds it; until then its requests are forwarded and `/readyz` says why it is missing.
//!
//! A resource `--cache-memory-limit` stopped caching is marked dropped (`set_dropped`): its
//! requests are forwarded with their own reason and `/readyz?verbose` names it.
//!
//! Written by `app` (initial caches, then the discovery retries) and `caches` (retirements,
//! drops for the memory limit); read by `Server` on every request through a cheap `Arc`
//! snapshot.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use super::consistent::Prober;
use crate::cache::Reader;
use crate::resource::ResourceKind;
use crate::upstream::{Skipped, Upstream};

/// The least time between two rediscoveries rung by requests for resources not cached: a
/// caller naming random resources costs at most one discovery round per this.
const MISS_RING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// (group, version, resource).
pub type Key = (String, String, String);

fn key_of(kind: &ResourceKind) -> Key {
    (kind.group.clone(), kind.version.clone(), kind.resource.clone())
}

/// One snapshot of the cached resources.
#[derive(Default)]
pub struct Catalog {
    pub kinds: Vec<Arc<ResourceKind>>,
    pub caches: HashMap<Key, (Reader, Arc<Prober>)>,
    /// Resources not cached because of `--cache-memory-limit` (`memory`): their requests are
    /// forwarded with the reason `memory_limit`; `/readyz?verbose` names them. By key: their
    /// `group/resource` and why.
    pub dropped: HashMap<Key, (String, String)>,
}

/// A configured resource not cached yet.
#[derive(Clone, Debug)]
pub struct Missing {
    pub reason: String,
    /// Whether `/readyz` fails for it: yes while the upstream cannot be asked; no for a
    /// resource the upstream says does not exist (a CRD not installed yet must not keep every
    /// replica out of service).
    pub blocks_readiness: bool,
}

/// The growing set of cached resources.
#[derive(Default)]
pub struct Resources {
    current: RwLock<Arc<Catalog>>,
    missing: Mutex<BTreeMap<String, Missing>>,
    /// What a `--resources` wildcard found and does not cache, by name.
    skipped: Mutex<BTreeMap<String, Skipped>>,
    /// With a wildcard: rung (at most every [`MISS_RING_INTERVAL`]) when a request names a
    /// resource that is not cached, so that a CRD installed a moment ago is cached at once.
    on_miss: Mutex<Option<OnMiss>>,
}

/// What a request for a resource not cached may ring (wildcard mode).
struct OnMiss {
    rediscover: Arc<Notify>,
    wanted: Arc<crate::wanted::Wanted>,
    last: Option<tokio::time::Instant>,
}

impl Resources {
    /// The cached resources now.
    pub fn snapshot(&self) -> Arc<Catalog> {
        self.current.read().clone()
    }

    /// Starts answering for `reader`'s resource (a new cache: never released, so always).
    pub fn add(&self, upstream: &Upstream, reader: Reader) {
        self.readmit(upstream, reader);
    }

    /// As [`Resources::add`], for a cache taken back after `--cache-memory-limit` dropped it,
    /// unless it was dropped again meanwhile: checked under the catalog's lock, which the
    /// drop's [`Resources::set_dropped`] takes after `Reader::release_at_stop`, so either this
    /// comes first and the drop replaces it, or it sees the release and leaves the drop's
    /// marker. Returns whether it was added.
    pub fn readmit(&self, upstream: &Upstream, reader: Reader) -> bool {
        let kind = reader.kind().clone();
        let prober = Prober::new(upstream.clone(), reader.clone());
        let key = key_of(&kind);
        self.update_if(&key, |next| {
            if reader.released() {
                return false;
            }
            next.kinds.push(Arc::new(kind));
            next.caches.insert(key.clone(), (reader, prober));
            true
        })
    }

    /// Stops answering for `kind`'s resource (its requests are forwarded from now on).
    pub fn remove(&self, kind: &ResourceKind) {
        self.update(&key_of(kind), |_| {});
    }

    /// Stops answering for `kind`'s resource because of `--cache-memory-limit`, saying `why`.
    pub fn set_dropped(&self, kind: &ResourceKind, why: String) {
        let key = key_of(kind);
        self.update(&key, |next| {
            next.dropped.insert(key.clone(), (kind.group_resource(), why));
        });
    }

    /// Replaces the snapshot by a copy without `key`'s resource (cached or dropped), then
    /// changed by `change`.
    fn update(&self, key: &Key, change: impl FnOnce(&mut Catalog)) {
        self.update_if(key, |next| {
            change(next);
            true
        });
    }

    /// As [`Self::update`] when `change` returns true; otherwise nothing changes.
    fn update_if(&self, key: &Key, change: impl FnOnce(&mut Catalog) -> bool) -> bool {
        let mut cur = self.current.write();
        let mut next =
            Catalog { kinds: cur.kinds.clone(), caches: cur.caches.clone(), dropped: cur.dropped.clone() };
        next.kinds.retain(|k| key_of(k) != *key);
        next.caches.remove(key);
        next.dropped.remove(key);
        if !change(&mut next) {
            return false;
        }
        *cur = Arc::new(next);
        true
    }

    /// Records why the configured resource `name` is not cached (yet).
    pub fn set_missing(&self, name: &str, missing: Missing) {
        self.missing.lock().insert(name.to_owned(), missing);
    }

    pub fn clear_missing(&self, name: &str) {
        self.missing.lock().remove(name);
    }

    /// The configured resources not cached, by name.
    pub fn missing(&self) -> BTreeMap<String, Missing> {
        self.missing.lock().clone()
    }

    /// Replaces what the wildcard skipped.
    pub fn set_skipped(&self, skipped: Vec<Skipped>) {
        *self.skipped.lock() = skipped.into_iter().map(|s| (s.name.clone(), s)).collect();
    }

    /// What the wildcard skipped, by name.
    pub fn skipped(&self) -> BTreeMap<String, Skipped> {
        self.skipped.lock().clone()
    }

    /// Has [`Resources::missed`] ring `rediscover` (wildcard mode).
    pub fn rediscover_on_miss(&self, rediscover: Arc<Notify>, wanted: Arc<crate::wanted::Wanted>) {
        *self.on_miss.lock() = Some(OnMiss { rediscover, wanted, last: None });
    }

    /// A request named `group/resource`, which is not cached: with a wildcard, ask for a
    /// rediscovery (at most once per [`MISS_RING_INTERVAL`]), unless it is excluded or known to
    /// be skipped (an aggregated API's requests never ring).
    pub fn missed(&self, group: &str, resource: &str) {
        let mut on_miss = self.on_miss.lock();
        let Some(m) = on_miss.as_mut() else { return };
        if m.wanted.is_excluded(group, resource)
            || self.skipped.lock().contains_key(&crate::upstream::name_of(group, resource))
        {
            return;
        }
        let now = tokio::time::Instant::now();
        if m.last.is_none_or(|l| now.duration_since(l) >= MISS_RING_INTERVAL) {
            m.last = Some(now);
            m.rediscover.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{self, CacheOptions};
    use crate::upstream::UpstreamOptions;

    #[tokio::test]
    async fn a_readmission_after_the_cache_was_dropped_again_leaves_it_dropped() {
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let upstream = Upstream::new(&UpstreamOptions {
            upstream: Some("http://127.0.0.1:9".into()),
            ..Default::default()
        })
        .unwrap();
        let resources = Resources::default();
        let (_w, taken_back) = cache::new(kind.clone(), CacheOptions::default());
        assert!(resources.readmit(&upstream, taken_back.clone()), "not dropped: served again");
        assert!(resources.snapshot().caches.contains_key(&key_of(&kind)));
        // As `Caches::drop_for_memory`: released, then marked dropped; a readmission of the
        // same cache coming after that (its sync and the drop ready at once) changes nothing.
        taken_back.release_at_stop();
        resources.set_dropped(&kind, "over the limit".into());
        assert!(!resources.readmit(&upstream, taken_back));
        let now = resources.snapshot();
        assert!(!now.caches.contains_key(&key_of(&kind)), "a released cache is never served");
        assert!(now.dropped.contains_key(&key_of(&kind)), "the drop's marker stays");
    }
}
