//! What one resource's cache keeps in memory, for `--cache-memory-limit`: the current objects
//! (each one's JSON, parsed header and the metadata-only / protobuf forms made so far, plus the
//! store's per-entry share) and the history's share (every event's frames, less what their
//! objects share with them, and the object versions only the history still holds: superseded
//! and deleted ones, each counted once).
//! Objects the store holds are counted with the store, never again with the history.
//!
//! A list that would take the caches past the limit is refused while it arrives ([`Budget`]):
//! the reflector accounts it page by page ([`ListAccount`]), together with every other list in
//! flight (the caches start listing at once), so that a resource larger than the room left is
//! never held whole (the governor then makes room or drops it).
//!
//! Called by `memory` (the governor) through [`Reader::memory`], [`Reader::limit_history`],
//! [`Reader::unlimit_history`] and [`Reader::refused_list`], by `caches` through
//! [`Reader::release_at_stop`], and by `reflector` through `Writer::list_account` and
//! `Writer::stopped`. The lock is held only to take the store's O(1) snapshot and to clone
//! the history's event pointers, 4 096 at a time; the counting happens outside it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use super::{Reader, Store, Writer};
use crate::resource::{Event, Object, Rv};

/// A store entry's share of the ordered map (key and value pointers, node slack).
pub(super) const STORE_ENTRY: usize = 64;
/// A history slot (its time and pointer) with the ring buffer's slack.
const HISTORY_SLOT: usize = 32;
/// Event pointers copied per hold of the cache's lock while measuring.
const MEASURE_CHUNK: usize = 4096;

/// One cache's memory now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes of the current objects.
    pub objects: u64,
    /// Bytes only the history keeps.
    pub history: u64,
    /// Events in the history.
    pub events: usize,
    /// The most events the history keeps now (lower than configured while shortened).
    pub history_cap: usize,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.objects + self.history
    }
}

/// `--cache-memory-limit` as the caches see it: the limit, the caches' total at the last
/// measurement, and the governor's bell.
#[derive(Debug, Default)]
pub struct Budget {
    pub limit: u64,
    measured: AtomicU64,
    /// Bytes lists in flight have brought so far (all caches).
    listing: AtomicU64,
    /// Rung after every full list and every refused one: the governor measures at once.
    pub check: Notify,
}

impl Budget {
    pub fn new(limit: u64) -> Budget {
        Budget { limit, ..Budget::default() }
    }

    /// The caches' total, as the governor last measured it (less what it then dropped).
    pub fn set_measured(&self, total: u64) {
        self.measured.store(total, Ordering::Relaxed);
    }

    pub fn measured(&self) -> u64 {
        self.measured.load(Ordering::Relaxed)
    }
}

/// One full list's bytes, counted against the [`Budget`] while it arrives; what it counted
/// leaves the lists in flight when it is dropped (installed, refused or failed).
pub struct ListAccount {
    budget: Option<Arc<Budget>>,
    shared: Arc<super::Shared>,
    listed: u64,
}

impl ListAccount {
    /// Counts `bytes` more; false when the caches' measured total, less what this cache holds
    /// now (a relist replaces it), plus every list in flight passes the limit. `whole`: what
    /// the whole list is expected to bring (the bytes so far scaled by the items still to come;
    /// no more than counted when the upstream does not say). The refusal is recorded — the
    /// governor counts this cache at the larger of the two, so that it weighs a half-listed
    /// resource at its size, not at the pages that came before the refusal — and rings the
    /// governor. Always true without a limit.
    pub fn add(&mut self, bytes: u64, whole: u64) -> bool {
        self.listed += bytes;
        let Some(budget) = &self.budget else { return true };
        let listing = budget.listing.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let own = self.shared.kept.load(Ordering::Relaxed);
        if budget.measured().saturating_sub(own) + listing <= budget.limit {
            return true;
        }
        self.shared.refused.store(self.listed.max(whole), Ordering::Relaxed);
        budget.check.notify_one();
        false
    }

