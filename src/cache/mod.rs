//! The cache of one resource: current objects (`store`), recent events (`history`) and live
//! watchers (`watchers`), behind one lock.
//!
//! `cache::new` returns the two halves: the [`Writer`] (not `Clone`; only the reflector holds
//! it) applies upstream lists and events; the [`Reader`] (cheap `Clone`; the server holds it)
//! answers gets, lists and watches. Readers hold the lock only to take an O(1) snapshot of the
//! persistent store or to register a watcher; never across I/O.

mod budget;
mod dispatch;
mod filter;
mod history;
mod initial;
mod lag;
mod list;
mod memory;
mod pages;
mod persist;
mod relist;
mod store;
mod unparsable;
mod warnings;
mod watch;
mod watchers;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::watch as progress;
use tokio::time::Instant;

pub use dispatch::Fanout;
pub use filter::Filter;
pub use history::History;
pub use lag::DeliveryLag;
pub use list::{ListBody, Page};
pub use memory::{Budget, ListAccount, Usage};
pub use persist::{Persisted, RestoreError};
pub use relist::warn_went_back;
pub use store::Store;
pub use watch::{Watch, WatchRequest, WatchStart};

use crate::error::Error;
use crate::resource::{typing, Event, EventType, Object, ObjectKey, ResourceKind, Rv, Typing};
use budget::TimeBudget;
use filter::{Dispatched, LazyFrames};
use store::upsert;
use watchers::{Difference, Watchers};

/// Tunables of one resource's cache.
#[derive(Clone, Debug)]
pub struct CacheOptions {
    /// Events older than this leave the history (`--history-window`, 75 s like the apiserver).
    pub history_window: Duration,
    /// At most this many events are kept (`--history-max-events`).
    pub history_max_events: usize,
    /// Queue length per watcher; a watcher whose queue stays full for the shared time budget
    /// (`cache::budget`) is closed.
    pub watcher_queue: usize,
    /// Period of BOOKMARKs to watchers that asked for them (60 s like the apiserver).
    pub bookmark_interval: Duration,
    /// The upstream's Kubernetes minor version (`/version`): protobuf answers leave out the
    /// fields its types do not have yet. `None`: the newest. Per cache, never process-wide:
    /// two proxies in one process (tiers, tests) may front different versions.
    pub upstream_minor: Option<u32>,
    /// The upstream's minor version is unknown or newer than the protobuf schema's
    /// (`proto::SCHEMA_MINOR`): protobuf reads are forwarded (`ProtoType::unproven`).
    pub protobuf_unproven: bool,
    /// Where sampled watch-delivery lags are observed (`cache::lag`; off by default).
    pub delivery_lag: DeliveryLag,
    /// `--cache-memory-limit` (`cache::memory`): rung after every full list (a relist can
    /// grow a cache by its whole size, so the limit is checked at once rather than at the
    /// next period), and checked by the reflector while a list arrives.
    pub memory: Option<Arc<Budget>>,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            history_window: Duration::from_secs(75),
            history_max_events: 100 * 1024,
            watcher_queue: 1000,
            bookmark_interval: Duration::from_secs(60),
            upstream_minor: None,
            protobuf_unproven: false,
            delivery_lag: DeliveryLag::default(),
            memory: None,
        }
    }
}

/// What readers can wait on: the cache RV and whether the cache is usable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    pub rv: Rv,
    pub ready: bool,
    /// When `ready` last changed (drives the 429 Retry-After like the apiserver's cacher).
    pub since: Instant,
    /// Why the cache is not ready, appended to the 429 message.
    pub last_error: Option<String>,
    /// The upstream sent an object the cache cannot parse (`cache::unparsable`): it cannot
    /// hold the upstream's state, and every request is forwarded until a full list parses
    /// whole. Never set while `ready`.
    pub unservable: bool,
}

struct State {
    store: Store,
    rv: Rv,
    history: History,
    watchers: Watchers,
    /// Full lists installed so far (`Writer::replace`): a finding made before the last one is
    /// of a state that is gone (`relist.rs`).
    lists: u64,
    /// Lists installed below the cache's RV (the upstream's storage went back): an RV ahead of
    /// the cache seen before the last one is of a history that is gone (`cache::watch`).
    histories: u64,
    /// An object the upstream sent could not be parsed since the last full list
    /// (`cache::unparsable`): no watch may start until a list parses whole.
    unservable: bool,
}

