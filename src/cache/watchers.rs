//! Live fan-out: the registry of watchers of one resource and the dispatch of each applied
//! event to the interested ones.
//!
//! Owned by the cache state and only touched under its lock: the writer dispatches while it
//! applies an event, and `Reader::watch` registers a watcher in the same critical section in
//! which it reads the history, so a watcher sees every event exactly once. Watchers are found
//! by namespace, pod watchers with an exact `spec.nodeName=X` selector (kubelets) by node, and
//! watchers of one object (`metadata.name`: a kubelet's Node, the Secrets and ConfigMaps its
//! pods mount) by the object's key, so an event costs O(interested watchers + unindexed
//! cluster-wide watchers).
//! Sends never block: a watcher whose queue is full is handed back to the writer as
//! [`Blocked`] (`cache::dispatch` gives it the shared time budget outside the lock); a dropped
//! watcher's stream ends after what it already has, like the apiserver's terminated slow
//! watchers. At a relist, `end_at_relist` ends every watcher that started before the list
//! (docs/design.md §6, issue 31).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::filter::{Dispatched, Filter, NoExactEncoding};
use super::lag::Sampler;
use crate::resource::{Object, Rv};

/// One frame queued to a watcher: the event's RV (for bookmark ordering) and its bytes.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub rv: Rv,
    pub frame: Bytes,
    /// For a delivery the lag sampler stamped (`cache::lag`): when its event arrived, in
    /// nanoseconds after the cache was made (at least 1). 0: not stamped.
    pub arrived_ns: u64,
}

struct Entry {
    filter: Arc<Filter>,
    /// Events with RV ≤ this are skipped (a watch from a future RV waits for it silently).
    min_rv: Rv,
    tx: mpsc::Sender<Delivery>,
    /// Its replay of the history up to `min_rv` is still under way (`cache::watch::Replay`):
    /// it has not got every event up to there, so a relist never keeps it.
    replaying: bool,
}

/// The index a watcher is registered under.
#[derive(Clone, Debug)]
pub(crate) enum Slot {
    /// Every event is offered (cluster-wide requests without an indexed selector).
    All,
    /// Events of one namespace.
    Namespace(String),
    /// Pod events whose current or previous `spec.nodeName` is this node.
    Node(String),
    /// Events of the one object with this key (`namespace/name`, or `name` when cluster-scoped):
    /// a watch of a single object by `metadata.name` (a kubelet's Node, the Secrets and
    /// ConfigMaps its pods mount; the apiserver indexes them so too).
    Object(String),
}

/// An indexed slot an event concerns, borrowed from its object's header (`slots_of`): found in
/// the index without making a [`Slot`] (no allocation per event).
#[derive(Clone, Copy, Debug, PartialEq)]
enum SlotRef<'a> {
    Namespace(&'a str),
    Node(&'a str),
    Object(&'a str),
}

/// What a slot is, owned or borrowed: the index's keys (`Slot`) are looked up by either.
trait SlotParts {
    /// The slot's kind (0 all, 1 namespace, 2 node, 3 object) and its value.
    fn parts(&self) -> (u8, &str);
}

impl SlotParts for Slot {
    fn parts(&self) -> (u8, &str) {
        match self {
            Slot::All => (0, ""),
            Slot::Namespace(ns) => (1, ns),
            Slot::Node(node) => (2, node),
            Slot::Object(key) => (3, key),
        }
    }
}

impl SlotParts for SlotRef<'_> {
    fn parts(&self) -> (u8, &str) {
        match self {
            SlotRef::Namespace(ns) => (1, ns),
            SlotRef::Node(node) => (2, node),
            SlotRef::Object(key) => (3, key),
        }
    }
}

impl SlotRef<'_> {
    fn to_slot(self) -> Slot {
        match self {
            SlotRef::Namespace(ns) => Slot::Namespace(ns.to_owned()),
            SlotRef::Node(node) => Slot::Node(node.to_owned()),
            SlotRef::Object(key) => Slot::Object(key.to_owned()),
        }
    }
}