    /// Counts, before a relist asked for whole is sent, as much as this cache holds now (its
    /// expected size): such a list arrives whole before it can be counted, and every cache
    /// relisting at once (after an apiserver restart) would each hold one before any was
    /// counted (a review). False, nothing counted, when it would pass the limit
    /// ([`ListAccount::add`]'s rule); always true without one.
    pub fn reserve_its_size(&mut self) -> bool {
        let own = self.shared.kept.load(Ordering::Relaxed);
        self.budget.is_none() || self.try_add(own)
    }

    /// Counts `more` bytes if they fit beside the caches and every list in flight (the rule
    /// of [`ListAccount::add`]), without recording a refusal: a relist asked for whole counts
    /// its answer so as it arrives and, past the room, stops reading and lists paged, refused
    /// there page by page (a resource that grew while the watch was down arrived whole before
    /// it was counted; a first cap at the room as it stood let caches relisting together each
    /// read up to the same room — two reviews). Always true without a limit.
    pub fn try_add(&mut self, more: u64) -> bool {
        let Some(budget) = &self.budget else {
            self.listed += more;
            return true;
        };
        let own = self.shared.kept.load(Ordering::Relaxed);
        let listing = budget.listing.fetch_add(more, Ordering::Relaxed) + more;
        if budget.measured().saturating_sub(own) + listing <= budget.limit {
            self.listed += more;
            true
        } else {
            budget.listing.fetch_sub(more, Ordering::Relaxed);
            false
        }
    }

    /// The whole list came to `bytes`: counted at that instead of what was reserved; false
    /// when what it brings beyond the reservation passes the limit ([`ListAccount::add`]).
    pub fn settle(&mut self, bytes: u64) -> bool {
        match bytes.checked_sub(self.listed) {
            Some(more) => self.add(more, bytes),
            None => {
                if let Some(budget) = &self.budget {
                    budget.listing.fetch_sub(self.listed - bytes, Ordering::Relaxed);
                }
                self.listed = bytes;
                true
            }
        }
    }

    /// What a refused list is counted at ([`ListAccount::add`]'s record).
    pub fn refused_at(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// Bytes counted so far.
    pub fn listed(&self) -> u64 {
        self.listed
    }

    /// The list was installed: until the governor measures again, the caches' total counts it
    /// in place of what the cache held before.
    pub fn installed(self) {
        if let Some(budget) = &self.budget {
            let own = self.shared.kept.swap(self.listed, Ordering::Relaxed);
            budget.set_measured(budget.measured().saturating_sub(own) + self.listed);
        }
    }
}

impl Drop for ListAccount {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.listing.fetch_sub(self.listed, Ordering::Relaxed);
        }
    }
}

impl Writer {
    /// The reflector stopped: a cache dropped for the limit ([`Reader::release_at_stop`]) lets
    /// go of its objects and history now, whoever still holds a reader of it (snapshots taken
    /// by reads in flight keep what they use until they are answered).
    pub fn stopped(&mut self) {
        if self.shared.release.load(Ordering::Acquire) {
            let mut st = self.shared.state.lock();
            st.store = Store::new();
            let rv = st.rv;
            st.history.reset(rv);
            self.shared.kept.store(0, Ordering::Relaxed);
        }
    }

    /// Starts counting a full list against `--cache-memory-limit` ([`ListAccount`]).
    pub fn list_account(&self) -> ListAccount {
        ListAccount { budget: self.shared.opts.memory.clone(), shared: self.shared.clone(), listed: 0 }
    }
}

impl Reader {
    /// Has the writer empty this cache once its reflector stops (it is being dropped).
    pub fn release_at_stop(&self) {
        self.shared.release.store(true, Ordering::Release);
    }

    /// Whether this cache is being dropped ([`Reader::release_at_stop`], set before its
    /// reflector is told to stop). Its writer empties it once stopped while its progress still
    /// says ready, so whoever took this reader before the drop checks this **after** reading
    /// from it (a read that saw the emptied cache sees this set: the emptying comes after it,
    /// under the state's lock) and takes nothing it read for the resource's state.
    pub fn released(&self) -> bool {
        self.shared.release.load(Ordering::Acquire)
    }

