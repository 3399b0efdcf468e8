//! The etcd-like store: one global revision counter, the current objects of every resource
//! (persistent ordered maps, so a snapshot is an O(1) clone) and a log of recent changes with
//! a compaction point.
//!
//! Invariant: the log holds exactly the revisions `compacted+1 ..= rev`, one entry each, in
//! order; it never holds more than `window` entries (older ones are compacted away).
//! Every write — HTTP, the direct API, churn — goes through [`Store::create`], [`Store::update`]
//! or [`Store::delete`]. Readers (`read`, `watch`) take snapshots or log slices under the lock
//! and do all encoding outside it; `rev_tx` wakes freshness waits. A watch reads the log until
//! it has caught up, then follows: each new entry is sent, under the lock that logs it, to the
//! watches it may concern ([`Slot`]: every watch of its resource, or the kubelets of its pod's
//! node, as the apiserver's cacher dispatches pods by `spec.nodeName`), not to every watch.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use imbl::OrdMap;
use parking_lot::Mutex;
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::encode;
use super::kinds::Kinds;
use kube_watchcache::error::Error;
use kube_watchcache::resource::{typing, Event, EventType, Object, ObjectKey, Rv};

/// The objects of one resource, ordered by key.
pub type Objects = OrdMap<ObjectKey, Arc<Object>>;

/// One revision: which resource changed, and the event (with the previous state).
#[derive(Debug)]
pub struct Entry {
    pub res: usize,
    pub event: Event,
}

struct State {
    rev: u64,
    compacted: u64,
    objects: Vec<Objects>,
    log: VecDeque<Arc<Entry>>,
    /// The watches following the log, by what they are sent.
    following: HashMap<Slot, Vec<mpsc::Sender<Arc<Entry>>>>,
    /// The keys of the current objects with a non-empty `spec.nodeName`, by resource and node
    /// (the Node authorizer's graph reads a node's pods here, not by scanning every pod).
    on_node: HashMap<(usize, String), BTreeSet<ObjectKey>>,
}

/// Which new entries a watch that follows the log is sent.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Slot {
    /// Every entry of resource `.0`.
    All(usize),
    /// The entries of resource `.0` whose object, or its previous state, has `spec.nodeName`
    /// `.1` (a pod watch with that exact, non-empty requirement: a kubelet's).
    Node(usize, String),
}

impl Slot {
    fn res(&self) -> usize {
        match self {
            Slot::All(r) | Slot::Node(r, _) => *r,
        }
    }
}

/// Some entries after the revision asked for are compacted away.
#[derive(Debug)]
pub struct Compacted;

/// What [`Store::since_or_follow`] gives: log entries, and once they reach the log's end, the
/// queue every later entry for the watch's slot arrives in.
pub type Caught = (Vec<Arc<Entry>>, Option<mpsc::Receiver<Arc<Entry>>>);

pub struct Store {
    pub kinds: Kinds,
    prefixes: Vec<kube_watchcache::resource::Typing>,
    window: usize,
    state: Mutex<State>,
    /// `State::compacted`, readable without the lock (a following watch checks each entry it
    /// takes against it).
    compacted: AtomicU64,
    rev_tx: tokio::sync::watch::Sender<u64>,
}

impl Store {
    /// How resource `res` is typed when encoded (JSON prefix, protobuf message).
    pub fn typing(&self, res: usize) -> &kube_watchcache::resource::Typing {
        &self.prefixes[res]
    }

    pub fn new(kinds: Kinds, window: usize) -> Store {
        let prefixes = kinds.all.iter().map(|s| typing(&s.kind)).collect();
        let n = kinds.all.len();
        // Revision 1 is etcd's first; start a little above it like a fresh cluster.
        let (rev_tx, _) = tokio::sync::watch::channel(1);
        Store {
            kinds,
            prefixes,
            window: window.max(1),
            state: Mutex::new(State {
                rev: 1,
                compacted: 1,
                objects: vec![Objects::new(); n],
                log: VecDeque::new(),
                following: HashMap::new(),
                on_node: HashMap::new(),
            }),
            compacted: AtomicU64::new(1),
            rev_tx,
        }
    }

