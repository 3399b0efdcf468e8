//! Live fan-out: the registry of watchers of one resource and the dispatch of each applied
//! event to the interested ones.
//!
//! Owned by the cache state and only touched under its lock: the writer dispatches while it
//! applies an event, and `Reader::watch` registers a watcher in the same critical section in
//! which it reads the history, so a watcher sees every event exactly once. Watchers are found
//! by namespace, so an event costs O(watchers of its namespace + cluster-wide watchers).
//! A watcher whose queue is full is dropped at once (its stream ends after what it already
//! has, like the apiserver's terminated slow watchers); nobody else waits.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::filter::{Dispatched, Filter};
use crate::resource::Rv;

/// One frame queued to a watcher: the event's RV (for bookmark ordering) and its bytes.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub rv: Rv,
    pub frame: Bytes,
}

struct Entry {
    filter: Arc<Filter>,
    /// Events with RV ≤ this are skipped (a watch from a future RV waits for it silently).
    min_rv: Rv,
    tx: mpsc::Sender<Delivery>,
}

/// Registry of live watchers, indexed by namespace scope.
#[derive(Default)]
pub struct Watchers {
    next_id: u64,
    /// Watchers of every namespace (cluster-wide requests, cluster-scoped resources).
    all: HashMap<u64, Entry>,
    /// Watchers of one namespace.
    by_namespace: HashMap<String, HashMap<u64, Entry>>,
    /// Watchers dropped because their queue was full.
    terminated: u64,
}

/// Handle a watch keeps to unregister itself when it ends.
#[derive(Clone, Debug)]
pub struct WatcherId {
    pub(crate) id: u64,
    pub(crate) namespace: Option<String>,
}

impl Watchers {
    /// Registers a watcher; returns its id and queue.
    pub fn add(
        &mut self,
        filter: Arc<Filter>,
        min_rv: Rv,
        queue: usize,
    ) -> (WatcherId, mpsc::Receiver<Delivery>) {
        let (tx, rx) = mpsc::channel(queue.max(1));
        self.next_id += 1;
        let id = self.next_id;
        let namespace = filter.namespace.clone();
        let entry = Entry { filter, min_rv, tx };
        match &namespace {
            Some(ns) => {
                self.by_namespace.entry(ns.clone()).or_default().insert(id, entry);
            }
            None => {
                self.all.insert(id, entry);
            }
        }
        (WatcherId { id, namespace }, rx)
    }

    pub fn remove(&mut self, w: &WatcherId) {
        match &w.namespace {
            Some(ns) => {
                if let Some(m) = self.by_namespace.get_mut(ns) {
                    m.remove(&w.id);
                    if m.is_empty() {
                        self.by_namespace.remove(ns);
                    }
                }
            }
            None => {
                self.all.remove(&w.id);
            }
        }
    }

    /// Number of registered watchers.
    pub fn len(&self) -> usize {
        self.all.len() + self.by_namespace.values().map(HashMap::len).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Watchers dropped so far for being too slow.
    pub fn terminated(&self) -> u64 {
        self.terminated
    }

    /// Drops every watcher: their streams end after what they already have.
    pub fn clear(&mut self) {
        self.all.clear();
        self.by_namespace.clear();
    }

    /// Sends `d` to every interested watcher without blocking; a full or closed queue drops
    /// that watcher. Returns how many watchers received the event.
    pub fn dispatch(&mut self, d: &Dispatched) -> usize {
        let ns = &d.event.object.header.namespace;
        let prev_ns = d.event.prev.as_ref().map(|p| &p.header.namespace);
        let mut sent = 0;
        let mut dropped = 0;
        sent += send_all(&mut self.all, d, &mut dropped);
        if !ns.is_empty() {
            if let Some(m) = self.by_namespace.get_mut(ns) {
                sent += send_all(m, d, &mut dropped);
            }
        }
        // An object never changes namespace, but be exact if a previous state differs.
        if let Some(pns) = prev_ns.filter(|p| *p != ns && !p.is_empty()) {
            if let Some(m) = self.by_namespace.get_mut(pns) {
                sent += send_all(m, d, &mut dropped);
            }
        }
        if dropped > 0 {
            self.by_namespace.retain(|_, m| !m.is_empty());
            self.terminated += dropped;
        }
        sent
    }
}

fn send_all(m: &mut HashMap<u64, Entry>, d: &Dispatched, dropped: &mut u64) -> usize {
    let mut sent = 0;
    m.retain(|_, e| {
        if d.event.rv <= e.min_rv {
            return !e.tx.is_closed();
        }
        let Some(frame) = e.filter.frame_for(&d.event, &d.lazy) else {
            return !e.tx.is_closed();
        };
        match e.tx.try_send(Delivery { rv: d.event.rv, frame }) {
            Ok(()) => {
                sent += 1;
                true
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                *dropped += 1;
                tracing::warn!(rv = %d.event.rv, "closing a watcher that is too slow to keep up");
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    });
    sent
}