struct Shared {
    /// Distinct for every cache made in this process ([`Reader::cache_id`]).
    id: u64,
    kind: ResourceKind,
    typing: Typing,
    opts: CacheOptions,
    state: Mutex<State>,
    progress: progress::Sender<Progress>,
    /// RV up to which every event is in its watchers' queues (or they were closed): the
    /// newest RV a watcher's BOOKMARK may carry. Behind the cache RV only while a
    /// `Fanout` waits for slow watchers.
    dispatched: AtomicU64,
    /// When the cache last had proof that it was current (an event, a bookmark, a list, an
    /// upstream watch that started), in milliseconds after `born`.
    proven_ms: AtomicU64,
    /// How old a restored state was at its restore (its file's age): counted in the cache's
    /// staleness until the upstream's stream brings something ([`Writer::restored_age`]).
    restored_age_ms: AtomicU64,
    /// The upstream's stream (or a list) brought the cache something in this process: a list,
    /// an event, a bookmark ([`Reader::proven_here`]). Not a watch merely accepted: an
    /// apiserver accepts one from a compacted RV and then sends its 410 as an event.
    live: std::sync::atomic::AtomicBool,
    born: Instant,
    /// A relist asked for by someone other than the reflector (`relist.rs`).
    relist: relist::Request,
    /// This resource's `watchcache_watch_delivery_lag_seconds` (`cache::lag`).
    delivery_lag: Option<prometheus::Histogram>,
    /// RVs the upstream was seen at (consistent-read probes) that the cache had not reached,
    /// oldest first, each with when it was seen: the cache is at least that far behind.
    ahead: Mutex<lag::Ahead>,
    /// Bytes this cache kept at its last measurement (`cache::memory`).
    kept: AtomicU64,
    /// Bytes list pages keep beyond their live objects (`cache::pages`), as the writer last
    /// knew them: counted with the objects.
    pinned: AtomicU64,
    /// Bytes a list had brought when `--cache-memory-limit` refused it; 0 after a full list.
    refused: AtomicU64,
    /// Dropped for `--cache-memory-limit`: the writer empties the cache when its reflector
    /// stops (readers may outlive it: `app::Running` keeps the first ones).
    release: std::sync::atomic::AtomicBool,
    /// The upstream's `Warning`s about this resource (`warnings.rs`).
    warnings: Mutex<Arc<[String]>>,
}

impl Shared {
    /// Nanoseconds after `born` (at least 1: 0 means "not stamped" in a `Delivery`).
    fn stamp(&self, at: Instant) -> u64 {
        (at.duration_since(self.born).as_nanos() as u64).max(1)
    }

    /// A stamped delivery's frame goes to its watcher's response body now.
    fn delivered(&self, arrived_ns: u64) {
        if let Some(h) = &self.delivery_lag {
            let lag_ns = self.stamp(Instant::now()).saturating_sub(arrived_ns);
            h.observe(lag_ns as f64 / 1e9);
        }
    }
}

/// Creates the cache of one resource.
pub fn new(kind: ResourceKind, opts: CacheOptions) -> (Writer, Reader) {
    let (tx, _rx) = progress::channel(Progress {
        rv: Rv(0),
        ready: false,
        since: Instant::now(),
        last_error: None,
        unservable: false,
    });
    let typing = typing(&kind);
    if let Some(minor) = opts.upstream_minor {
        typing.proto.set_upstream_minor(minor);
    }
    if opts.protobuf_unproven {
        typing.proto.unproven();
    }
    let delivery_lag = opts.delivery_lag.for_resource(&kind.group_resource());
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    let shared = Arc::new(Shared {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        typing,
        kind,
        state: Mutex::new(State {
            store: Store::new(),
            rv: Rv(0),
            history: History::new(opts.history_max_events, opts.history_window),
            watchers: Watchers::default(),
            lists: 0,
            histories: 0,
            unservable: false,
        }),
        opts,
        progress: tx,
        dispatched: AtomicU64::new(0),
        proven_ms: AtomicU64::new(0),
        restored_age_ms: AtomicU64::new(0),
        live: Default::default(),
        born: Instant::now(),
        relist: relist::Request::default(),
        delivery_lag,
        ahead: Mutex::new(lag::Ahead::default()),
        kept: AtomicU64::new(0),
        pinned: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        release: Default::default(),
        warnings: Mutex::new(Arc::from(Vec::new())),
    });
    let writer = Writer {
        shared: shared.clone(),
        budget: TimeBudget::new(Instant::now()),
        pages: pages::Pages::default(),
    };
    (writer, Reader { shared })
}

