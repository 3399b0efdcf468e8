//! The etcd-like store: one global revision counter, the current objects of every resource
//! (persistent ordered maps, so a snapshot is an O(1) clone) and a log of recent changes with
//! a compaction point.
//!
//! Invariant: the log holds exactly the revisions `compacted+1 ..= rev`, one entry each, in
//! order; it never holds more than `window` entries (older ones are compacted away).
//! Every write — HTTP, the direct API, churn — goes through [`Store::create`], [`Store::update`]
//! or [`Store::delete`]. Readers (`read`, `watch`) take snapshots or log slices under the lock
//! and do all encoding outside it; `rev_tx` wakes watchers and freshness waits.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use imbl::OrdMap;
use parking_lot::Mutex;
use serde_json::{Map, Value};

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
}

pub struct Store {
    pub kinds: Kinds,
    prefixes: Vec<kube_watchcache::resource::Typing>,
    window: usize,
    state: Mutex<State>,
    rev_tx: tokio::sync::watch::Sender<u64>,
}

/// Entries after a revision, or `Compacted` when some of them are gone.
pub enum Since {
    Entries(Vec<Arc<Entry>>),
    Compacted,
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
            }),
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
    /// `Err` carries the 504 TooLarge.
    pub async fn wait_for(&self, rv: Rv) -> Result<(), Error> {
        let mut rx = self.subscribe();
        let res = tokio::time::timeout(std::time::Duration::from_secs(3), rx.wait_for(|r| *r >= rv.0)).await;
        match res {
            Ok(Ok(_)) => Ok(()),
            _ => Err(Error::TooLargeResourceVersion { requested: rv, current: self.current_rv() }),
        }
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

    /// Up to `max` log entries after `after` (all resources), or the compaction point if some
    /// of them are gone.
    pub fn since(&self, after: Rv, max: usize) -> Since {
        let st = self.state.lock();
        if after.0 < st.compacted {
            return Since::Compacted;
        }
        let skip = (after.0 - st.compacted) as usize;
        Since::Entries(st.log.iter().skip(skip).take(max).cloned().collect())
    }

    pub fn get(&self, res: usize, key: &ObjectKey) -> Option<Arc<Object>> {
        self.state.lock().objects[res].get(key).cloned()
    }

    /// Compacts the log at the current revision.
    pub fn compact(&self) {
        let mut st = self.state.lock();
        st.log.clear();
        st.compacted = st.rev;
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
        if t == EventType::Deleted {
            st.objects[res].remove(&key);
        } else {
            st.objects[res].insert(key, object.clone());
        }
        st.log.push_back(Arc::new(Entry { res, event: Event::new(t, Rv(rv), object.clone(), prev) }));
        while st.log.len() > self.window {
            st.log.pop_front();
            st.compacted += 1;
        }
        Ok(object)
    }

    fn notify(&self) {
        let rev = self.state.lock().rev;
        self.rev_tx.send_replace(rev);
    }

    /// Wakes every watch without a change (to look at something beside the log: a resource
    /// withdrawn under it).
    pub fn wake_watches(&self) {
        self.rev_tx.send_modify(|_| {});
    }
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
