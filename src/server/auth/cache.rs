//! A bounded TTL cache whose misses are coalesced: concurrent lookups of one key share one
//! fetch (one TokenReview / SubjectAccessReview upstream), and each answer lives for the TTL the
//! fetch chose (success and failure differ). Failed fetches (upstream unreachable) are not
//! cached. When full, expired entries go first, then the least recently used eighth.
//!
//! Used by `auth::authn` (token hash → user) and `auth::authz` (user + attributes → decision).

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::OnceCell;
use tokio::time::Instant;

struct Slot<V> {
    cell: OnceCell<(V, Instant)>,
    used: AtomicU64,
    /// The admission its creator was given, for whichever caller runs the first fetch (a
    /// waiter may get to it first).
    admitted: AtomicBool,
}

struct Map<K, V> {
    entries: HashMap<K, Arc<Slot<V>>>,
    tick: u64,
}

/// See the module doc.
pub struct TtlCache<K, V> {
    map: Mutex<Map<K, V>>,
    capacity: usize,
}

/// Whether a lookup was answered from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Hit,
    Miss,
}

impl<K: Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    pub fn new(capacity: usize) -> TtlCache<K, V> {
        TtlCache { map: Mutex::new(Map { entries: HashMap::new(), tick: 0 }), capacity: capacity.max(1) }
    }

    pub fn len(&self) -> usize {
        self.map.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cached value of `key`, or the result of `fetch` (shared with concurrent callers of
    /// the same key), kept for the TTL `fetch` returns.
    pub async fn get_or_fetch<F, Fut, E>(&self, key: K, fetch: F) -> Result<(V, Lookup), E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(V, Duration), E>>,
    {
        self.get_or_fetch_admitted(key, || Ok(()), fetch).await
    }

    /// [`TtlCache::get_or_fetch`], where a fetch must first be `admit`ted (a review rate
    /// bound): asked, under the map's lock, only when no live or in-flight slot has `key`,
    /// before a slot is made. Refused, nothing is inserted, nothing pushed out: made first, a
    /// flood of requests past their rate made room for slots they then removed, and each at
    /// capacity pushed an eighth of the live entries out — other users' decisions, whose
    /// renewals then cost reviews (found by a review).
    pub async fn get_or_fetch_admitted<A, F, Fut, E>(
        &self,
        key: K,
        admit: A,
        fetch: F,
    ) -> Result<(V, Lookup), E>
    where
        A: FnOnce() -> Result<(), E>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(V, Duration), E>>,
    {
        let now = Instant::now();
        let owned = key.clone();
        // Asked once: when a slot is made (its first fetch runs on that admission, whoever runs
        // it: a waiter may get there before the creator), or — joining one in flight whose
        // fetch then fails, when the cell has this caller fetch in turn — before that fetch (a
        // review: the waiters piled on a failing review each sent their own, none counted).
        let mut admit = Some(admit);
        let slot = {
            let mut m = self.map.lock();
            m.tick += 1;
            let tick = m.tick;
            match m.entries.get(&key) {
                Some(s) if s.cell.get().is_none_or(|(_, exp)| *exp > now) => {
                    s.used.store(tick, Ordering::Relaxed);
                    s.clone()
                }
                _ => {
                    admit.take().map_or(Ok(()), |a| a())?;
                    m.make_room(self.capacity, now);
                    let s = Arc::new(Slot {
                        cell: OnceCell::new(),
                        used: AtomicU64::new(tick),
                        admitted: AtomicBool::new(true),
                    });
                    m.entries.insert(key, s.clone());
                    s
                }
            }
        };
        let fetched = AtomicBool::new(false);
        let got = slot
            .cell
            .get_or_try_init(|| async {
                // The creator's admission for the first fetch, whoever runs it; a later one
                // (after a failed fetch) is admitted on its own.
                if !slot.admitted.swap(false, Ordering::AcqRel) {
                    admit.take().map_or(Ok(()), |a| a())?;
                }
                fetched.store(true, Ordering::Relaxed);
                let (v, ttl) = fetch().await?;
                Ok((v, Instant::now() + ttl))
            })
            .await;
        let (v, _) = match got {
            Ok(v) => v,
            Err(e) => {
                // A failed fetch leaves no slot behind: an empty one would count as in flight
                // for ever, and a flood of failing keys would push live entries out.
                let mut m = self.map.lock();
                if m.entries.get(&owned).is_some_and(|s| Arc::ptr_eq(s, &slot) && s.cell.get().is_none()) {
                    m.entries.remove(&owned);
                }
                return Err(e);
            }
        };
        let how = if fetched.load(Ordering::Relaxed) { Lookup::Miss } else { Lookup::Hit };
        Ok((v.clone(), how))
    }
}

impl<K: Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    /// The cached value of `key` if there is a live one (no fetch, no coalescing).
    pub fn peek(&self, key: &K) -> Option<V> {
        let now = Instant::now();
        let m = self.map.lock();
        let (v, exp) = m.entries.get(key)?.cell.get()?;
        (*exp > now).then(|| v.clone())
    }

    /// Forgets `key`'s value.
    pub fn remove(&self, key: &K) {
        self.map.lock().entries.remove(key);
    }

    /// Stores `value` for `ttl`, replacing what `key` had.
    pub fn insert(&self, key: K, value: V, ttl: Duration) {
        let now = Instant::now();
        let mut m = self.map.lock();
        m.tick += 1;
        let tick = m.tick;
        m.make_room(self.capacity, now);
        let cell = OnceCell::new_with(Some((value, now + ttl)));
        m.entries.insert(
            key,
            Arc::new(Slot { cell, used: AtomicU64::new(tick), admitted: AtomicBool::new(false) }),
        );
    }
}