/// Objects copied out of mostly superseded list pages at each event (`cache::pages`): a
/// pass's copies spread over the next events, ~0.2 ms each, rather than one long stop.
const COPIES_PER_EVENT: usize = 128;

/// The only way to change a cache. Held by the resource's reflector.
pub struct Writer {
    shared: Arc<Shared>,
    /// How long blocked deliveries may still wait (shared by all watchers).
    budget: TimeBudget,
    /// Where the last full list's objects lie, to give their pages back (`cache::pages`).
    pages: pages::Pages,
}

/// Why an upstream event was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("event resourceVersion {event} is not newer than the cache's {cache}")]
    Stale { event: Rv, cache: Rv },
    #[error("unexpected event type {0:?}")]
    Type(EventType),
}

impl Writer {
    pub fn kind(&self) -> &ResourceKind {
        &self.shared.kind
    }

    /// The cache RV (0 before the first sync).
    pub fn progress_rv(&self) -> Rv {
        self.shared.state.lock().rv
    }

    /// Parses an upstream object of this resource.
    pub fn parse(&self, bytes: Bytes) -> Result<Object, crate::resource::ParseError> {
        Object::parse(&self.shared.kind, &self.shared.typing, bytes)
    }

    /// An object of this resource from its saved header and body (`state::restore`).
    pub fn restored(&self, header: crate::resource::Header, body: Bytes) -> Object {
        Object::restored(&self.shared.typing, header, body)
    }

    /// Installs a complete upstream list at `list_rv` (the first sync and every relist); the
    /// history restarts at `list_rv`, so a watch from any older RV (one inside the gap the
    /// relist covers included) now answers 410, and Exact reads and continue tokens there are
    /// forwarded. Every live watcher that started before `list_rv` ends after what it already
    /// has, with no difference and no BOOKMARK (`Watchers::end_at_relist`, docs/design.md §6, issue
    /// 31), unless the cache had already reached `list_rv` and nothing it selects differs.
    ///
    /// A list RV *below* the cache's means the upstream's storage went back (etcd restored
    /// from a backup without `--bump-revision`; nothing else makes a consistent list older
    /// than an RV it issued): the cache takes the list's RV, as the apiserver's own watch cache
    /// does when it relists, every watcher ends, and the history's floor goes down to the list
    /// RV (`History::rewind`). Keeping the higher RV would drop every upstream event up to it
    /// as stale — changes lost while the cache claims to be current. A watch from an RV above
    /// the new one and up to the old one (a client of the gone history resuming) is checked
    /// against the upstream first (`Reader::gone_ahead`, `server::serve`).
    pub fn replace(&mut self, objects: Vec<Object>, list_rv: Rv) {
        self.pages = pages::Pages::of(objects.iter());
        self.shared.pinned.store(0, Ordering::Relaxed);
        let now = Instant::now();
        let next = store::filled(objects);
        // The newest upstream RV seen ahead of the cache (a probe's): if the storage went back,
        // RVs up to it may be held by clients too (before the state lock: see `upstream_at`).
        let seen_ahead = self.shared.ahead.lock().newest();
        let mut st = self.shared.state.lock();
        let went_back = list_rv < st.rv;
        if went_back {
            tracing::warn!(
                resource = %self.shared.kind.group_resource(),
                cache = %st.rv,
                list = %list_rv,
                "the upstream listed at a resourceVersion below the cache's: its storage went back (etcd restored without --bump-revision?); every watch ends and the cache takes the list's resourceVersion, as the apiserver's watch cache does"
            );
        }
        let cache_rv = st.rv;
        // A list at the RV the cache had reached, in the same history, that differs from the
        // cache: the cache was wrong at that RV, whatever found it (a list RV below the cache's
        // ends every watcher and rewinds; one above it has its own events in between).
        let events =
            if list_rv == cache_rv && cache_rv > Rv(0) { diff(&st.store, &next) } else { Vec::new() };
        let differed = !events.is_empty();
        if !st.watchers.is_empty() {
            let live = st.watchers.len();
            let ended = st.watchers.end_at_relist(&events, cache_rv, list_rv);
            tracing::info!(
                resource = %self.shared.kind.group_resource(),
                from = %cache_rv,
                to = %list_rv,
                differences = events.len(),
                ended,
                kept = live - ended,
                "relist: ended the watches that started before the list"
            );
        }
        st.store = next;
        st.lists += 1;
        st.unservable = false;
        st.histories += u64::from(went_back);
        let from = st.rv.max(seen_ahead);
        st.rv = list_rv;
        // After the watchers were ended: a BOOKMARK that reads this RV finds its queue closed.
        self.shared.dispatched.store(st.rv.0, Ordering::Release);
        let rv = st.rv;
        if went_back {
            st.history.rewind(list_rv, from);
        } else if differed {
            // The RV the wrong state was served at answers 410 from now on (as after
            // `distrust_through`): a client that read it must relist, not resume from it.
            st.history.reset_above(list_rv);
        } else {
            st.history.reset(list_rv);
        }
        st.history.moved(now, rv);
        st.history.expire(now);
        // After a relist for a cache found wrong (`distrust_through`) that lands at the RV the
        // wrong cache had reached (no write upstream since), a LIST served at that RV would
        // send its client to a watch that answers 410, again and again: not ready (GETs and
        // paginated lists forwarded, the rest 429, as a cache re-initializing) until an event
        // or a bookmark moves the cache past it.
        let trusted = st.history.floor() <= rv;
        let why = (!trusted).then(|| {
            format!("relisted at {rv}, an RV the cache was found wrong at; waiting for the upstream to move past it")
        });
        self.publish(rv, trusted, why);
        // Every object of the list parsed (`cache::unparsable`).
        self.shared.progress.send_if_modified(|p| std::mem::take(&mut p.unservable));
        self.relist_done();
        drop(st);
        self.proven();
        self.shared.live.store(true, Ordering::Relaxed);
        let mut ahead = self.shared.ahead.lock();
        if went_back {
            // The upstream RVs seen ahead of the cache were of the history that is gone.
            ahead.clear();
        }
        ahead.reached(rv);
        drop(ahead);
        self.shared.refused.store(0, Ordering::Relaxed);
        if let Some(budget) = &self.shared.opts.memory {
            budget.check.notify_one();
        }
        tracing::info!(resource = %self.shared.kind.group_resource(), rv = %list_rv, "cache synced from a full list");
    }