    pub fn current_rv(&self) -> Rv {
        Rv(self.state.lock().rev)
    }

    pub fn compacted(&self) -> Rv {
        Rv(self.state.lock().compacted)
    }

    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.rev_tx.subscribe()
    }

    /// Waits until the revision reaches `rv`, at most 3 s (the cacher's `blockTimeout`);
    /// `Err` carries the 504 TooLarge (with the cacher's `Retry-After: 1`).
    pub async fn wait_for(&self, rv: Rv) -> Result<(), Error> {
        let mut rx = self.subscribe();
        let res = tokio::time::timeout(std::time::Duration::from_secs(3), rx.wait_for(|r| *r >= rv.0)).await;
        match res {
            Ok(Ok(_)) => Ok(()),
            _ => Err(Error::TooLargeResourceVersion {
                requested: rv,
                current: self.current_rv(),
                retry_after: 1,
            }),
        }
    }

    /// A read of a kind the apiserver does not cache (events): etcd's storage answers a
    /// revision past its own at once, with no `Retry-After` (`validateMinimumResourceVersion`;
    /// recorded: events-not-cached.json, a 504 after 0.0 s without one).
    pub fn at_least(&self, rv: Rv) -> Result<(), Error> {
        let current = self.current_rv();
        if rv > current {
            return Err(Error::TooLargeResourceVersion { requested: rv, current, retry_after: 0 });
        }
        Ok(())
    }

    /// The current objects of a resource and the revision they are at.
    pub fn snapshot(&self, res: usize) -> (Rv, Objects) {
        let st = self.state.lock();
        (Rv(st.rev), st.objects[res].clone())
    }

    /// The objects of a resource as they were at revision `at` (rewinding the log), or
    /// `Err(compacted)` when `at` is older than the compaction point. `at` must be ≤ current.
    pub fn snapshot_at(&self, res: usize, at: Rv) -> Result<Objects, Rv> {
        let st = self.state.lock();
        if at.0 < st.compacted {
            return Err(Rv(st.compacted));
        }
        let mut objects = st.objects[res].clone();
        for e in st.log.iter().rev().take_while(|e| e.event.rv > at).filter(|e| e.res == res) {
            let key = e.event.object.header.key.clone();
            match &e.event.prev {
                Some(prev) => objects.insert(key, prev.clone()),
                None => objects.remove(&key),
            };
        }
        Ok(objects)
    }

    /// Up to `max` log entries after `after` (all resources); when they reach the log's end,
    /// the watch is made to follow it (atomically: no entry is in both, none in neither), and
    /// every later entry for `slot` is sent to the queue returned, in order. A watch that lets
    /// `window` entries queue up is let go (its queue ends after them), as one whose revisions
    /// were compacted.
    pub fn since_or_follow(&self, after: Rv, max: usize, slot: &Slot) -> Result<Caught, Compacted> {
        let mut st = self.state.lock();
        if after.0 < st.compacted {
            return Err(Compacted);
        }
        let skip = (after.0 - st.compacted) as usize;
        let entries: Vec<_> = st.log.iter().skip(skip).take(max).cloned().collect();
        if skip + entries.len() < st.log.len() {
            return Ok((entries, None));
        }
        let (tx, rx) = mpsc::channel(self.window.min(1 << 30));
        let txs = st.following.entry(slot.clone()).or_default();
        // The watches of this slot that ended (a kubelet's previous watch) are forgotten here
        // too, not only at the slot's next event, which may never come.
        txs.retain(|t| !t.is_closed());
        txs.push(tx);
        Ok((entries, Some(rx)))
    }

    /// Watches registered in `slot` (for tests).
    #[cfg(test)]
    fn following(&self, slot: &Slot) -> usize {
        self.state.lock().following.get(slot).map_or(0, Vec::len)
    }

    /// Whether the entry of revision `rv` has been compacted away.
    pub fn is_compacted(&self, rv: Rv) -> bool {
        rv.0 <= self.compacted.load(Ordering::Acquire)
    }

    pub fn get(&self, res: usize, key: &ObjectKey) -> Option<Arc<Object>> {
        self.state.lock().objects[res].get(key).cloned()
    }

    /// The current objects of resource `res` whose `spec.nodeName` is `node`, in key order.
    pub fn on_node(&self, res: usize, node: &str) -> Vec<Arc<Object>> {
        self.snapshot_on_node(res, node).1
    }

    /// [`Store::on_node`] and the revision they are the state at, read together (a LIST
    /// selecting one node, as the apiserver's watch cache serves it from its `spec.nodeName`
    /// index rather than by reading every pod).
    pub fn snapshot_on_node(&self, res: usize, node: &str) -> (Rv, Vec<Arc<Object>>) {
        let st = self.state.lock();
        let objects = match st.on_node.get(&(res, node.to_owned())) {
            Some(keys) => keys.iter().filter_map(|k| st.objects[res].get(k).cloned()).collect(),
            None => Vec::new(),
        };
        (Rv(st.rev), objects)
    }

    /// Compacts the log at the current revision.
    pub fn compact(&self) {
        let mut st = self.state.lock();
        st.log.clear();
        st.compacted = st.rev;
        self.compacted.store(st.compacted, Ordering::Release);
    }

    /// Stores a new object. `obj` has its final name/namespace; uid, creationTimestamp,
    /// resourceVersion and generation are filled in here.
    pub fn create(&self, res: usize, mut obj: Map<String, Value>) -> Result<Arc<Object>, Error> {
        let kind = self.kinds.kind(res).clone();
        let (ns, name) = names(&obj);
        let key = ObjectKey::new(&ns, &name);
        {
            let meta = meta_mut(&mut obj);
            meta.insert("uid".into(), Value::String(encode::uid()));
            meta.insert("creationTimestamp".into(), Value::String(encode::now_rfc3339()));
            meta.remove("deletionTimestamp");
            if has_generation(&kind) {
                meta.insert("generation".into(), Value::from(1));
            }
        }
        let mut st = self.state.lock();
        if kind.namespaced {
            let ns_key = ObjectKey::new("", &ns);
            if !st.objects[self.kinds.namespaces()].contains_key(&ns_key) {
                let nsk = self.kinds.kind(self.kinds.namespaces());
                return Err(Error::not_found(nsk, &ns));
            }
        }
        if st.objects[res].contains_key(&key) {
            return Err(Error::AlreadyExists { resource: kind.resource, group: kind.group, name });
        }
        let object = self.commit(&mut st, res, EventType::Added, obj, None)?;
        drop(st);
        self.notify();
        Ok(object)
    }

    /// Replaces an object. A stale `metadata.resourceVersion` is a 409 Conflict; an update that
    /// changes nothing takes no revision (like the apiserver).
    pub fn update(&self, res: usize, mut obj: Map<String, Value>) -> Result<Arc<Object>, Error> {
        let kind = self.kinds.kind(res).clone();
        let (ns, name) = names(&obj);
        let key = ObjectKey::new(&ns, &name);
        let mut st = self.state.lock();
        let Some(old) = st.objects[res].get(&key).cloned() else {
            return Err(Error::not_found(&kind, &name));
        };
        let old_v: Map<String, Value> =
            serde_json::from_slice(&old.typed_bytes()).map_err(|e| Error::Internal(e.to_string()))?;
        let old_meta = old_v.get("metadata").and_then(Value::as_object).cloned().unwrap_or_default();
        {
            let meta = meta_mut(&mut obj);
            match meta.get("resourceVersion").and_then(Value::as_str) {
                Some(rv) if !rv.is_empty() && rv != old.header.rv.to_string() => {
                    return Err(Error::Conflict { resource: kind.resource, group: kind.group, name });
                }
                _ => {}
            }
            for k in ["uid", "creationTimestamp", "generation", "deletionTimestamp"] {
                match old_meta.get(k) {
                    Some(v) => meta.insert(k.into(), v.clone()),
                    None => meta.remove(k),
                };
            }
            meta.insert("resourceVersion".into(), Value::String(old.header.rv.to_string()));
        }
        let mut new_cmp = obj.clone();
        new_cmp.insert("kind".into(), Value::String(kind.kind.clone()));
        new_cmp.insert("apiVersion".into(), Value::String(kind.api_version()));
        if new_cmp == old_v {
            return Ok(old);
        }
        if has_generation(&kind) && obj.get("spec") != old_v.get("spec") {
            let g = old_meta.get("generation").and_then(Value::as_i64).unwrap_or(0) + 1;
            meta_mut(&mut obj).insert("generation".into(), Value::from(g));
        }
        let object = self.commit(&mut st, res, EventType::Modified, obj, Some(old))?;
        drop(st);
        self.notify();
        Ok(object)
    }

    /// Graceful deletion of a pod bound to a node, which no kubelet finishes here: sets
    /// `deletionTimestamp` / `deletionGracePeriodSeconds` once, as a MODIFIED event
    /// (watch-pod-graceful-delete.json). Marking an already marked pod changes nothing.
    pub fn mark_deleting(&self, res: usize, key: &ObjectKey, grace: i64) -> Result<Arc<Object>, Error> {
        let kind = self.kinds.kind(res).clone();
        let mut st = self.state.lock();
        let Some(old) = st.objects[res].get(key).cloned() else {
            return Err(Error::not_found(&kind, key.as_str().rsplit('/').next().unwrap_or("")));
        };
        let mut v: Map<String, Value> =
            serde_json::from_slice(&old.typed_bytes()).map_err(|e| Error::Internal(e.to_string()))?;
        let meta = meta_mut(&mut v);
        // A shorter grace period re-marks the pod (one more MODIFIED); the same one is a no-op.
        if meta.get("deletionGracePeriodSeconds").and_then(Value::as_i64).is_some_and(|g| g <= grace) {
            return Ok(old);
        }
        meta.insert("deletionTimestamp".into(), Value::String(encode::now_rfc3339()));
        meta.insert("deletionGracePeriodSeconds".into(), Value::from(grace));
        let object = self.commit(&mut st, res, EventType::Modified, v, Some(old))?;
        drop(st);
        self.notify();
        Ok(object)
    }

    /// Deletes an object (immediately: no finalizers, no graceful pod termination). Deleting a
    /// namespace deletes its contents first, as the namespace controller would. Returns the
    /// object carrying the deletion revision.
    pub fn delete(&self, res: usize, ns: &str, name: &str) -> Result<Arc<Object>, Error> {
        let kind = self.kinds.kind(res).clone();
        let key = ObjectKey::new(if kind.namespaced { ns } else { "" }, name);
        let mut st = self.state.lock();
        if !st.objects[res].contains_key(&key) {
            return Err(Error::not_found(&kind, name));
        }
        if res == self.kinds.namespaces() {
            let prefix = format!("{name}/");
            for r in 0..self.kinds.all.len() {
                if !self.kinds.kind(r).namespaced {
                    continue;
                }
                let keys: Vec<ObjectKey> = st.objects[r]
                    .range(ObjectKey::new(name, "")..)
                    .take_while(|(k, _)| k.as_str().starts_with(&prefix))
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in keys {
                    self.delete_locked(&mut st, r, &k)?;
                }
            }
        }
        let object = self.delete_locked(&mut st, res, &key)?;
        drop(st);
        self.notify();
        Ok(object)
    }

    fn delete_locked(&self, st: &mut State, res: usize, key: &ObjectKey) -> Result<Arc<Object>, Error> {
        let Some(old) = st.objects[res].get(key).cloned() else {
            return Err(Error::Internal(format!("{} vanished", key.as_str())));
        };
        let v: Map<String, Value> =
            serde_json::from_slice(&old.typed_bytes()).map_err(|e| Error::Internal(e.to_string()))?;
        self.commit(st, res, EventType::Deleted, v, Some(old))
    }

    /// Takes the next revision for `obj`, stores it (or removes it for DELETED) and logs it.
    fn commit(
        &self,
        st: &mut State,
        res: usize,
        t: EventType,
        mut obj: Map<String, Value>,
        prev: Option<Arc<Object>>,
    ) -> Result<Arc<Object>, Error> {
        let kind = self.kinds.kind(res);
        let rv = st.rev + 1;
        meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let bytes = Bytes::from(encode::object(kind, &obj));
        let object = Object::parse(kind, &self.prefixes[res], bytes)
            .map(Arc::new)
            .map_err(|e| Error::Internal(e.to_string()))?;
        st.rev = rv;
        let key = object.header.key.clone();
        // The node the object is on (a DELETED event's object too: its kubelets are sent it) and
        // the one its previous state was on, read once for the index and the dispatch.
        let on = node_of(&object);
        let was = prev.as_deref().and_then(node_of);
        let now = if t == EventType::Deleted { None } else { on.clone() };
        if was != now {
            if let Some(w) = &was {
                let slot = (res, w.clone());
                if let Some(keys) = st.on_node.get_mut(&slot) {
                    keys.remove(&key);
                    if keys.is_empty() {
                        st.on_node.remove(&slot);
                    }
                }
            }
            if let Some(n) = &now {
                st.on_node.entry((res, n.clone())).or_default().insert(key.clone());
            }
        }
        if t == EventType::Deleted {
            st.objects[res].remove(&key);
        } else {
            st.objects[res].insert(key, object.clone());
        }
        let entry = Arc::new(Entry { res, event: Event::new(t, Rv(rv), object.clone(), prev) });
        follow(&mut st.following, &entry, on, was);
        st.log.push_back(entry);
        while st.log.len() > self.window {
            st.log.pop_front();
            st.compacted += 1;
        }
        self.compacted.store(st.compacted, Ordering::Release);
        Ok(object)
    }

    fn notify(&self) {
        let rev = self.state.lock().rev;
        self.rev_tx.send_replace(rev);
    }

    /// The storage restored from a backup taken at revision `at` without `--bump-revision`
    /// (`etcdutl snapshot restore`): every resource's objects as they were at `at`, the log
    /// cut there, the revision counter back at `at` — the next write takes `at + 1` again, for
    /// another change than the one that had it. Every watch following the log ends. `Err`
    /// (the compaction point) when `at` is compacted away or not reached yet.
    pub fn restore_to(&self, at: Rv) -> Result<(), Rv> {
        let mut st = self.state.lock();
        if at.0 < st.compacted || at.0 > st.rev {
            return Err(Rv(st.compacted));
        }
        while let Some(e) = st.log.pop_back() {
            if e.event.rv <= at {
                st.log.push_back(e);
                break;
            }
            let key = e.event.object.header.key.clone();
            match &e.event.prev {
                Some(prev) => st.objects[e.res].insert(key, prev.clone()),
                None => st.objects[e.res].remove(&key),
            };
        }
        st.rev = at.0;
        let mut on_node: HashMap<(usize, String), BTreeSet<ObjectKey>> = HashMap::new();
        for (res, objects) in st.objects.iter().enumerate() {
            for (key, o) in objects.iter() {
                if let Some(n) = node_of(o) {
                    on_node.entry((res, n)).or_default().insert(key.clone());
                }
            }
        }
        st.on_node = on_node;
        st.following.clear();
        drop(st);
        self.notify();
        Ok(())
    }

    /// Lets go of every watch following resource `res` (withdrawn: its storage torn down); each
    /// ends after what it was sent.
    pub fn end_watches(&self, res: usize) {
        self.state.lock().following.retain(|slot, _| slot.res() != res);
    }
}

