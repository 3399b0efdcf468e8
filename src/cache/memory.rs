//! What one resource's cache keeps in memory, for `--cache-memory-limit`: the current objects
//! (each one's JSON, parsed header and the metadata-only / protobuf forms made so far, plus the
//! store's per-entry share) and the history's share (every event's frames, and the object
//! versions only the history still holds: superseded and deleted ones, each counted once).
//! Objects the store holds are counted with the store, never again with the history.
//!
//! Called by `memory` (the governor) through [`Reader::memory`], [`Reader::limit_history`] and
//! [`Reader::unlimit_history`]. The lock is held only to take the store's O(1) snapshot and to
//! clone the history's event pointers; the counting happens outside it.

use std::collections::HashSet;
use std::sync::Arc;

use super::{Reader, Store};
use crate::resource::{Event, Object};

/// A store entry's share of the ordered map (key and value pointers, node slack).
const STORE_ENTRY: usize = 64;
/// A history slot (its time and pointer) with the ring buffer's slack.
const HISTORY_SLOT: usize = 32;

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

impl Reader {
    /// What this cache keeps in memory now (see the module doc).
    pub fn memory(&self) -> Usage {
        let (store, events, cap) = {
            let st = self.shared.state.lock();
            (st.store.clone(), st.history.iter().cloned().collect::<Vec<_>>(), st.history.cap())
        };
        let (objects, history) = measure(&store, &events);
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

/// Bytes of the objects of `store`, and bytes only `events` keep.
fn measure(store: &Store, events: &[Arc<Event>]) -> (u64, u64) {
    let objects: usize = store.values().map(|o| o.kept_bytes() + STORE_ENTRY).sum();
    let mut seen: HashSet<*const Object> = HashSet::new();
    let mut history = 0usize;
    for e in events {
        history += e.frame_bytes() + HISTORY_SLOT;
        for o in std::iter::once(&e.object).chain(e.prev.as_ref()) {
            let current = store.get(&o.header.key).is_some_and(|c| Arc::ptr_eq(c, o));
            if !current && seen.insert(Arc::as_ptr(o)) {
                history += o.kept_bytes();
            }
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
    async fn objects_count_once_and_the_history_counts_what_only_it_keeps() {
        let (mut w, r) = cache::new(kind(), CacheOptions::default());
        w.replace(vec![cm(&w, "a", 10, 10_000), cm(&w, "b", 10, 10_000)], Rv(10));
        let listed = r.memory();
        assert_eq!((listed.events, listed.history), (0, 0));
        assert!(listed.objects > 20_000 && listed.objects < 22_000, "{listed:?}");

        // ADDED: the object is the store's; the history keeps its frame (a copy of the JSON).
        drop(w.apply(EventType::Added, cm(&w, "c", 11, 10_000)).unwrap());
        let added = r.memory();
        assert!(added.objects - listed.objects > 10_000 && added.objects - listed.objects < 11_000);
        assert!(added.history > 10_000 && added.history < 11_000, "{added:?}");

        // MODIFIED: the superseded version is the history's alone now.
        drop(w.apply(EventType::Modified, cm(&w, "c", 12, 10_000)).unwrap());
        let modified = r.memory();
        assert_eq!(modified.objects, added.objects);
        assert!(modified.history - added.history > 20_000, "frame and old version: {modified:?}");

        // A lazily made form counts where its object is: the store's.
        r.get("ns", "a").unwrap().chunks_as(Repr::Metadata).unwrap();
        assert!(r.memory().objects > modified.objects);

        // Shortening the history gives its bytes back and raises the floor.
        r.limit_history(1);
        let short = r.memory();
        assert_eq!((short.events, short.history_cap), (1, 1));
        assert!(short.history < modified.history - 10_000, "the first frame is gone: {short:?}");
        assert_eq!(r.window().0, Rv(11));
        r.unlimit_history();
        assert_eq!(r.memory().history_cap, CacheOptions::default().history_max_events);
    }
}