    /// Applies one upstream watch event (ADDED / MODIFIED / DELETED): store, history, and a
    /// non-blocking send to every interested watcher. Readers see the new state at once. Await
    /// [`Fanout::finish`] to give watchers whose queue was full the shared time budget;
    /// dropping it closes them right away.
    pub fn apply(&mut self, kind: EventType, obj: Object) -> Result<Fanout<'_>, ApplyError> {
        // Framed before the lock; the object's JSON then lives in its event's frame.
        let (obj, frame) = obj.framed(kind);
        let now = Instant::now();
        let mut st = self.shared.state.lock();
        let rv = obj.header.rv;
        if rv <= st.rv {
            return Err(ApplyError::Stale { event: rv, cache: st.rv });
        }
        let (obj, prev) = match kind {
            EventType::Added | EventType::Modified => upsert(&mut st.store, obj),
            EventType::Deleted => {
                let prev = st.store.remove(&obj.header.key);
                (Arc::new(obj), prev)
            }
            other => return Err(ApplyError::Type(other)),
        };
        let compact = prev.as_deref().is_some_and(|p| self.pages.superseded(p));
        let event = Arc::new(Event::with_frame(kind, rv, obj, prev, frame));
        st.history.push(now, event.clone());
        st.history.moved(now, rv);
        st.rv = rv;
        let mut blocked = Vec::new();
        let arrived_ns = self.shared.stamp(now);
        st.watchers
            .dispatch(&Dispatched { event, lazy: LazyFrames::default(), arrived_ns }, Some(&mut blocked));
        self.advance(rv);
        drop(st);
        self.proven();
        self.shared.live.store(true, Ordering::Relaxed);
        self.shared.ahead.lock().reached(rv);
        if compact {
            self.plan_pages();
        } else {
            self.shared.pinned.store(self.pages.waste() as u64, Ordering::Relaxed);
        }
        self.copy_pending(COPIES_PER_EVENT);
        Ok(Fanout::new(self, rv, blocked))
    }

    /// Finds the objects of list pages mostly superseded, to be copied into buffers of their
    /// own ([`Writer::copy_pending`]), so that the pages are freed once the history lets go of
    /// their other versions (`cache::pages`). The store is walked outside the lock (this
    /// writer is the only one to change it).
    fn plan_pages(&mut self) {
        let started = std::time::Instant::now();
        let store = self.shared.state.lock().store.clone();
        let before = self.pages.total();
        let (objects, bytes) = self.pages.plan(&store);
        drop(store);
        self.shared.pinned.store(self.pages.waste() as u64, Ordering::Relaxed);
        let released = before - self.pages.total();
        if released > 0 {
            tracing::info!(
                resource = %self.shared.kind.group_resource(),
                released,
                objects,
                bytes,
                took = ?started.elapsed(),
                "list pages mostly superseded to give back: their last objects to be copied out"
            );
        }
    }

    /// Copies up to `n` of the objects [`Writer::plan_pages`] found: the same versions (same
    /// bytes, same RV), no event, nothing a reader can tell. One that changed or went since
    /// the pass is left as it is now. The copies are made outside the lock.
    fn copy_pending(&mut self, n: usize) {
        let batch = self.pages.take_pending(n);
        if batch.is_empty() {
            return;
        }
        let copies: Vec<(ObjectKey, Arc<Object>, Arc<Object>)> =
            batch.into_iter().map(|(k, was)| (k, Arc::new(was.compacted()), was)).collect();
        let mut st = self.shared.state.lock();
        for (k, copy, was) in copies {
            if st.store.get(&k).is_some_and(|now| Arc::ptr_eq(now, &was)) {
                st.store.insert(k, copy);
            }
        }
    }

    /// An upstream BOOKMARK: everything up to `rv` has been applied.
    pub fn bookmark(&mut self, rv: Rv) {
        self.proven();
        self.shared.live.store(true, Ordering::Relaxed);
        let mut st = self.shared.state.lock();
        if rv > st.rv {
            st.rv = rv;
            let now = Instant::now();
            st.history.moved(now, rv);
            st.history.expire(now);
            self.shared.dispatched.store(rv.0, Ordering::Release);
            self.advance(rv);
            drop(st);
            self.shared.ahead.lock().reached(rv);
        } else {
            drop(st);
        }
        // A quiet resource gets its pages back at its bookmarks.
        self.copy_pending(8 * COPIES_PER_EVENT);
    }

    /// Records proof that the cache is current now: the upstream accepted a watch from its RV
    /// (events, bookmarks and lists record it themselves).
    pub fn proven(&self) {
        // At least 1: 0 means "never proven in this process" (`Reader::proven_here`).
        let ms = (Instant::now().duration_since(self.shared.born).as_millis() as u64).max(1);
        self.shared.proven_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// The upstream accepted a watch from the cache's RV and sent no ERROR within the quiet
    /// second after (`reflector::watch_once`): proof that the cache is current, a restored
    /// state's too — a quiet resource may bring no event nor bookmark for hours (1.28 sends
    /// bookmarks only once it has seen an event), and until this a restored state stayed
    /// unconfirmed all that time: its age kept counting in its staleness, and a later 410 made
    /// it block readiness as at a cold start (found by a review).
    pub fn confirmed(&self) {
        self.proven();
        self.shared.live.store(true, Ordering::Relaxed);
    }

    /// Whether the upstream has brought or confirmed this cache in this process
    /// ([`Reader::proven_here`]).
    pub fn confirmed_here(&self) -> bool {
        self.shared.live.load(Ordering::Relaxed)
    }

    /// How long ago this cache was made (its staleness counts from then at most).
    pub fn age(&self) -> Duration {
        self.shared.born.elapsed()
    }

    /// A restored state was `age` old (its file's time: when it was last proven, `state::save`):
    /// until the upstream's stream brings something, its staleness counts from then, not from
    /// the process's start — a state saved before a long downtime, whose resumed watch failed (an upstream
    /// restarting too), was served as fresh for `--max-staleness` (found by a review).
    pub fn restored_age(&self, age: Duration) {
        self.shared.restored_age_ms.store(age.as_millis() as u64, Ordering::Relaxed);
    }

    /// Marks the cache as not usable (upstream lost, relisting): reads answer 429 or are
    /// forwarded until the next `replace`.
    pub fn set_not_ready(&mut self, reason: Option<String>) {
        let st = self.shared.state.lock();
        self.publish(st.rv, false, reason);
    }

    /// Ends every watch after what it already has when the cache has gone longer than `max`
    /// without proof of being current (its relist failing or refused, its upstream watch
    /// failing): their clients re-watch, and `server::serve` forwards stale caches' requests.
    /// The apiserver ends its watchers as soon as its own list-and-watch restarts; a watch left
    /// open here would look quiet and current, a BOOKMARK at the cache's RV before its
    /// deadline saying so (a review). New watches are not refused. Returns how many ended.
    pub fn end_watchers_if_stale(&mut self, max: Duration) -> usize {
        let stale = Reader { shared: self.shared.clone() }.staleness().is_some_and(|s| s > max);
        if max.is_zero() || !stale {
            return 0;
        }
        self.shared.state.lock().watchers.end_all()
    }

    /// Ends every watch and refuses new ones (the reflector stops: shutdown). A watch request
    /// that arrives after it, on a connection still draining, gets 503 instead of a stream that
    /// would never see an event (a tier above would wait on it for its whole timeout).
    pub fn close_watchers(&mut self) {
        self.shared.state.lock().watchers.close();
    }

    /// The cache reached `rv` (an event, a bookmark): ready, unless it is known wrong and a
    /// relist is pending (`relist.rs`; its reads stay forwarded until the relist is in).
    fn advance(&self, rv: Rv) {
        if self.relist_pending() {
            self.shared.progress.send_modify(|p| p.rv = rv);
        } else {
            self.publish(rv, true, None);
        }
    }

    fn publish(&self, rv: Rv, ready: bool, last_error: Option<String>) {
        self.shared.progress.send_modify(|p| {
            if p.ready != ready {
                p.since = Instant::now();
            }
            p.rv = rv;
            p.ready = ready;
            if !ready {
                p.last_error = last_error;
            } else {
                p.last_error = None;
                p.unservable = false;
            }
        });
    }
}