// A `Slot` and every `SlotParts` with the same parts hash and compare alike, so that the index
// (keyed by `Slot`) can be asked with a `&dyn SlotParts`.
impl std::hash::Hash for dyn SlotParts + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.parts().hash(state)
    }
}

impl PartialEq for dyn SlotParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn SlotParts + '_ {}

impl std::hash::Hash for Slot {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.parts().hash(state)
    }
}

impl PartialEq for Slot {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for Slot {}

impl<'a> std::borrow::Borrow<dyn SlotParts + 'a> for Slot {
    fn borrow(&self) -> &(dyn SlotParts + 'a) {
        self
    }
}

/// Registry of live watchers, indexed by namespace, by pods' `spec.nodeName` and by object.
#[derive(Default)]
pub struct Watchers {
    next_id: u64,
    /// Watchers of every namespace (cluster-wide requests, cluster-scoped resources).
    all: HashMap<u64, Entry>,
    /// Watchers of one namespace, of one node or of one object: only these are offered its
    /// events.
    indexed: HashMap<Slot, HashMap<u64, Entry>>,
    /// Watchers dropped because their queue was full.
    terminated: u64,
    /// Watchers ended by a relist (`end_at_relist`).
    ended_at_relist: u64,
    /// Watches ended because the history let go of events their replay had yet to send.
    overtaken: u64,
    /// No watcher may be added any more (`close`).
    closed: bool,
    /// How many (event, watcher) pairs were examined: the fan-out cost.
    offered: u64,
    /// (event, watcher) deliveries so far (at once, or after waiting for the time budget).
    delivered: u64,
    /// (event, sharded watcher) pairs not delivered because the object is outside the shard.
    shard_filtered: u64,
    /// Which deliveries carry their event's arrival stamp (`cache::lag`).
    sampler: Sampler,
}

/// A delivery that did not fit its watcher's queue; the watcher stays registered until
/// `cache::dispatch` delivers it or closes the watcher.
pub struct Blocked {
    pub(crate) id: WatcherId,
    pub(crate) tx: mpsc::Sender<Delivery>,
    pub(crate) delivery: Delivery,
}

/// Handle a watch keeps to unregister itself when it ends.
#[derive(Clone, Debug)]
pub struct WatcherId {
    pub(crate) id: u64,
    pub(crate) slot: Slot,
}

/// Where a watcher with this filter is registered (`namespaced`: the resource's objects live
/// in namespaces). Empty values are not indexed: events are offered to the namespace and node
/// slots of their non-empty values only, so a watcher of `spec.nodeName=` (unscheduled pods)
/// or `metadata.namespace=` (cluster-scoped objects) is offered every event and its filter
/// decides. A watch of one name is of one object, found by its key — unless it names no
/// namespace of a namespaced resource (the name in every namespace): then by the rest.
fn slot_of(filter: &Filter, namespaced: bool) -> Slot {
    let object_key = |ns: &str, name: &str| crate::resource::ObjectKey::new(ns, name).as_str().to_owned();
    if let Some(name) = filter.name.as_deref().filter(|n| !n.is_empty()) {
        match filter.namespace.as_deref() {
            Some(ns) if namespaced && !ns.is_empty() => return Slot::Object(object_key(ns, name)),
            None if !namespaced => return Slot::Object(object_key("", name)),
            _ => {}
        }
    }
    if let Some(node) = filter.fields.exact("spec.nodeName").filter(|n| !n.is_empty()) {
        return Slot::Node(node.to_owned());
    }
    match &filter.namespace {
        Some(ns) if !ns.is_empty() => Slot::Namespace(ns.clone()),
        _ => Slot::All,
    }
}

impl Watchers {
    /// Registers a watcher; returns its id and queue.
    pub fn add(
        &mut self,
        filter: Arc<Filter>,
        namespaced: bool,
        min_rv: Rv,
        queue: usize,
        replaying: bool,
    ) -> (WatcherId, mpsc::Receiver<Delivery>) {
        let (tx, rx) = mpsc::channel(queue.max(1));
        self.next_id += 1;
        let id = self.next_id;
        let slot = slot_of(&filter, namespaced);
        let entry = Entry { filter, min_rv, tx, replaying };
        match &slot {
            Slot::All => {
                self.all.insert(id, entry);
            }
            s => {
                self.indexed.entry(s.clone()).or_default().insert(id, entry);
            }
        }
        (WatcherId { id, slot }, rx)
    }