/// Sends `entry` to the watches following its resource that it may concern: every one of the
/// resource, and those of the node its object is on (`now`) or was on (`was`). A watch whose queue
/// is full is let go; one that went away is forgotten.
fn follow(
    following: &mut HashMap<Slot, Vec<mpsc::Sender<Arc<Entry>>>>,
    entry: &Arc<Entry>,
    now: Option<String>,
    was: Option<String>,
) {
    let was = was.filter(|w| now.as_ref() != Some(w));
    let slots = [
        Some(Slot::All(entry.res)),
        now.map(|n| Slot::Node(entry.res, n)),
        was.map(|n| Slot::Node(entry.res, n)),
    ];
    for slot in slots.into_iter().flatten() {
        let Some(txs) = following.get_mut(&slot) else { continue };
        txs.retain(|tx| tx.try_send(entry.clone()).is_ok());
        if txs.is_empty() {
            following.remove(&slot);
        }
    }
}

/// An object's non-empty `spec.nodeName` (a pod's node).
fn node_of(o: &Object) -> Option<String> {
    o.header.fields().get("spec.nodeName").filter(|n| !n.is_empty()).map(str::to_owned)
}

fn names(obj: &Map<String, Value>) -> (String, String) {
    let meta = obj.get("metadata").and_then(Value::as_object);
    let get = |k: &str| meta.and_then(|m| m.get(k)).and_then(Value::as_str).unwrap_or("").to_owned();
    (get("namespace"), get("name"))
}

