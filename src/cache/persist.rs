//! A cache's state taken out for `--state-dir` and put back at a warm restart: the objects at
//! the history's floor and every event after it, so the restored cache has the same store,
//! the same RV and the same history (a watch may resume from any RV it covered).
//!
//! Called by `state::save` (through [`Reader::saved`]) and `state::restore` (through
//! [`Writer::restore`], before the resource's reflector starts).

use std::sync::Arc;

use crate::resource::{Event, EventType, Object, Rv};

use super::{Reader, Store, Writer};

/// What [`Reader::saved`] takes: the state at `floor`, the events after it, the cache RV.
pub struct Persisted {
    pub rv: Rv,
    pub floor: Rv,
    pub base: Store,
    pub events: Vec<Arc<Event>>,
}

/// Why a saved state could not be put back.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("event at {event} is not after {before}")]
    Order { event: Rv, before: Rv },
    #[error("unexpected event type {0:?}")]
    Type(EventType),
    #[error("the cache has been filled already")]
    NotEmpty,
}

impl Reader {
    /// The current state as [`Persisted`]; `None` before the first sync, while not ready
    /// (a relist in progress: nothing consistent to save) or once dropped for
    /// `--cache-memory-limit` (perhaps emptied: the file saved before stays).
    pub fn saved(&self) -> Option<Persisted> {
        let st = self.shared.state.lock();
        // Read under the lock: `replace` publishes a relist's unready state under it (a list at
        // the cache's RV that differs from it sets the floor above the RV), and a state read
        // ready before it would be saved with that floor (refused at the next start).
        if !self.progress().ready || st.history.floor() > st.rv {
            return None;
        }
        // Dropped for --cache-memory-limit: the state may be emptied already (never saved so).
        // Unservable since its progress was read (`cache::unparsable`), or found wrong since
        // (`request_relist`, which marks it under this lock): its state would come back ready
        // at a restart.
        if st.rv == Rv(0) || self.released() || st.unservable || self.shared.relist.pending() {
            return None;
        }
        let mut base = st.store.clone();
        let events: Vec<Arc<Event>> = st.history.newer_than(st.history.floor()).cloned().collect();
        let (rv, floor) = (st.rv, st.history.floor());
        drop(st);
        for ev in events.iter().rev() {
            let key = &ev.object.header.key;
            match &ev.prev {
                Some(p) => base.insert(key.clone(), p.clone()),
                None => base.remove(key),
            };
        }
        Some(Persisted { rv, floor, base, events })
    }
}

impl Writer {
    /// Fills an empty cache with a saved state: the objects at `floor`, the events after it
    /// (each checked to be newer than the one before), then the cache RV. The history's
    /// floor is `floor` (watches resume from any RV ≥ it); RVs below `rv` count as passed
    /// longer than `--history-window` ago (Exact reads and continue tokens there are
    /// forwarded: the upstream may have compacted them while the proxy was away); the cache
    /// is ready at `rv` (as after a list).
    pub fn restore(
        &mut self,
        base: Vec<Object>,
        floor: Rv,
        events: Vec<(EventType, Object)>,
        rv: Rv,
    ) -> Result<(), RestoreError> {
        let now = tokio::time::Instant::now();
        // A state file's objects are slices of its blocks' buffers, as a list's are of its
        // pages: given back the same way (`cache::pages`).
        let pages = super::pages::Pages::of(base.iter().chain(events.iter().map(|(_, o)| o)));
        let mut st = self.shared.state.lock();
        if st.rv != Rv(0) || !st.store.is_empty() {
            return Err(RestoreError::NotEmpty);
        }
        if let Some(o) = base.iter().find(|o| o.header.rv > floor) {
            return Err(RestoreError::Order { event: o.header.rv, before: floor });
        }
        let mut store = super::store::filled(base);
        let mut at = floor;
        let mut history = Vec::with_capacity(events.len());
        for (kind, obj) in events {
            let erv = obj.header.rv;
            if erv <= at || erv > rv {
                return Err(RestoreError::Order { event: erv, before: at });
            }
            // As `Writer::apply`: a version keeping its strings shares the key of the one before.
            let (obj, prev) = match kind {
                EventType::Added | EventType::Modified => super::store::upsert(&mut store, obj),
                EventType::Deleted => {
                    let prev = store.remove(&obj.header.key);
                    (Arc::new(obj), prev)
                }
                other => return Err(RestoreError::Type(other)),
            };
            history.push(Arc::new(Event::new(kind, erv, obj, prev)));
            at = erv;
        }
        st.history.reset(floor);
        for ev in history {
            st.history.push(now, ev);
        }
        st.history.moved(now, rv);
        st.history.restored(rv);
        st.store = store;
        st.rv = rv;
        self.shared.dispatched.store(rv.0, std::sync::atomic::Ordering::Release);
        self.publish(rv, true, None);
        drop(st);
        self.pages = pages;
        // As after a full list: the governor measures at once.
        if let Some(budget) = &self.shared.opts.memory {
            budget.check.notify_one();
        }
        Ok(())
    }
}