    /// The watcher's replay is done: it has every event up to its `min_rv`.
    pub fn replayed(&mut self, w: &WatcherId) {
        let entry = match &w.slot {
            Slot::All => self.all.get_mut(&w.id),
            s => self.indexed.get_mut(s).and_then(|m| m.get_mut(&w.id)),
        };
        if let Some(e) = entry {
            e.replaying = false;
        }
    }

    /// Unregisters a watcher; its stream ends after what is queued. Returns whether it was
    /// still registered.
    pub fn remove(&mut self, w: &WatcherId) -> bool {
        match &w.slot {
            Slot::All => self.all.remove(&w.id).is_some(),
            s => {
                let Some(m) = self.indexed.get_mut(s) else { return false };
                let found = m.remove(&w.id).is_some();
                if m.is_empty() {
                    self.indexed.remove(s);
                }
                found
            }
        }
    }

    /// Removes the watcher of a watch whose replay the history overtook (`cache::watch`), counted
    /// unless it was gone already (a relist ended it: counted there).
    pub fn overtaken(&mut self, w: &WatcherId) {
        if self.remove(w) {
            self.overtaken += 1;
        }
    }

    /// Removes the watcher of a watch whose replay a relist (or the history's restart before one)
    /// ended, counted with those `end_at_relist` ends, unless that ended it already.
    pub fn ended_by_relist(&mut self, w: &WatcherId) {
        if self.remove(w) {
            self.ended_at_relist += 1;
        }
    }

    /// Watches ended because the history overtook their replay.
    pub fn replays_overtaken(&self) -> u64 {
        self.overtaken
    }

    /// Closes watchers that could not keep up (counted in `terminated`).
    pub fn terminate(&mut self, ids: impl IntoIterator<Item = WatcherId>) {
        for id in ids {
            if self.remove(&id) {
                self.terminated += 1;
                too_slow(None);
            }
        }
    }