/// The objects that differ between `old` (the cache) and `new` (a relist's list): added,
/// changed (another RV) or gone. Only used, when the cache had reached the list RV, to find
/// the watchers they concern (those end).
fn diff(old: &Store, new: &Store) -> Vec<Difference> {
    let mut out = Vec::new();
    for (k, n) in new.iter() {
        match old.get(k) {
            Some(o) if o.header.rv == n.header.rv => {}
            before => out.push(Difference { now: Some(n.clone()), before: before.cloned() }),
        }
    }
    for (k, o) in old.iter() {
        if !new.contains_key(k) {
            out.push(Difference { now: None, before: Some(o.clone()) });
        }
    }
    out
}

/// Read access to one resource's cache. Cheap to clone.
#[derive(Clone)]
pub struct Reader {
    shared: Arc<Shared>,
}

/// Counters of one resource's watchers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatcherStats {
    pub live: usize,
    pub terminated: u64,
    /// Watchers ended by relists (docs/design.md §6: every one that started before the list, unless
    /// provably complete).
    pub ended_at_relist: u64,
    /// (event, watcher) pairs examined by the fan-out; grows with interested watchers only.
    pub offered: u64,
    /// (event, watcher) deliveries by the fan-out.
    pub delivered: u64,
    /// Live watchers with a `shardSelector` (KEP-5866).
    pub sharded: usize,
    /// Events sharded watchers did not get because the object is outside their shard.
    pub shard_filtered: u64,
    /// Watches ended because the history let go of events their replay had yet to send (the
    /// client re-watches from its last RV: 410 and a relist).
    pub replays_overtaken: u64,
}