impl<K: Hash + Eq + Clone, V> Map<K, V> {
    fn make_room(&mut self, capacity: usize, now: Instant) {
        if self.entries.len() < capacity {
            return;
        }
        self.entries.retain(|_, s| s.cell.get().is_none_or(|(_, exp)| *exp > now));
        if self.entries.len() < capacity {
            return;
        }
        let mut by_use: Vec<(u64, K)> =
            self.entries.iter().map(|(k, s)| (s.used.load(Ordering::Relaxed), k.clone())).collect();
        by_use.sort_unstable_by_key(|(u, _)| *u);
        let drop = (capacity / 8).max(1).max(self.entries.len() + 1 - capacity);
        for (_, k) in by_use.into_iter().take(drop) {
            self.entries.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[tokio::test(start_paused = true)]
    async fn values_expire_after_their_ttl() {
        let c: TtlCache<&str, u32> = TtlCache::new(10);
        let ok = |v: u32, s: u64| async move { Ok::<_, ()>((v, Duration::from_secs(s))) };
        assert_eq!(c.get_or_fetch("a", || ok(1, 10)).await, Ok((1, Lookup::Miss)));
        assert_eq!(c.get_or_fetch("a", || ok(2, 10)).await, Ok((1, Lookup::Hit)));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(c.get_or_fetch("a", || ok(3, 10)).await, Ok((3, Lookup::Miss)));
    }

    #[tokio::test(start_paused = true)]
    async fn peek_and_insert() {
        let c: TtlCache<&str, u32> = TtlCache::new(2);
        assert_eq!(c.peek(&"a"), None);
        c.insert("a", 1, Duration::from_secs(5));
        assert_eq!(c.peek(&"a"), Some(1));
        c.insert("b", 2, Duration::from_secs(5));
        c.insert("c", 3, Duration::from_secs(5));
        assert!(c.len() <= 2, "bounded");
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(c.peek(&"c"), None, "expired");
    }

    #[tokio::test(start_paused = true)]
    async fn errors_are_not_cached() {
        let c: TtlCache<&str, u32> = TtlCache::new(10);
        assert_eq!(c.get_or_fetch("a", || async { Err::<(u32, Duration), _>("down") }).await, Err("down"));
        assert!(c.is_empty(), "no empty slot left behind");
        let r = c.get_or_fetch("a", || async { Ok::<_, &str>((7, Duration::from_secs(1))) }).await;
        assert_eq!(r, Ok((7, Lookup::Miss)));
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_misses_share_one_fetch() {
        let c: Arc<TtlCache<&str, u32>> = Arc::new(TtlCache::new(10));
        let calls = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let (c, calls) = (c.clone(), calls.clone());
            tasks.push(tokio::spawn(async move {
                c.get_or_fetch("k", || async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, ()>((5, Duration::from_secs(60)))
                })
                .await
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap().0, 5);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_and_least_recently_used_goes_first() {
        let c: TtlCache<u32, u32> = TtlCache::new(8);
        let ok = |v: u32| async move { Ok::<_, ()>((v, Duration::from_secs(60))) };
        for k in 0..8 {
            c.get_or_fetch(k, || ok(k)).await.unwrap();
        }
        c.get_or_fetch(0, || ok(0)).await.unwrap(); // 0 is now the most recent
        c.get_or_fetch(100, || ok(100)).await.unwrap();
        assert!(c.len() <= 8);
        assert_eq!(c.get_or_fetch(0, || ok(99)).await.unwrap(), (0, Lookup::Hit));
        assert_eq!(c.get_or_fetch(1, || ok(99)).await.unwrap(), (99, Lookup::Miss), "1 was evicted");
    }

    /// A fetch refused its admission (a review rate spent) inserts nothing and pushes no live
    /// entry out, even at capacity; a live entry is served without asking for admission.
    #[tokio::test]
    async fn a_refused_admission_leaves_the_cache_as_it_was() {
        let c: TtlCache<u32, u32> = TtlCache::new(8);
        let ok = |v: u32| async move { Ok::<_, ()>((v, Duration::from_secs(60))) };
        for k in 0..8 {
            c.get_or_fetch(k, || ok(k)).await.unwrap();
        }
        for k in 100..1100 {
            let got = c.get_or_fetch_admitted(k, || Err(()), || ok(k)).await;
            assert_eq!(got, Err(()));
        }
        assert_eq!(c.len(), 8);
        for k in 0..8 {
            let refused = || -> Result<(), ()> { panic!("a hit asks for no admission") };
            assert_eq!(
                c.get_or_fetch_admitted(k, refused, || ok(99)).await.unwrap(),
                (k, Lookup::Hit),
                "kept"
            );
        }
    }

    /// A caller that joined a fetch in flight and has to fetch in turn once it failed (the
    /// upstream failing the review) is admitted first, as the first was: the waiters piled on a
    /// failing review each sent their own, none counted (a review).
    #[tokio::test(start_paused = true)]
    async fn a_waiter_fetching_after_a_failed_fetch_is_admitted_too() {
        let c: TtlCache<u32, u32> = TtlCache::new(8);
        let admitted = AtomicUsize::new(0);
        let admit = || {
            admitted.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ()>(())
        };
        let failing = || async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Err::<(u32, Duration), ()>(())
        };
        let (a, b) = tokio::join!(
            c.get_or_fetch_admitted(1, admit, failing),
            c.get_or_fetch_admitted(1, admit, failing)
        );
        assert_eq!((a, b), (Err(()), Err(())));
        assert_eq!(admitted.load(Ordering::SeqCst), 2, "each fetch was admitted");
    }
}
