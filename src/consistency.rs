//! A cache that checks itself (issue 33 item 2; the apiserver's `DetectCacheInconsistency`
//! since 1.34): every `--consistency-check-period` (jittered, with backoff after failures) and
//! once after a warm start, each cache's state at an RV it holds is compared with the
//! upstream's at that same RV — a paginated, metadata-only upstream LIST at
//! `resourceVersion=R&resourceVersionMatch=Exact`, both sides hashed as sorted
//! (namespace, name, resourceVersion). If R is already compacted upstream (410), the check is
//! retried once at the cache's current RV; compacted again (a quiet resource: its cache RV
//! moves only with its own events and bookmarks), the cache is compared with the upstream's
//! current state, as far as that tells (`against_later`).
//!
//! First, a consistent one-item LIST (sent after the cache's state was taken) tells the
//! upstream's current RV: below R, the upstream's storage went back (etcd restored from a
//! backup without `--bump-revision`) — its watch from R would wait, silently, until it issues
//! R again, for other changes. The cache is relisted (`cache::Writer::replace` takes the lower
//! list RV and ends every watch).
//!
//! On a mismatch: `watchcache_consistency_checks_total{result="inconsistent"}`, a log line
//! naming the resource and how many keys differ (never contents), and the cache asks its
//! reflector for a relist (`cache::Reader::request_relist`): not ready until then, its reads
//! forwarded, `/readyz?verbose` naming the reason.
//!
//! Spawned by `app`; reads the caches through `cache::Reader`, the upstream through
//! `upstream::Upstream`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ring::digest::{Context, SHA256};
use tokio::sync::watch;

use crate::cache::Reader;
use crate::metrics::Metrics;
use crate::resource::Rv;
use crate::upstream::{Upstream, UpstreamError};

/// Page size of the upstream metadata LISTs.
const PAGE: u32 = 500;
/// First retry after a failed round; doubles up to the period.
const BACKOFF_INITIAL: Duration = Duration::from_secs(10);

/// Keys and resourceVersions of one side, sorted.
type Keys = BTreeMap<(String, String), u64>;

/// What one check of one cache found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Same keys and RVs at `rv`.
    Consistent { rv: Rv, keys: usize },
    /// `differing` keys are missing on one side or at another RV.
    /// `lists`: the full lists the cache had installed when its state was read.
    Inconsistent { rv: Rv, differing: usize, lists: u64 },
    /// The upstream is at `upstream`, below the cache's `cache`: its storage went back.
    Behind { cache: Rv, upstream: Rv },
    /// The cache is not ready (syncing, relisting), or its RV is compacted upstream and the
    /// upstream's later state tells nothing either way: nothing to compare.
    Skipped,
    /// The upstream could not be asked.
    Failed(String),
}

impl Outcome {
    /// The `result` label of `watchcache_consistency_checks_total`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Consistent { .. } => "consistent",
            Outcome::Inconsistent { .. } => "inconsistent",
            Outcome::Behind { .. } => "upstream_behind",
            Outcome::Skipped => "skipped",
            Outcome::Failed(_) => "failed",
        }
    }
}

fn digest(keys: &Keys) -> Vec<u8> {
    let mut c = Context::new(&SHA256);
    for ((ns, name), rv) in keys {
        c.update(ns.as_bytes());
        c.update(b"\0");
        c.update(name.as_bytes());
        c.update(b"\0");
        c.update(&rv.to_le_bytes());
    }
    c.finish().as_ref().to_vec()
}

/// Keys present on one side only or at another RV.
fn differing(a: &Keys, b: &Keys) -> usize {
    let one_way = a.iter().filter(|(k, rv)| b.get(*k) != Some(*rv)).count();
    one_way + b.keys().filter(|k| !a.contains_key(*k)).count()
}

async fn upstream_keys(upstream: &Upstream, reader: &Reader, rv: Rv) -> Result<Keys, UpstreamError> {
    let mut keys = Keys::new();
    let mut token: Option<String> = None;
    let mut pages = crate::upstream::Pages::default();
    loop {
        let page = upstream.list_metadata_exact(reader.kind(), rv, PAGE, token.as_deref()).await?;
        pages.check(page.rv, page.continue_token.as_deref())?;
        keys.extend(page.items.into_iter().map(|(ns, name, r)| ((ns, name), r.0)));
        match page.continue_token {
            Some(t) => token = Some(t),
            None => return Ok(keys),
        }
    }
}