/// The history of one resource now.
#[derive(Clone, Copy, Debug)]
pub struct HistoryStats {
    /// Events kept.
    pub len: usize,
    /// At most this many now (`--history-max-events`, or fewer while `--cache-memory-limit`
    /// has shortened it).
    pub capacity: usize,
    /// Age of the oldest event kept (zero when empty).
    pub oldest_age: Duration,
}

/// A consistent view of the objects at one RV.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub store: Store,
    pub rv: Rv,
    /// Full lists the cache had installed ([`Reader::lists`]): a finding about this state is
    /// handed on with it (`Reader::request_relist`).
    pub lists: u64,
    /// Lists it had installed below its RV (the upstream's storage went back).
    pub histories: u64,
}

impl Reader {
    /// This cache's identity: another cache of the same resource (readmitted after a drop,
    /// made again after its resource was rediscovered) has another (`metrics` counts each
    /// one's totals from its own zero).
    pub fn cache_id(&self) -> u64 {
        self.shared.id
    }

    pub fn kind(&self) -> &ResourceKind {
        &self.shared.kind
    }

    pub fn options(&self) -> &CacheOptions {
        &self.shared.opts
    }

    /// The cache RV and readiness now.
    pub fn progress(&self) -> Progress {
        self.shared.progress.borrow().clone()
    }