    /// Number of registered watchers.
    pub fn len(&self) -> usize {
        self.all.len() + self.indexed.values().map(HashMap::len).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many (event, watcher) pairs dispatch has examined so far.
    pub fn offered(&self) -> u64 {
        self.offered
    }

    /// Watchers dropped so far for being too slow.
    pub fn terminated(&self) -> u64 {
        self.terminated
    }

    /// Watchers ended so far by relists.
    pub fn ended_at_relist(&self) -> u64 {
        self.ended_at_relist
    }

    /// (event, watcher) deliveries so far.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Registered watchers with a `shardSelector` (counted when asked: a scrape, not a watch).
    pub fn sharded(&self) -> usize {
        let sharded = |m: &HashMap<u64, Entry>| m.values().filter(|e| e.filter.shard.is_some()).count();
        sharded(&self.all) + self.indexed.values().map(sharded).sum::<usize>()
    }

    /// Events a sharded watcher did not get because the object is outside its shard.
    pub fn shard_filtered(&self) -> u64 {
        self.shard_filtered
    }

    /// Counts events a replay kept from a sharded watcher (`cache::watch`).
    pub fn add_shard_filtered(&mut self, n: u64) {
        self.shard_filtered += n;
    }

    /// Counts deliveries that had to wait for the time budget (`Fanout::finish`).
    pub fn add_delivered(&mut self, n: u64) {
        self.delivered += n;
    }

    /// Drops every watcher: their streams end after what they already have.
    pub fn clear(&mut self) {
        self.all.clear();
        self.indexed.clear();
    }

    /// Ends every watch after what it already has, counted as ended by a relist (its client
    /// re-watches from its last RV); returns how many (`cache::unparsable`).
    pub fn end_all(&mut self) -> usize {
        let ended = self.len();
        self.clear();
        self.ended_at_relist += ended as u64;
        ended
    }

    /// Ends every watch and refuses new ones for good (the cache's writer is gone: a watch
    /// registered now would never get an event, nor be ended).
    pub fn close(&mut self) {
        self.clear();
        self.closed = true;
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Ends, at a relist from the cache RV `cache_rv` to a list at `list_rv` whose differences
    /// are `diff`, every watcher that started before the list; returns how many.
    ///
    /// An empty difference for a watcher says that its selection's state at its last RV and
    /// at `list_rv` are equal, not that nothing happened in between: an object may have been
    /// created and deleted in the gap, or relabelled in and out of its selector, and a client
    /// (or a tier above, whose cache moves with this stream) that resumed from `list_rv` would
    /// treat `(its RV, list_rv]` as a quiet stretch (issue 31). So, as the apiserver ends every
    /// watch when its cache re-initialises (`terminateAllWatchers`), each such watcher ends
    /// after what it already has, in every representation, with no difference and no
    /// BOOKMARK; its client re-watches from its last RV, which is older than the new history
    /// floor here (410, relist), and exact at another replica or at the apiserver.
    ///
    /// Only two kinds stay, each with a proof that it misses nothing:
    /// - a watcher that started ahead of the cache at or after `list_rv` (a watch from a
    ///   future RV, or from an upstream LIST or write at or after it): every change it may miss
    ///   is older than its start, and events after `list_rv` come from the new upstream watch;
    /// - when `list_rv == cache_rv` (the cache had already applied every upstream event up to
    ///   the list RV from its unbroken upstream stream), a watcher that started at or before
    ///   `cache_rv` and that no difference concerns: it got every event up to `cache_rv`.
    ///
    /// A list RV below the cache's is an upstream whose storage went back (`Writer::replace`):
    /// every RV a watcher holds names another state now, and every watcher ends.
    pub fn end_at_relist(&mut self, diff: &[Difference], cache_rv: Rv, list_rv: Rv) -> usize {
        let went_back = list_rv < cache_rv;
        // The differences each indexed slot is offered (as `dispatch` would).
        let mut by_slot: HashMap<Slot, Vec<&Difference>> = HashMap::new();
        if !self.indexed.is_empty() && list_rv == cache_rv {
            for d in diff {
                for slot in slots_of(d.now.iter().chain(d.before.iter()).map(|o| &**o)) {
                    if self.indexed.contains_key(&slot as &dyn SlotParts) {
                        by_slot.entry(slot.to_slot()).or_default().push(d);
                    }
                }
            }
        }
        let keep = |e: &Entry, diff: &[&Difference]| {
            let stays = if e.min_rv > cache_rv {
                e.min_rv >= list_rv
            } else {
                list_rv == cache_rv && !diff.iter().any(|d| d.concerns(&e.filter))
            };
            stays && !went_back && !e.replaying && !e.tx.is_closed()
        };
        let before = self.len();
        if !self.all.is_empty() {
            let all: Vec<&Difference> = diff.iter().collect();
            self.all.retain(|_, e| keep(e, &all));
        }
        for (slot, m) in self.indexed.iter_mut() {
            let diff = by_slot.get(slot).map(Vec::as_slice).unwrap_or_default();
            m.retain(|_, e| keep(e, diff));
        }
        self.indexed.retain(|_, m| !m.is_empty());
        let ended = before - self.len();
        self.ended_at_relist += ended as u64;
        ended
    }

    /// Sends `d` to every interested watcher without blocking. A closed queue drops its
    /// watcher; a full one is pushed to `blocked` when given (the watcher stays registered),
    /// else dropped. Returns how many watchers received the event.
    pub fn dispatch(&mut self, d: &Dispatched, mut blocked: Option<&mut Vec<Blocked>>) -> usize {
        let mut sent = 0;
        let mut dropped = 0;
        let mut filtered = 0;
        self.offered += self.all.len() as u64;
        self.sampler.event();
        let sampler = &mut self.sampler;
        let mut out =
            Out { blocked: blocked.as_deref_mut(), dropped: &mut dropped, filtered: &mut filtered, sampler };
        sent += send_all(&mut self.all, None, d, &mut out);
        if !self.indexed.is_empty() {
            for slot in slots_of(std::iter::once(&*d.event.object).chain(d.event.prev.as_deref())) {
                if let Some(m) = self.indexed.get_mut(&slot as &dyn SlotParts) {
                    self.offered += m.len() as u64;
                    let mut out = Out {
                        blocked: blocked.as_deref_mut(),
                        dropped: &mut dropped,
                        filtered: &mut filtered,
                        sampler: &mut self.sampler,
                    };
                    sent += send_all(m, Some(slot), d, &mut out);
                }
            }
        }
        if dropped > 0 {
            self.indexed.retain(|_, m| !m.is_empty());
            self.terminated += dropped;
        }
        self.delivered += sent as u64;
        self.shard_filtered += filtered;
        sent
    }
}

/// One object that a relist changes: its state in the list (`now`) and in the cache
/// (`before`); at least one is set.
#[derive(Debug)]
pub struct Difference {
    pub now: Option<Arc<Object>>,
    pub before: Option<Arc<Object>>,
}

impl Difference {
    /// Whether a watcher with `filter` would get an event for it: the object is or was selected.
    fn concerns(&self, filter: &Filter) -> bool {
        filter.is_everything() || self.now.iter().chain(self.before.iter()).any(|o| filter.matches(o))
    }
}

/// The indexed slots an event concerns: its namespace, the node of its current and previous
/// state (a pod moving onto a node is ADDED for that node's watchers, one leaving it DELETED),
/// and the object (its key, the same in both states). Each slot once, borrowed from the
/// objects' headers: at most five for the two objects (an object and its previous state, or a
/// relist's two states of one object), so none is ever left out.
fn slots_of<'a>(objs: impl Iterator<Item = &'a Object>) -> impl Iterator<Item = SlotRef<'a>> {
    let mut slots: [Option<SlotRef<'a>>; 5] = [None; 5];
    let mut n = 0;
    let mut add = |s: SlotRef<'a>| {
        if n < slots.len() && !slots[..n].contains(&Some(s)) {
            slots[n] = Some(s);
            n += 1;
        }
    };
    for o in objs {
        let h = &o.header;
        if !h.namespace().is_empty() {
            add(SlotRef::Namespace(h.namespace()));
        }
        if let Some(node) = h.fields().get("spec.nodeName").filter(|n| !n.is_empty()) {
            add(SlotRef::Node(node));
        }
        add(SlotRef::Object(h.key.as_str()));
    }
    slots.into_iter().flatten()
}

/// Where `send_all` puts watchers whose queue is full.
struct Out<'a> {
    blocked: Option<&'a mut Vec<Blocked>>,
    dropped: &'a mut u64,
    /// Events kept from sharded watchers by their shard.
    filtered: &'a mut u64,
    sampler: &'a mut Sampler,
}

