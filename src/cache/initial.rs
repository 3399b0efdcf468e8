//! A watch-list's initial objects (its synthetic ADDED events), taken a step at a time as its
//! client reads: from an O(1) snapshot of the store (`imbl`) — never copied per watch (that
//! was 8 bytes per object per watch, held by a client that never reads). [`Unsent`] lets go of what is left at the watch's deadline.
//!
//! Made by `cache::watch::start`, read by `Watch::poll_next`.

use std::collections::VecDeque;
use std::ops::Bound;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::filter::Filter;
use super::Store;
use crate::resource::{Object, ObjectKey};

/// Objects looked at per step (matching or not): the work of one poll stays bounded.
const STEP: usize = 256;

/// Where the objects come from: a state of the store (the cache's when the watch started, or
/// one proven to be the upstream's at a later RV), keys in `[lo, hi)` (the watch's namespace),
/// from after `after`.
struct Source {
    snapshot: Store,
    after: Option<ObjectKey>,
    lo: Option<ObjectKey>,
    hi: Option<ObjectKey>,
}

/// The initial objects of one watch still to send, in key order, those its filter selects.
pub(super) struct Initial {
    source: Source,
    filter: Arc<Filter>,
    ready: VecDeque<Arc<Object>>,
    exhausted: bool,
}

impl Initial {
    /// The selected objects of `store` (narrowed to the filter's namespace).
    pub fn of_store(store: &Store, filter: Arc<Filter>, namespaced: bool) -> Initial {
        let (lo, hi) = match (&filter.namespace, namespaced) {
            (Some(ns), true) => {
                (Some(ObjectKey::from(format!("{ns}/"))), Some(ObjectKey::from(format!("{ns}0"))))
            }
            _ => (None, None),
        };
        let source = Source { snapshot: store.clone(), after: None, lo, hi };
        Initial { source, filter, ready: VecDeque::new(), exhausted: false }
    }

    /// Whether every object still to send satisfies `ok` (the start's protobuf check).
    pub fn all(&self, ok: impl FnMut(&Object) -> bool) -> bool {
        self.selected().all(ok)
    }

    /// The selected objects, in key order (all of them, whatever was sent).
    pub fn selected(&self) -> impl Iterator<Item = &Object> {
        let Source { snapshot, lo, hi, .. } = &self.source;
        snapshot
            .range::<_, ObjectKey>(bounds(None, lo, hi))
            .map(|(_, o)| &**o)
            .filter(|o| self.filter.matches(o))
    }

    /// The next object to send; `None` once all are sent.
    pub fn next(&mut self) -> Option<Arc<Object>> {
        while self.ready.is_empty() && !self.exhausted {
            self.step();
        }
        self.ready.pop_front()
    }

    /// Looks at up to [`STEP`] more objects, queueing those the filter selects.
    fn step(&mut self) {
        let (filter, ready) = (&self.filter, &mut self.ready);
        let mut seen = 0;
        let Source { snapshot, after, lo, hi } = &mut self.source;
        let mut last = None;
        for (k, o) in snapshot.range::<_, ObjectKey>(bounds(after.as_ref(), lo, hi)).take(STEP) {
            seen += 1;
            last = Some(k);
            if filter.matches(o) {
                ready.push_back(o.clone());
            }
        }
        if let Some(k) = last {
            *after = Some(k.clone());
        }
        self.exhausted = seen < STEP;
    }
}

/// The key range after `after` (else from `lo`), up to `hi`.
fn bounds<'a>(
    after: Option<&'a ObjectKey>,
    lo: &'a Option<ObjectKey>,
    hi: &'a Option<ObjectKey>,
) -> (Bound<&'a ObjectKey>, Bound<&'a ObjectKey>) {
    let start = match (after, lo) {
        (Some(a), _) => Bound::Excluded(a),
        (None, Some(l)) => Bound::Included(l),
        (None, None) => Bound::Unbounded,
    };
    (start, hi.as_ref().map_or(Bound::Unbounded, Bound::Excluded))
}

/// A watch's initial objects not sent yet. hyper polls a body only when its stream has window,
/// so a client that never reads (HTTP/2, no window, its PINGs answered) would keep them — its
/// snapshot holding every version the store has replaced since — until its connection ends. A
/// timer lets go of them at the watch's deadline; the watch, if polled again, then ends without
/// its end-of-initial-events bookmark (never claiming a state it did not send). The timer goes
/// with the watch.
pub(super) struct Unsent {
    pub objects: Arc<Mutex<Option<Initial>>>,
    timer: Option<AbortHandle>,
}

impl Unsent {
    pub fn new(initial: Initial, deadline: Instant) -> Unsent {
        let objects = Arc::new(Mutex::new(Some(initial)));
        // A watch made outside a runtime (tests) has no timer: the deadline then only ends it.
        let timer = tokio::runtime::Handle::try_current().ok().map(|rt| {
            let slot = objects.clone();
            rt.spawn(async move {
                tokio::time::sleep_until(deadline).await;
                let gone = slot.lock().take();
                drop(gone);
            })
            .abort_handle()
        });
        Unsent { objects, timer }
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        if let Some(t) = self.timer.take() {
            t.abort();
        }
    }
}