    /// A receiver of progress changes (readiness, RV).
    pub fn subscribe(&self) -> progress::Receiver<Progress> {
        self.shared.progress.subscribe()
    }

    /// Parses an upstream object of this resource (as the writer does).
    pub fn parse(&self, bytes: Bytes) -> Result<Object, crate::resource::ParseError> {
        Object::parse(&self.shared.kind, &self.shared.typing, bytes)
    }

    /// Number of objects currently cached.
    pub fn len(&self) -> usize {
        self.shared.state.lock().store.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Live watchers, watchers closed for being slow, and the fan-out work done so far.
    pub fn watcher_stats(&self) -> WatcherStats {
        let st = self.shared.state.lock();
        WatcherStats {
            live: st.watchers.len(),
            terminated: st.watchers.terminated(),
            ended_at_relist: st.watchers.ended_at_relist(),
            offered: st.watchers.offered(),
            delivered: st.watchers.delivered(),
            sharded: st.watchers.sharded(),
            shard_filtered: st.watchers.shard_filtered(),
            replays_overtaken: st.watchers.replays_overtaken(),
        }
    }

    /// Size, capacity and time span of the history.
    pub fn history_stats(&self) -> HistoryStats {
        let st = self.shared.state.lock();
        HistoryStats {
            len: st.history.len(),
            capacity: st.history.cap(),
            oldest_age: st.history.oldest_age(Instant::now()),
        }
    }

    /// The oldest RV a watch may start from, and the cache RV.
    pub fn window(&self) -> (Rv, Rv) {
        let st = self.shared.state.lock();
        (st.history.floor(), st.rv)
    }

    /// Time since the cache last had proof that it was current (`None` before its first sync).
    pub fn staleness(&self) -> Option<Duration> {
        if !self.progress().ready && self.progress().rv == Rv(0) {
            return None;
        }
        let proven_ms = self.shared.proven_ms.load(Ordering::Relaxed);
        let since =
            Instant::now().saturating_duration_since(self.shared.born + Duration::from_millis(proven_ms));
        // Nothing from the upstream yet: a restored state's age at its restore counts too.
        let before = if self.proven_here() { 0 } else { self.shared.restored_age_ms.load(Ordering::Relaxed) };
        Some(since + Duration::from_millis(before))
    }

    /// Whether the upstream has brought this cache something in this process (a list, an
    /// event, a bookmark, a watch from its RV accepted and quiet for a second after —
    /// [`Writer::confirmed`]; not a watch merely accepted, which a 410 event may follow): a
    /// restored state not yet confirmed so is not.
    pub fn proven_here(&self) -> bool {
        self.shared.live.load(Ordering::Relaxed)
    }

    /// The upstream was at `rv` (a consistent-read probe's answer): until the cache reaches it,
    /// [`Reader::lag`] counts from now.
    pub fn upstream_at(&self, rv: Rv) {
        let now = Instant::now();
        let mut ahead = self.shared.ahead.lock();
        // Under the `ahead` lock: the writer clears what it reached after it moved the RV.
        if rv > self.progress().rv {
            ahead.seen(rv, now);
        }
    }

    /// How far behind the upstream the cache is known to be: time since the upstream was
    /// seen at an RV the cache has not reached, zero when it has reached every one (a lower
    /// bound; `staleness` is the upper one). `None` before the first sync.
    pub fn lag(&self) -> Option<Duration> {
        let p = self.progress();
        if !p.ready && p.rv == Rv(0) {
            return None;
        }
        let mut ahead = self.shared.ahead.lock();
        ahead.reached(p.rv);
        Some(ahead.since().map_or(Duration::ZERO, |t| Instant::now().saturating_duration_since(t)))
    }

    /// Whether a watch from `rv` may be a client of a history the upstream went back from:
    /// `rv` is above the cache's RV and at most the newest RV known issued before the storage
    /// went back (`History::gone_ahead`). The caller asks the upstream whether it issued `rv`
    /// again; if not, the watch answers 410 (its client relists) rather than wait for the new
    /// history to reach `rv` and then resume from it.
    pub fn gone_ahead(&self, rv: Rv) -> bool {
        let st = self.shared.state.lock();
        st.history.gone_ahead(rv, st.rv)
    }

    /// The 410 a watch from `rv` gets when it is of a gone history (`gone_ahead`).
    pub fn gone(&self, rv: Rv) -> Error {
        Error::TooOldResourceVersion {
            requested: rv,
            oldest: self.shared.state.lock().history.oldest_shown(),
        }
    }

    /// Waits until the cache RV is at least `rv` (and the cache is ready), at most `timeout`.
    /// On timeout returns the 504 the apiserver gives.
    pub async fn wait_for(&self, rv: Rv, timeout: Duration) -> Result<(), Error> {
        let mut rx = self.shared.progress.subscribe();
        let res =
            tokio::time::timeout(timeout, rx.wait_for(|p| (p.ready && p.rv >= rv) || p.unservable)).await;
        match res {
            // It will not move until a list parses whole (`cache::unparsable`).
            Ok(Ok(p)) if p.unservable => Err(Error::Unparsable),
            Ok(Ok(_)) => Ok(()),
            _ => Err(Error::TooLargeResourceVersion {
                requested: rv,
                current: self.progress().rv,
                retry_after: 1,
            }),
        }
    }

    /// The current state.
    pub fn snapshot(&self) -> Snapshot {
        let st = self.shared.state.lock();
        Snapshot { store: st.store.clone(), rv: st.rv, lists: st.lists, histories: st.histories }
    }

    /// The state at exactly `rv`, rebuilt from the store and the history, or `None` when `rv`
    /// is outside the history window (older than its floor, newer than the cache, or passed by
    /// the cache `--history-window` or more ago).
    pub fn snapshot_at(&self, rv: Rv) -> Option<Snapshot> {
        let st = self.shared.state.lock();
        if !st.history.covers(rv, st.rv, Instant::now()) {
            return None;
        }
        let (mut store, lists, histories) = (st.store.clone(), st.lists, st.histories);
        let undo: Vec<Arc<Event>> = st.history.newer_than(rv).cloned().collect();
        drop(st);
        for ev in undo.iter().rev() {
            let key = &ev.object.header.key;
            match &ev.prev {
                Some(p) => {
                    store.insert(key.clone(), p.clone());
                }
                None => {
                    store.remove(key);
                }
            }
        }
        Some(Snapshot { store, rv, lists, histories })
    }

    /// One object of the current state.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Object>> {
        let key = ObjectKey::new(namespace, name);
        self.shared.state.lock().store.get(&key).cloned()
    }