/// `metadata`, created when missing or not an object.
pub fn meta_mut(obj: &mut Map<String, Value>) -> &mut Map<String, Value> {
    let entry = obj.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    match entry {
        Value::Object(m) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// Kinds whose metadata.generation tracks spec changes.
fn has_generation(kind: &kube_watchcache::resource::ResourceKind) -> bool {
    !kind.builtin || matches!(kind.group.as_str(), "apps" | "batch")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A store with a `default` namespace; the indexes of pods and configmaps.
    fn store(window: usize) -> (Store, usize, usize) {
        let s = Store::new(Kinds::builtin(), window);
        s.create(s.kinds.namespaces(), obj(json!({"metadata": {"name": "default"}}))).unwrap();
        let (pods, cms) = (s.kinds.by_name("pods").unwrap(), s.kinds.by_name("configmaps").unwrap());
        (s, pods, cms)
    }

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn pod(name: &str, node: &str) -> Map<String, Value> {
        obj(json!({"metadata": {"name": name, "namespace": "default"}, "spec": {"nodeName": node}}))
    }

    fn cm(name: &str) -> Map<String, Value> {
        obj(json!({"metadata": {"name": name, "namespace": "default"}}))
    }

    /// Follows the log from the current revision.
    fn follow(s: &Store, slot: Slot) -> mpsc::Receiver<Arc<Entry>> {
        let (entries, rx) = s.since_or_follow(s.current_rv(), 1000, &slot).unwrap();
        assert!(entries.is_empty());
        rx.expect("caught up at once")
    }

    /// What is queued: (type, name) of each entry.
    fn queued(rx: &mut mpsc::Receiver<Arc<Entry>>) -> Vec<(EventType, String)> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| (e.event.kind, e.event.object.header.name().to_owned()))
            .collect()
    }

    #[test]
    fn a_nodes_pods_are_read_from_the_index_kept_with_every_write() {
        let (s, pods, cms) = store(100);
        let names = |node: &str| -> Vec<String> {
            s.on_node(pods, node).iter().map(|o| o.header.name().to_owned()).collect()
        };
        s.create(pods, pod("p1", "node-a")).unwrap();
        s.create(pods, pod("p2", "node-a")).unwrap();
        s.create(pods, pod("p3", "node-b")).unwrap();
        s.create(pods, pod("unscheduled", "")).unwrap();
        s.create(cms, cm("c")).unwrap();
        assert_eq!(names("node-a"), ["p1", "p2"]);
        assert_eq!(names("node-b"), ["p3"]);
        assert!(names("").is_empty(), "an unscheduled pod is on no node");
        // Bound later, moved, changed in place, deleted: the index follows each write.
        s.update(pods, pod("unscheduled", "node-b")).unwrap();
        s.update(pods, pod("p1", "node-b")).unwrap();
        let mut p2 = pod("p2", "node-a");
        p2.insert("status".into(), json!({"phase": "Running"}));
        s.update(pods, p2).unwrap();
        s.delete(pods, "default", "p3").unwrap();
        assert_eq!(names("node-a"), ["p2"]);
        assert_eq!(names("node-b"), ["p1", "unscheduled"]);
        // The current objects, not the versions the index saw first.
        assert_eq!(
            s.on_node(pods, "node-a")[0].header.rv,
            s.get(pods, &ObjectKey::new("default", "p2")).unwrap().header.rv
        );
        // A namespace's deletion takes its pods off their nodes; an emptied node leaves no entry.
        s.delete(s.kinds.namespaces(), "", "default").unwrap();
        assert!(names("node-a").is_empty() && names("node-b").is_empty());
        assert!(s.state.lock().on_node.is_empty());
        assert!(s.on_node(cms, "node-a").is_empty());
    }

    /// A backup restored without `--bump-revision`: the objects as they were at the backup's
    /// revision (created ones gone, deleted and changed ones back, the node index with them),
    /// the following watches let go, and the next write takes the revision after it again.
    #[test]
    fn a_restore_rewinds_objects_index_and_revision_and_ends_the_watches() {
        let (s, pods, cms) = store(100);
        s.create(pods, pod("kept", "node-a")).unwrap();
        s.create(pods, pod("moved", "node-a")).unwrap();
        s.create(cms, cm("deleted")).unwrap();
        let at = s.current_rv();
        let versions = |s: &Store| -> Vec<(String, Rv)> {
            s.snapshot(pods).1.values().map(|o| (o.header.name().to_owned(), o.header.rv)).collect()
        };
        let before = versions(&s);
        let mut watch = follow(&s, Slot::All(pods));
        s.update(pods, pod("moved", "node-b")).unwrap();
        s.create(pods, pod("created", "node-a")).unwrap();
        s.delete(cms, "default", "deleted").unwrap();
        let last = s.current_rv();
        assert_eq!(s.restore_to(Rv(last.0 + 1)), Err(Rv(1)), "not reached yet");
        s.restore_to(at).unwrap();
        assert_eq!(s.current_rv(), at);
        assert_eq!(versions(&s), before);
        assert!(s.get(cms, &ObjectKey::new("default", "deleted")).is_some());
        let names = |node: &str| -> Vec<String> {
            s.on_node(pods, node).iter().map(|o| o.header.name().to_owned()).collect()
        };
        assert_eq!(names("node-a"), ["kept", "moved"]);
        assert!(names("node-b").is_empty());
        assert_eq!(queued(&mut watch).len(), 2, "what it was sent before");
        assert!(watch.try_recv().is_err() && watch.is_closed(), "let go");
        let again = s.create(pods, pod("other", "node-c")).unwrap();
        assert_eq!(again.header.rv, Rv(at.0 + 1), "the revision after the backup's, again");
        // The entries up to the backup's revision are still there to replay.
        assert_eq!(s.snapshot_at(pods, Rv(at.0 - 2)).unwrap().len(), 1);
        // A revision already compacted cannot be restored to.
        s.compact();
        assert_eq!(s.restore_to(Rv(at.0)), Err(Rv(at.0 + 1)));
    }

    #[test]
    fn a_kubelets_watch_is_sent_its_nodes_pods_only_and_a_pod_that_left_its_node() {
        let (s, pods, cms) = store(100);
        s.create(pods, pod("before", "node-a")).unwrap();
        let mut a = follow(&s, Slot::Node(pods, "node-a".into()));
        let mut b = follow(&s, Slot::Node(pods, "node-b".into()));
        let mut all = follow(&s, Slot::All(pods));
        let mut configmaps = follow(&s, Slot::All(cms));
        s.create(pods, pod("p1", "node-a")).unwrap();
        s.create(pods, pod("p2", "node-b")).unwrap();
        s.create(pods, pod("unscheduled", "")).unwrap();
        s.create(cms, cm("c")).unwrap();
        // p1 moves from node-a to node-b: both kubelets' watches are sent it (node-a's filter
        // turns it into a DELETED).
        s.update(pods, pod("p1", "node-b")).unwrap();
        s.delete(pods, "default", "p2").unwrap();
        use EventType::*;
        let named = |v: &[(EventType, &str)]| v.iter().map(|(t, n)| (*t, n.to_string())).collect::<Vec<_>>();
        assert_eq!(queued(&mut a), named(&[(Added, "p1"), (Modified, "p1")]));
        assert_eq!(queued(&mut b), named(&[(Added, "p2"), (Modified, "p1"), (Deleted, "p2")]));
        assert_eq!(
            queued(&mut all),
            named(&[(Added, "p1"), (Added, "p2"), (Added, "unscheduled"), (Modified, "p1"), (Deleted, "p2")])
        );
        assert_eq!(queued(&mut configmaps), named(&[(Added, "c")]));
    }

    #[test]
    fn a_watch_reads_the_log_then_follows_it_without_a_gap_or_a_double() {
        let (s, _, cms) = store(100);
        let start = s.current_rv();
        for i in 0..5 {
            s.create(cms, cm(&format!("c{i}"))).unwrap();
        }
        let (mut pos, mut got, slot) = (start, Vec::new(), Slot::All(cms));
        let mut rx = loop {
            let (entries, rx) = s.since_or_follow(pos, 2, &slot).unwrap();
            for e in entries {
                pos = e.event.rv;
                got.push(e.event.object.header.name().to_owned());
            }
            if let Some(rx) = rx {
                break rx;
            }
        };
        for i in 5..7 {
            s.create(cms, cm(&format!("c{i}"))).unwrap();
        }
        got.extend(queued(&mut rx).into_iter().map(|(_, n)| n));
        assert_eq!(got, (0..7).map(|i| format!("c{i}")).collect::<Vec<_>>());
    }

    #[test]
    fn a_watch_that_lets_a_window_of_entries_queue_up_is_let_go() {
        let (s, _, cms) = store(3);
        let mut rx = follow(&s, Slot::All(cms));
        let first = Rv(s.current_rv().0 + 1);
        for i in 0..4 {
            s.create(cms, cm(&format!("c{i}"))).unwrap();
        }
        assert!(s.is_compacted(first), "the first entry is out of a log of 3");
        assert_eq!(queued(&mut rx).len(), 3);
        assert!(matches!(rx.try_recv(), Err(mpsc::error::TryRecvError::Disconnected)), "let go");
        // From before a compacted entry there is no following: the client's re-watch gets 410.
        assert!(s.since_or_follow(Rv(first.0 - 1), 10, &Slot::All(cms)).is_err());
        assert!(s.since_or_follow(first, 10, &Slot::All(cms)).is_ok());
    }

    #[test]
    fn a_watch_that_ended_is_forgotten_when_its_slot_gets_another() {
        let (s, pods, _) = store(100);
        let slot = Slot::Node(pods, "node-quiet".into());
        for _ in 0..5 {
            // A kubelet's watch times out and it watches again; its node has no events.
            drop(follow(&s, slot.clone()));
        }
        let _live = follow(&s, slot.clone());
        assert_eq!(s.following(&slot), 1);
    }

    #[test]
    fn ending_a_resources_watches_leaves_the_others() {
        let (s, pods, cms) = store(100);
        let mut configmaps = follow(&s, Slot::All(cms));
        let mut kubelet = follow(&s, Slot::Node(pods, "node-a".into()));
        s.end_watches(cms);
        s.create(pods, pod("p", "node-a")).unwrap();
        assert!(matches!(configmaps.try_recv(), Err(mpsc::error::TryRecvError::Disconnected)));
        assert_eq!(queued(&mut kubelet).len(), 1);
    }
}