    /// Bytes a list of this resource had brought when it was refused for the limit (0: none
    /// since the last full list).
    pub fn refused_list(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// What this cache was last counted at in the budget's total: its last measurement
    /// ([`Reader::memory`]), or the list installed since ([`ListAccount::installed`]).
    pub fn kept(&self) -> u64 {
        self.shared.kept.load(Ordering::Relaxed)
    }

    /// What this cache keeps in memory now (see the module doc).
    pub fn memory(&self) -> Usage {
        let (store, cap) = {
            let st = self.shared.state.lock();
            (st.store.clone(), st.history.cap())
        };
        // The history's pointers a chunk at a time, so that writers and watches never wait for
        // a whole history (100 000 events and more) to be copied; events that left it between
        // two chunks are gone anyway, those that arrived are counted.
        let mut events: Vec<Arc<Event>> = Vec::new();
        let mut after = Rv(0);
        loop {
            let got = {
                let st = self.shared.state.lock();
                let before = events.len();
                events.extend(st.history.newer_than(after).take(MEASURE_CHUNK).cloned());
                events.len() - before
            };
            match events.last() {
                Some(e) if got == MEASURE_CHUNK => after = e.rv,
                _ => break,
            }
        }
        let (objects, history) = measure(&store, &events);
        // What list pages keep beyond their live objects, for the objects' sake (`cache::pages`).
        let objects = objects + self.shared.pinned.load(Ordering::Relaxed);
        self.shared.kept.store(objects + history, Ordering::Relaxed);
        Usage { objects, history, events: events.len(), history_cap: cap }
    }

    /// Keeps at most `cap` events in the history from now on (the oldest go at once; watches
    /// from RVs now older than the floor answer 410, as after any eviction).
    pub fn limit_history(&self, cap: usize) {
        self.shared.state.lock().history.set_cap(cap);
    }

    /// Gives the history back its configured length (`--history-max-events`).
    pub fn unlimit_history(&self) {
        self.shared.state.lock().history.set_cap(self.shared.opts.history_max_events);
    }
}

/// Bytes of the objects of `store`, and bytes only `events` keep. A superseded version that
/// shares its key allocation (the key and the header's strings) with the store's version or
/// with another one counted before (`Header::share_key`) is counted without it.
fn measure(store: &Store, events: &[Arc<Event>]) -> (u64, u64) {
    let objects: usize = store.values().map(|o| o.kept_bytes() + STORE_ENTRY).sum();
    let mut seen: HashSet<*const Object> = HashSet::new();
    let mut keys: HashSet<*const u8> = HashSet::new();
    let mut history = 0usize;
    for e in events {
        history += e.frame_bytes() + HISTORY_SLOT;
        for o in std::iter::once(&e.object).chain(e.prev.as_ref()) {
            let now = store.get(&o.header.key);
            if now.is_some_and(|c| Arc::ptr_eq(c, o)) || !seen.insert(Arc::as_ptr(o)) {
                continue;
            }
            let counted = now.is_some_and(|c| c.header.key.same_allocation(&o.header.key))
                || !keys.insert(o.header.key.as_bytes().as_ptr());
            history += o.kept_bytes() - if counted { o.header.heap_bytes() } else { 0 };
        }
    }
    (objects as u64, history as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{self, CacheOptions};
    use crate::metadata_only::Repr;
    use crate::resource::{EventType, ResourceKind, Rv};
    use bytes::Bytes;

    fn kind() -> ResourceKind {
        ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true)
    }

    fn cm(w: &cache::Writer, name: &str, rv: u64, data: usize) -> crate::resource::Object {
        let json = format!(
            r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}},"data":{{"k":"{}"}}}}"#,
            "x".repeat(data)
        );
        w.parse(Bytes::from(json)).unwrap()
    }

    #[tokio::test]
    async fn lists_in_flight_count_together_and_a_relist_replaces_what_its_cache_held() {
        let budget = Arc::new(Budget::new(10_000));
        let opts = CacheOptions { memory: Some(budget.clone()), ..CacheOptions::default() };
        let (wa, ra) = cache::new(kind(), opts.clone());
        let (wb, rb) = cache::new(kind(), opts);
        let mut a = wa.list_account();
        assert!(a.add(6_000, 6_000));
        let mut b = wb.list_account();
        // b's first page: 5 000 bytes of a list expected to bring 20 000 in all.
        assert!(!b.add(5_000, 20_000), "6 000 + 5 000 in flight pass 10 000");
        assert_eq!((rb.refused_list(), ra.refused_list()), (20_000, 0), "counted at its whole list");
        assert_eq!(b.refused_at(), 20_000);
        drop(b);
        assert!(a.add(3_000, 9_000), "b's bytes left the lists in flight");
        a.installed();
        assert_eq!(budget.measured(), 9_000);
        // What the governor's measurement ends with: each cache's count as it is now, a list
        // installed while it measured included (`memory::sweep`).
        assert_eq!(ra.kept() + rb.kept(), 9_000);
        // A relist of a replaces its 9 000: 9 500 more fit; another cache's 1 500 then do not
        // (an expected whole below what came counts as what came).
        let mut again = wa.list_account();
        assert!(again.add(9_500, 9_500));
        let mut c = wb.list_account();
        assert!(!c.add(1_500, 0));
        assert_eq!(rb.refused_list(), 1_500);
        drop((again, c));
        assert!(wb.list_account().add(1_000, 1_000));
        // Without a limit every list fits.
        let (w, _) = cache::new(kind(), CacheOptions::default());
        assert!(w.list_account().try_add(u64::MAX / 4), "no bound on what a list reads");
        assert!(w.list_account().add(u64::MAX / 2, 0));
    }

    /// A relist asked for whole counts its cache's size before it is sent: two caches relisting
    /// at once (after an apiserver restart) cannot both hold a whole body past the limit; the
    /// arrived list is then counted at its own size (a review: nothing was counted before the
    /// bodies were in).
    #[tokio::test]
    async fn a_whole_relist_reserves_its_caches_size_before_it_is_asked() {
        let budget = Arc::new(Budget::new(10_000));
        let opts = CacheOptions { memory: Some(budget.clone()), ..CacheOptions::default() };
        let (wa, ra) = cache::new(kind(), opts.clone());
        let (wb, rb) = cache::new(kind(), opts);
        for (w, bytes) in [(&wa, 4_000), (&wb, 4_000)] {
            let mut l = w.list_account();
            assert!(l.add(bytes, bytes));
            l.installed();
        }
        assert_eq!(ra.kept() + rb.kept(), 8_000);
        // a's relist reserves its 4 000 (replacing them: 8 000 in all), and counts 4 500 once in.
        let mut a = wa.list_account();
        assert!(a.reserve_its_size());
        // What it may bring in all: its reservation and the 2 000 left beside b's 4 000, taken
        // at once: a list of b's could not count a byte more meanwhile.
        assert!(a.try_add(2_000), "room for 2 000 more beside b's 4 000");
        assert!(!a.try_add(1), "not one byte more");
        assert_eq!(rb.refused_list() + ra.refused_list(), 0, "nothing recorded as refused");
        assert_eq!(a.listed(), 6_000);
        // b's reservation would pass 10 000 beside it: refused, nothing counted (paged instead).
        let mut b = wb.list_account();
        assert!(!b.reserve_its_size());
        assert_eq!(rb.refused_list(), 0, "a refused reservation is no refused list");
        assert!(a.settle(4_500));
        assert!(!b.add(2_000, 2_000), "a's 4 500 still count while it lands");
        drop(b);
        a.installed();
        assert_eq!(budget.measured(), 8_500);
        // Settled below its reservation: counted at what came.
        let mut again = wa.list_account();
        assert!(again.reserve_its_size());
        assert!(again.settle(1_000));
        again.installed();
        assert_eq!(budget.measured(), 5_000);
    }

    /// A superseded version's key allocation is counted once: not when the store's version
    /// (or a version counted before) holds the same one, whole when it is its own.
    #[test]
    fn a_key_shared_between_versions_is_counted_once() {
        let (w, _r) = cache::new(kind(), CacheOptions::default());
        let event = |o: &Arc<crate::resource::Object>, prev: &Arc<crate::resource::Object>| {
            Arc::new(Event::new(EventType::Modified, o.header.rv, o.clone(), Some(prev.clone())))
        };
        let v1 = Arc::new(cm(&w, "a", 10, 100));
        let mut v2 = cm(&w, "a", 11, 100);
        assert!(v2.header.share_key(&v1.header));
        let v2 = Arc::new(v2);
        let v3 = Arc::new(cm(&w, "a", 12, 100));
        let store = |o: &Arc<crate::resource::Object>| Store::new().update(o.header.key.clone(), o.clone());
        let slot = |e: &Arc<Event>| e.frame_bytes() + HISTORY_SLOT;
        let key = v1.header.heap_bytes();

        // v2 (the store's) took v1's key: v1 is counted without it.
        let e2 = event(&v2, &v1);
        let (_, h) = measure(&store(&v2), std::slice::from_ref(&e2));
        assert_eq!(h as usize, slot(&e2) + v1.kept_bytes() - key);

        // v3 has a key of its own: v1 and v2 share one, counted with the first of them only.
        let e3 = event(&v3, &v2);
        let (_, h) = measure(&store(&v3), &[e2.clone(), e3.clone()]);
        assert_eq!(h as usize, slot(&e2) + slot(&e3) + v1.kept_bytes() + v2.kept_bytes() - key);
    }

    #[tokio::test]
    async fn a_history_longer_than_a_chunk_is_counted_whole() {
        let opts = CacheOptions { history_max_events: 3 * MEASURE_CHUNK, ..CacheOptions::default() };
        let (mut w, r) = cache::new(kind(), opts);
        w.replace(vec![], Rv(1));
        let n = 2 * MEASURE_CHUNK + 5;
        for i in 0..n as u64 {
            drop(w.apply(EventType::Added, cm(&w, &format!("c{i}"), 2 + i, 10)).unwrap());
        }
        let u = r.memory();
        assert_eq!(u.events, n);
        assert!(u.history >= (n * HISTORY_SLOT) as u64, "{u:?}");
    }

    #[tokio::test]
    async fn objects_count_once_and_the_history_counts_what_only_it_keeps() {
        let (mut w, r) = cache::new(kind(), CacheOptions::default());
        w.replace(vec![cm(&w, "a", 10, 10_000), cm(&w, "b", 10, 10_000)], Rv(10));
        let listed = r.memory();
        assert_eq!((listed.events, listed.history), (0, 0));
        assert!(listed.objects > 20_000 && listed.objects < 22_000, "{listed:?}");

        // ADDED: the object is the store's, its JSON a slice of its event's frame: the history
        // counts the frame's envelope and its own slot, not the JSON a second time.
        drop(w.apply(EventType::Added, cm(&w, "c", 11, 10_000)).unwrap());
        let added = r.memory();
        assert!(added.objects - listed.objects > 10_000 && added.objects - listed.objects < 11_000);
        assert!(added.history > 0 && added.history < 1_000, "{added:?}");

        // MODIFIED: the superseded version (and the frame its JSON is in) is the history's
        // alone now; the new frame shares the store's JSON.
        drop(w.apply(EventType::Modified, cm(&w, "c", 12, 10_000)).unwrap());
        let modified = r.memory();
        assert_eq!(modified.objects, added.objects);
        let grown = modified.history - added.history;
        assert!(grown > 10_000 && grown < 11_000, "the old version once: {modified:?}");

        // A lazily made form counts where its object is: the store's.
        r.get("ns", "a").unwrap().chunks_as(Repr::Metadata).unwrap();
        assert!(r.memory().objects > modified.objects);

        // Shortening the history gives its bytes back and raises the floor.
        r.limit_history(1);
        let short = r.memory();
        assert_eq!((short.events, short.history_cap), (1, 1));
        // The MODIFIED event still holds the version it replaced (its JSON, in the first frame).
        assert!(short.history < modified.history && short.history > 10_000, "{short:?}");
        assert_eq!(r.window().0, Rv(11));
        r.unlimit_history();
        assert_eq!(r.memory().history_cap, CacheOptions::default().history_max_events);
    }
}