    /// Starts a watch. Registration and the read of history / state happen in one critical
    /// section with the writer, so no event is missed or repeated.
    pub fn watch(&self, req: WatchRequest) -> Result<Watch, Error> {
        watch::start(self, req)
    }

    /// How the resource's objects encode in protobuf (and whether they all could).
    pub fn proto_type(&self) -> &crate::proto::ProtoType {
        &self.shared.typing.proto
    }

    /// Renders a LIST body from a snapshot; `None` when it is asked for in protobuf and an item
    /// has no exact protobuf encoding (the request then goes upstream).
    pub fn list(&self, snap: &Snapshot, filter: &Filter, page: Option<Page>) -> Option<ListBody> {
        list::render(&self.shared.kind, snap, filter, page)
    }

    /// Whether the objects of `store` that `filter` selects are exactly `versions` (namespace,
    /// name, RV), in key order: the same objects at the same versions.
    pub fn selects_exactly<'v>(
        &self,
        store: &Store,
        filter: Filter,
        versions: impl IntoIterator<Item = (&'v str, &'v str, Rv)>,
    ) -> bool {
        let selected = initial::Initial::of_store(store, Arc::new(filter), self.shared.kind.namespaced);
        let mut mine = selected.selected();
        for (ns, name, rv) in versions {
            match mine.next() {
                Some(o) if o.header.rv == rv && o.header.name() == name && o.header.namespace() == ns => {}
                _ => return false,
            }
        }
        mine.next().is_none()
    }
}

#[cfg(test)]
mod tests;