/// Offers the event to the watchers of `m`: those of the indexed `slot`, or (`None`) of every
/// namespace.
fn send_all(
    m: &mut HashMap<u64, Entry>,
    slot: Option<SlotRef<'_>>,
    d: &Dispatched,
    out: &mut Out<'_>,
) -> usize {
    let mut sent = 0;
    m.retain(|id, e| {
        if d.event.rv <= e.min_rv {
            return !e.tx.is_closed();
        }
        let frame = match e.filter.frame_for(&d.event, &d.lazy) {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                if e.filter.shard_excludes(&d.event) {
                    *out.filtered += 1;
                }
                return !e.tx.is_closed();
            }
            Err(NoExactEncoding) => {
                // Its stream ends after what it has; the client resumes from its last RV, and
                // the resource's protobuf reads go upstream from now on.
                tracing::info!(rv = %d.event.rv, "ending a protobuf watcher: an event without an exact protobuf encoding");
                return false;
            }
        };
        let arrived_ns = if out.sampler.take() { d.arrived_ns } else { 0 };
        match e.tx.try_send(Delivery { rv: d.event.rv, frame, arrived_ns }) {
            Ok(()) => {
                sent += 1;
                true
            }
            Err(mpsc::error::TrySendError::Full(delivery)) => match out.blocked.as_deref_mut() {
                Some(b) => {
                    let id = WatcherId { id: *id, slot: slot.map_or(Slot::All, SlotRef::to_slot) };
                    b.push(Blocked { id, tx: e.tx.clone(), delivery });
                    true
                }
                None => {
                    *out.dropped += 1;
                    too_slow(Some(d.event.rv));
                    false
                }
            },
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    });
    sent
}