/// Compares `reader`'s state at its current RV with the upstream's at the same RV.
pub async fn check(upstream: &Upstream, reader: &Reader) -> Outcome {
    let mut retried = false;
    // The upstream's current RV, from the probe.
    let mut now = Rv(0);
    loop {
        if !reader.progress().ready {
            return Outcome::Skipped;
        }
        let snap = reader.snapshot();
        // Dropped for --cache-memory-limit: the snapshot may be of the emptied cache.
        if reader.released() {
            return Outcome::Skipped;
        }
        if !retried {
            // Sent after the snapshot: at or past every RV the upstream issued before it.
            match upstream.list_page(reader.kind(), 1, None, None).await {
                Ok(page) if page.rv < snap.rv => {
                    return Outcome::Behind { cache: snap.rv, upstream: page.rv }
                }
                Ok(page) => now = page.rv,
                Err(e) => return Outcome::Failed(e.to_string()),
            }
        }
        let mine: Keys = snap
            .store
            .values()
            .map(|o| ((o.header.namespace().to_owned(), o.header.name().to_owned()), o.header.rv.0))
            .collect();
        let up = match upstream_keys(upstream, reader, snap.rv).await {
            Ok(k) => k,
            // R was compacted upstream meanwhile: once more at the cache's current RV.
            Err(e) if e.is_gone() && !retried => {
                retried = true;
                continue;
            }
            // Still compacted: a quiet resource, whose cache RV moves only with its events
            // and bookmarks, can stay behind the upstream's compaction for minutes.
            Err(e) if e.is_gone() && now >= snap.rv => {
                return match upstream_keys(upstream, reader, now).await {
                    Ok(later) => against_later(&mine, snap.rv, &later, snap.lists),
                    Err(e) => Outcome::Failed(e.to_string()),
                };
            }
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        if digest(&mine) == digest(&up) {
            return Outcome::Consistent { rv: snap.rv, keys: mine.len() };
        }
        return Outcome::Inconsistent { rv: snap.rv, differing: differing(&mine, &up), lists: snap.lists };
    }
}

/// The cache's keys at `rv` against the upstream's at a later RV, when `rv` itself is
/// compacted upstream. An upstream object at a version at or below `rv` that the cache lacks
/// or holds at another version: inconsistent, whatever happened since (it was there,
/// unchanged, at `rv`). Anything else cannot be told: skipped, checked again at the next
/// period — not even the same keys prove the cache right, since an object the cache missed
/// may have been deleted since (a later list does not show it).
fn against_later(mine: &Keys, rv: Rv, later: &Keys, lists: u64) -> Outcome {
    let wrong = later.iter().filter(|(k, v)| **v <= rv.0 && mine.get(*k) != Some(*v)).count();
    if wrong > 0 {
        Outcome::Inconsistent { rv, differing: wrong, lists }
    } else {
        Outcome::Skipped
    }
}

/// One round over `readers`; returns the resources whose check could not be made (the
/// upstream failed it), to be checked again after a backoff — only them.
pub async fn round(upstream: &Upstream, readers: &[Reader], metrics: &Metrics) -> Vec<String> {
    let mut failed = Vec::new();
    for r in readers {
        let resource = r.kind().group_resource();
        let outcome = check(upstream, r).await;
        metrics.consistency_check(&resource, outcome.as_str());
        match outcome {
            Outcome::Consistent { rv, keys } => {
                metrics.consistency_differences(&resource, 0);
                tracing::debug!(resource, rv = %rv, keys, "consistency check: the cache matches the upstream");
            }
            Outcome::Inconsistent { rv, differing, lists } => {
                metrics.consistency_differences(&resource, differing);
                tracing::warn!(resource, rv = %rv, differing, "consistency check: the cache differs from the upstream at the same resourceVersion; forwarding its reads until a relist rebuilds it");
                r.request_relist(rv, lists, format!(
                    "inconsistent with the upstream at resourceVersion {rv}: {differing} keys differ; relisting"
                ));
            }
            Outcome::Behind { cache, upstream } => r.upstream_went_back(cache, upstream, "consistency check"),
            Outcome::Skipped => {}
            Outcome::Failed(e) => {
                tracing::debug!(resource, error = %e, "consistency check failed; retrying with backoff");
                failed.push(resource);
            }
        }
    }
    failed
}

/// `period` × a random factor in [1, 1.1): checks of many replicas do not line up.
fn jittered(period: Duration) -> Duration {
    period.mul_f64(1.0 + fastrand::f64() / 10.0)
}

/// How long the first round after a warm start waits for the caches to be ready, all together.
const READY_WAIT: Duration = Duration::from_secs(60);

/// Returns once every cache is ready or unservable (it will not be ready for long), or `wait`
/// has passed — one wait for all, not one per cache: ten caches still syncing do not hold the
/// first round ten minutes.
async fn settled(readers: &[Reader], wait: Duration) {
    let deadline = tokio::time::Instant::now() + wait;
    for r in readers {
        let mut rx = r.subscribe();
        let _ = tokio::time::timeout_at(deadline, rx.wait_for(|p| p.ready || p.unservable)).await;
    }
}

/// Checks every `period` (0: never) until `stop`; the first round at once when `now` (after a
/// warm start, once the caches are ready or [`READY_WAIT`] has passed).
pub async fn run(
    upstream: Upstream,
    readers: impl Fn() -> Vec<Reader>,
    period: Duration,
    now: bool,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    if period.is_zero() {
        return;
    }
    if now {
        let caches = readers();
        tokio::select! {
            _ = settled(&caches, READY_WAIT) => {}
            _ = crate::shutdown::until_true(&mut stop) => return,
        }
    }
    let mut wait = if now { Duration::ZERO } else { jittered(period) };
    let mut backoff = BACKOFF_INITIAL.min(period);
    // After a round with failures, only the failed resources are checked again, after a
    // jittered backoff, while the full rounds keep their period (a review: one 429 re-checked
    // every cache at 10, 20, 40… s — more Exact LISTs for an upstream already shedding load).
    let mut retry: Vec<String> = Vec::new();
    let mut next_full = tokio::time::Instant::now() + wait;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = crate::shutdown::until_true(&mut stop) => return,
        }
        let full = retry.is_empty() || tokio::time::Instant::now() >= next_full;
        let mut caches = readers();
        if full {
            next_full = tokio::time::Instant::now() + jittered(period);
        } else {
            caches.retain(|r| retry.contains(&r.kind().group_resource()));
        }
        retry = round(&upstream, &caches, &metrics).await;
        if retry.is_empty() {
            backoff = BACKOFF_INITIAL.min(period);
            wait = next_full.saturating_duration_since(tokio::time::Instant::now());
        } else {
            wait = backoff.mul_f64(1.0 + fastrand::f64() / 2.0).min(period);
            backoff = (backoff * 2).min(period);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(v: &[(&str, &str, u64)]) -> Keys {
        v.iter().map(|(n, m, r)| ((n.to_string(), m.to_string()), *r)).collect()
    }

    /// The cache at 10 against the upstream's state at 20 (10 compacted): only what is certain.
    #[test]
    fn a_later_upstream_state_convicts_only_what_was_there_unchanged() {
        let mine = keys(&[("n", "a", 5), ("n", "b", 7)]);
        // The same keys: an object the cache missed may have been deleted since; b changed at
        // 15, c added at 18, a deleted since: events on their way, perhaps.
        for later in [
            mine.clone(),
            keys(&[("n", "a", 5), ("n", "b", 15)]),
            keys(&[("n", "a", 5), ("n", "b", 7), ("n", "c", 18)]),
            keys(&[("n", "b", 7)]),
        ] {
            assert_eq!(against_later(&mine, Rv(10), &later, 1), Outcome::Skipped, "{later:?}");
        }
        // a at 9 upstream, unchanged since 9 (so at 10 too): the cache's a at 5 is wrong; so
        // is missing d, there since 3.
        let later = keys(&[("n", "a", 9), ("n", "b", 7), ("n", "d", 3), ("n", "e", 12)]);
        assert_eq!(
            against_later(&mine, Rv(10), &later, 4),
            Outcome::Inconsistent { rv: Rv(10), differing: 2, lists: 4 }
        );
    }

    #[test]
    fn a_changed_a_missing_and_an_extra_key_are_three_differences() {
        let a = keys(&[("n", "a", 1), ("n", "b", 2), ("n", "c", 3)]);
        let b = keys(&[("n", "a", 1), ("n", "b", 5), ("n", "d", 4)]);
        assert_eq!(differing(&a, &b), 3);
        assert_eq!(differing(&a, &a), 0);
        assert_ne!(digest(&a), digest(&b));
        assert_eq!(digest(&a), digest(&a.clone()));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(digest(&keys(&[("ab", "c", 1)])), digest(&keys(&[("a", "bc", 1)])));
    }

    /// The first round's wait for the caches is one for all: two caches that never become
    /// ready hold it `READY_WAIT`, not twice that; a ready and an unservable one not at all.
    #[tokio::test(start_paused = true)]
    async fn the_wait_for_ready_caches_is_one_for_all() {
        let kind = crate::resource::ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let syncing = || crate::cache::new(kind.clone(), Default::default());
        let (_w1, a) = syncing();
        let (_w2, b) = syncing();
        let start = tokio::time::Instant::now();
        settled(&[a, b], READY_WAIT).await;
        assert_eq!(start.elapsed(), READY_WAIT);

        let (_ready, ready) = crate::server::phase::testing::configmaps();
        let (mut bad, unservable) = syncing();
        bad.unparsable("an object the cache cannot parse".into());
        let start = tokio::time::Instant::now();
        settled(&[ready, unservable], READY_WAIT).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[test]
    fn jitter_stays_within_a_tenth_above_the_period() {
        let p = Duration::from_secs(300);
        for _ in 0..100 {
            let j = jittered(p);
            assert!(j >= p && j < p.mul_f64(1.1), "{j:?}");
        }
    }
}