/// A watcher closed for not keeping up: a caller can open many and never read them, so one
/// warning per 30 s (`crate::warn_gate`; the count is `watchcache_terminated_watchers_total`).
fn too_slow(rv: Option<crate::resource::Rv>) {
    static SLOW: crate::warn_gate::WarnGate = crate::warn_gate::WarnGate::new();
    const WHAT: &str = "closing a watcher that is too slow to keep up";
    match SLOW.pass() {
        Some(held) => tracing::warn!(rv = ?rv, similar_since_last = held, "{WHAT}"),
        None => tracing::debug!(rv = ?rv, "{WHAT}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_borrowed_slot_finds_exactly_the_owned_one() {
        let mut m: HashMap<Slot, u8> = HashMap::new();
        m.insert(Slot::Namespace("a".into()), 1);
        m.insert(Slot::Node("a".into()), 2);
        m.insert(Slot::All, 3);
        let get = |s: SlotRef<'_>| m.get(&s as &dyn SlotParts).copied();
        assert_eq!(get(SlotRef::Namespace("a")), Some(1));
        assert_eq!(get(SlotRef::Node("a")), Some(2));
        assert_eq!(get(SlotRef::Node("b")), None);
        assert_eq!(get(SlotRef::Namespace("")), None);
        assert_eq!(SlotRef::Node("a").to_slot(), Slot::Node("a".into()));
        assert_ne!(Slot::Node("a".into()), Slot::Namespace("a".into()));
        assert_ne!(Slot::Object("a".into()), Slot::Namespace("a".into()));
        assert_eq!(SlotRef::Object("ns/a").to_slot(), Slot::Object("ns/a".into()));
    }

    /// Watches of one object are registered under its key, except a namespaced resource's name
    /// in every namespace; the node and namespace slots are as before.
    #[test]
    fn a_watch_of_one_name_is_indexed_by_the_objects_key() {
        use crate::selector::{FieldSelector, LabelSelector};
        let pods = crate::resource::ResourceKind::new("", "v1", "pods", "Pod", true, true);
        let f = |ns: Option<&str>, fields: &str| {
            let fields = FieldSelector::parse(fields, &pods).unwrap();
            Filter::new(ns.map(str::to_owned), None, LabelSelector::default(), fields)
        };
        assert_eq!(slot_of(&f(Some("ns"), "metadata.name=a"), true), Slot::Object("ns/a".into()));
        assert_eq!(slot_of(&f(None, "metadata.name=n1"), false), Slot::Object("n1".into()));
        assert_eq!(slot_of(&f(None, "metadata.name=a"), true), Slot::All, "in every namespace");
        assert_eq!(slot_of(&f(Some("ns"), "metadata.name="), true), Slot::Namespace("ns".into()));
        assert_eq!(slot_of(&f(Some("ns"), "metadata.name!=a"), true), Slot::Namespace("ns".into()));
        assert_eq!(
            slot_of(&f(None, "metadata.namespace=ns,metadata.name=a"), true),
            Slot::Object("ns/a".into())
        );
        assert_eq!(slot_of(&f(Some("ns"), "spec.nodeName=n1"), true), Slot::Node("n1".into()));
    }
}
