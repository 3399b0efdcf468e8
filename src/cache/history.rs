//! Ring buffer of recent events for one resource.
//!
//! Written only by the reflector (through `cache::Writer`); read under the cache lock to start
//! watches at a resourceVersion (`History::since`) and to rebuild the state at an older RV
//! (`History::newer_than`). Event RVs only grow; the window's floor only grows, even across a
//! relist — except at a relist whose list RV is below the cache's, an upstream whose storage
//! went back (`History::rewind`).
//!
//! Coverage is bounded by time as well as by count (issue 24): the history records when the
//! cache moved past each RV (events, bookmarks, relists, in granules of `max_age / 64`), and
//! an RV the cache moved past more than `max_age` ago is no longer covered, even on a quiet
//! resource whose newest event never leaves. Exact reads and continue tokens at such an RV are
//! forwarded, so the upstream's own answer (from etcd, or 410 once compacted) comes through.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::Error;
use crate::resource::{Event, Rv};

/// Recent events, oldest first.
#[derive(Debug)]
pub struct History {
    /// Invariant: strictly increasing `rv` front to back; every event has `rv > floor`.
    events: VecDeque<(Instant, Arc<Event>)>,
    /// Every change with RV in `(floor, newest]` is in `events`: a watch may start at any RV ≥ floor.
    /// It is the list RV after a relist, then the RV before the oldest kept event after evictions.
    floor: Rv,
    /// The floor is one past an RV the upstream issued (`reset_above`: that RV is distrusted),
    /// not one itself: a 410 names that RV (`oldest_shown`), never one the proxy made up.
    above_issued: bool,
    max_events: usize,
    /// At most this many events now: `max_events`, or fewer while `--cache-memory-limit`
    /// has shortened this history (`set_cap`).
    cap: usize,
    max_age: Duration,
    /// When the cache RV moved, oldest first: `(t, rv)` = at `t` the cache reached `rv`, so every
    /// RV below it was passed at or before `t`. Consecutive moves within a granule share the
    /// earlier time (an RV may expire up to one granule early: safe, it is then forwarded).
    moves: VecDeque<(Instant, Rv)>,
    /// Every RV below this was passed more than `max_age` ago (from moves dropped by `expire`).
    passed_below: Rv,
    /// How many times the window restarted (`reset`, `rewind`): a replay reading the history
    /// in steps (`cache::watch`) stops when it changed, its events gone.
    generation: u64,
    /// The newest RV known issued before the upstream's storage last went back (`rewind`; 0:
    /// never): an RV above the cache's and up to this one may be of the history that is gone.
    rewound_from: Rv,
}

impl History {
    pub fn new(max_events: usize, max_age: Duration) -> History {
        History {
            events: VecDeque::new(),
            floor: Rv(0),
            above_issued: false,
            max_events: max_events.max(1),
            cap: max_events.max(1),
            max_age,
            moves: VecDeque::new(),
            passed_below: Rv(0),
            generation: 0,
            rewound_from: Rv(0),
        }
    }

    /// Records that the cache RV moved to `rv` at `now` (an event, a bookmark, a relist).
    pub fn moved(&mut self, now: Instant, rv: Rv) {
        let granule = self.max_age / 64;
        match self.moves.back_mut() {
            Some((_, last)) if rv <= *last => {}
            Some((t, last)) if now.saturating_duration_since(*t) < granule => *last = rv,
            _ => self.moves.push_back((now, rv)),
        }
        self.expire_moves(now);
    }

    /// Whether the cache moved past `rv` at least `max_age` before `now`.
    fn passed_long_ago(&self, rv: Rv, now: Instant) -> bool {
        let expired = self
            .moves
            .iter()
            .take_while(|(t, _)| now.saturating_duration_since(*t) >= self.max_age)
            .last()
            .map_or(self.passed_below, |(_, r)| self.passed_below.max(*r));
        rv < expired
    }

    fn expire_moves(&mut self, now: Instant) {
        while let Some(&(t, rv)) = self.moves.front() {
            if now.saturating_duration_since(t) < self.max_age {
                break;
            }
            self.passed_below = self.passed_below.max(rv);
            self.moves.pop_front();
        }
    }

    /// A restored history (`--state-dir`): the cache moved past every RV below `rv` before
    /// the restart, longer ago than this process can tell, so Exact reads and continue tokens
    /// there are forwarded (watches still resume from the floor).
    pub fn restored(&mut self, rv: Rv) {
        self.passed_below = self.passed_below.max(rv);
    }

    /// Starts a new window at a relist: everything up to `list_rv` is in the store, nothing
    /// before it can be replayed.
    pub fn reset(&mut self, list_rv: Rv) {
        self.generation += 1;
        self.events.clear();
        self.raise_floor(list_rv);
    }

    /// [`History::reset`] past `rv` itself: a watch from `rv` (a state served wrong there) is
    /// 410 too.
    pub fn reset_above(&mut self, rv: Rv) {
        self.generation += 1;
        self.events.clear();
        if Rv(rv.0.saturating_add(1)) > self.floor {
            self.floor = Rv(rv.0.saturating_add(1));
            self.above_issued = true;
        }
    }

    fn raise_floor(&mut self, rv: Rv) {
        // At the floor too: the floor is then an RV the upstream issued.
        if rv >= self.floor {
            self.floor = rv;
            self.above_issued = false;
        }
    }

    /// The RV a 410 names as the oldest (the apiserver's `oldest − 1`): the floor, or the
    /// issued RV just below it after [`History::reset_above`].
    pub fn oldest_shown(&self) -> Rv {
        if self.above_issued {
            Rv(self.floor.0 - 1)
        } else {
            self.floor
        }
    }

    /// Starts a new window at a relist whose list RV is *below* the cache's: the upstream's
    /// storage went back (etcd restored from a backup without `--bump-revision`), so every RV
    /// after `list_rv` names another state now. Unlike [`History::reset`], the floor goes down
    /// to `list_rv` and the moves past later RVs are forgotten: the new RVs up to the old ones
    /// are served as the upstream serves them (its own watch cache relists the same way).
    /// `from` is the newest RV known issued before it (the cache's, or one seen upstream): see
    /// [`History::gone_ahead`].
    pub fn rewind(&mut self, list_rv: Rv, from: Rv) {
        self.rewound_from = self.rewound_from.max(from);
        self.generation += 1;
        self.events.clear();
        self.floor = list_rv;
        self.above_issued = false;
        self.moves.retain(|(_, rv)| *rv <= list_rv);
        self.passed_below = self.passed_below.min(list_rv);
    }

    /// Appends an event (its RV must be newer than every kept one), evicting the oldest by count
    /// and age.
    pub fn push(&mut self, now: Instant, event: Arc<Event>) {
        debug_assert!(self.events.back().is_none_or(|(_, e)| e.rv < event.rv));
        self.events.push_back((now, event));
        while self.events.len() > self.cap {
            self.evict_one();
        }
        self.expire(now);
    }

    /// Keeps at most `cap` events (at least 1, at most the configured maximum) from now on,
    /// evicting the oldest at once: the floor rises as at any eviction, so a watch from an RV
    /// now older answers 410 "too old", as the apiserver's does after its window moved.
    pub fn set_cap(&mut self, cap: usize) {
        self.cap = cap.clamp(1, self.max_events);
        while self.events.len() > self.cap {
            self.evict_one();
        }
    }

    /// The most events kept now (see [`History::set_cap`]).
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The kept events, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Event>> {
        self.events.iter().map(|(_, e)| e)
    }

    /// Drops events older than the window (the newest is kept so the floor stays tight).
    pub fn expire(&mut self, now: Instant) {
        self.expire_moves(now);
        while self.events.len() > 1
            && self.events.front().is_some_and(|(t, _)| now.duration_since(*t) > self.max_age)
        {
            self.evict_one();
        }
    }

    fn evict_one(&mut self) {
        if let Some((_, e)) = self.events.pop_front() {
            self.raise_floor(e.rv);
        }
    }

    /// Changes at every relist (see the field).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The oldest RV a watch may start from.
    pub fn floor(&self) -> Rv {
        self.floor
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// How long ago the oldest kept event was added (zero when empty).
    pub fn oldest_age(&self, now: Instant) -> Duration {
        self.events.front().map_or(Duration::ZERO, |(t, _)| now.saturating_duration_since(*t))
    }

    /// Whether the state at `rv` can be rebuilt from the store and this history and is recent
    /// enough to serve (`current` is the cache RV): inside the floor, not newer than the cache,
    /// and not passed by the cache `max_age` or more ago.
    pub fn covers(&self, rv: Rv, current: Rv, now: Instant) -> bool {
        rv >= self.floor && rv <= current && !self.passed_long_ago(rv, now)
    }

    /// Whether `rv`, ahead of the cache's `current`, may have been issued by a history that is
    /// gone (the upstream's storage went back past it, `rewind`): unless the upstream has
    /// issued it again (the caller asks it), whoever holds it got it from the old history, and
    /// a watch from it would wait for a state that never comes, then resume from it.
    pub fn gone_ahead(&self, rv: Rv, current: Rv) -> bool {
        rv > current && rv <= self.rewound_from
    }

    /// Events with RV > `rv`, oldest first; `rv` older than the window is 410
    /// `too old resource version: N (floor)` (docs/apiserver-watch-cache.md §2.3).
    pub fn since(&self, rv: Rv) -> Result<Vec<Arc<Event>>, Error> {
        if rv < self.floor {
            return Err(Error::TooOldResourceVersion { requested: rv, oldest: self.oldest_shown() });
        }
        Ok(self.newer_than(rv).cloned().collect())
    }

    /// Events with RV > `rv`, oldest first (binary search, no check of the floor).
    pub fn newer_than(&self, rv: Rv) -> impl DoubleEndedIterator<Item = &Arc<Event>> {
        let start = self.events.partition_point(|(_, e)| e.rv <= rv);
        self.events.range(start..).map(|(_, e)| e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{typing, EventType, Object, ResourceKind};
    use bytes::Bytes;
    use proptest::prelude::*;

    fn event(rv: u64) -> Arc<Event> {
        let k = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let json = format!(r#"{{"metadata":{{"name":"c{rv}","namespace":"ns","resourceVersion":"{rv}"}}}}"#);
        let o = Arc::new(Object::parse(&k, &typing(&k), Bytes::from(json)).unwrap());
        Arc::new(Event::new(EventType::Added, Rv(rv), o, None))
    }

    fn filled(cap: usize, list_rv: u64, rvs: &[u64]) -> History {
        let mut h = History::new(cap, Duration::from_secs(75));
        h.reset(Rv(list_rv));
        let now = Instant::now();
        for &r in rvs {
            h.push(now, event(r));
        }
        h
    }

    #[test]
    fn floor_is_list_rv_until_eviction() {
        // Reference §2.3: listed at 1000, nothing evicted: 999 too old (1000), 1000 ok.
        let h = filled(10, 1000, &[1001, 1002]);
        assert_eq!(h.since(Rv(999)).unwrap_err().to_string(), "too old resource version: 999 (1000)");
        assert_eq!(h.since(Rv(1000)).unwrap().len(), 2);
        // After eviction with first kept RV 1050: 1048 too old (1049), 1049 ok.
        let h = filled(2, 1000, &[1010, 1049, 1050, 1051]);
        assert_eq!(h.since(Rv(1048)).unwrap_err().to_string(), "too old resource version: 1048 (1049)");
        assert_eq!(h.since(Rv(1049)).unwrap().iter().map(|e| e.rv.0).collect::<Vec<_>>(), vec![1050, 1051]);
    }

    #[tokio::test(start_paused = true)]
    async fn events_older_than_the_window_expire() {
        let mut h = History::new(100, Duration::from_secs(75));
        h.reset(Rv(1));
        h.push(Instant::now(), event(2));
        tokio::time::advance(Duration::from_secs(80)).await;
        h.push(Instant::now(), event(3));
        assert_eq!(h.floor(), Rv(2));
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn relist_never_moves_the_floor_back() {
        let mut h = filled(2, 10, &[11, 12, 13]);
        assert_eq!(h.floor(), Rv(11));
        h.reset(Rv(5));
        assert_eq!(h.floor(), Rv(11));
        h.reset(Rv(20));
        assert_eq!(h.floor(), Rv(20));
        assert!(h.is_empty());
    }

    /// The storage went back from 13 to 8: the floor goes down to 8, and the RVs after it,
    /// passed again in the new history, expire a window after the new history passed them, not
    /// after the old one did (the old history's moves past them are forgotten).
    #[tokio::test(start_paused = true)]
    async fn a_rewind_lowers_the_floor_and_forgets_the_moves_past_it() {
        let window = Duration::from_secs(75);
        let mut h = History::new(100, window);
        h.reset(Rv(1));
        for rv in 2..=13 {
            h.push(Instant::now(), event(rv));
            h.moved(Instant::now(), Rv(rv));
        }
        tokio::time::advance(window / 2).await;
        h.rewind(Rv(8), Rv(13));
        assert!(h.is_empty() && h.floor() == Rv(8));
        assert!(h.gone_ahead(Rv(13), Rv(8)) && !h.gone_ahead(Rv(14), Rv(8)) && !h.gone_ahead(Rv(8), Rv(8)));
        h.moved(Instant::now(), Rv(8));
        tokio::time::advance(window / 4).await;
        h.push(Instant::now(), event(10));
        h.moved(Instant::now(), Rv(10));
        tokio::time::advance(window / 2).await;
        // 3/4 of a window after the rewind, 1/2 after the new history passed 9: covered.
        assert!(h.covers(Rv(9), Rv(10), Instant::now()));
        assert_eq!(h.since(Rv(8)).unwrap().len(), 1);
        assert_eq!(h.since(Rv(7)).unwrap_err().to_string(), "too old resource version: 7 (8)");
    }

    #[test]
    fn a_lower_cap_evicts_the_oldest_at_once_and_raises_the_floor() {
        let mut h = filled(10, 100, &[101, 102, 103, 104, 105]);
        h.set_cap(2);
        assert_eq!(h.len(), 2);
        assert_eq!(h.floor(), Rv(103));
        assert_eq!(h.since(Rv(102)).unwrap_err().to_string(), "too old resource version: 102 (103)");
        assert_eq!(h.since(Rv(103)).unwrap().iter().map(|e| e.rv.0).collect::<Vec<_>>(), vec![104, 105]);
        // The cap holds for later events, and never exceeds the configured maximum.
        h.push(Instant::now(), event(106));
        assert_eq!((h.len(), h.floor()), (2, Rv(104)));
        h.set_cap(1000);
        assert_eq!(h.cap(), 10);
        h.set_cap(0);
        assert_eq!((h.cap(), h.len()), (1, 1));
    }

    fn sorted_unique_rvs() -> impl Strategy<Value = Vec<u64>> {
        proptest::collection::btree_set(1u64..10_000, 1..300).prop_map(|s| s.into_iter().collect())
    }

    proptest! {
        #[test]
        fn since_returns_exactly_the_newer_events(rvs in sorted_unique_rvs(), cap in 1usize..64, q in 0u64..10_001) {
            let h = filled(cap, 0, &rvs);
            match h.since(Rv(q)) {
                Ok(events) => {
                    prop_assert!(q >= h.floor().0);
                    prop_assert!(events.iter().map(|e| e.rv.0).eq(rvs.iter().copied().filter(|&r| r > q)));
                }
                Err(Error::TooOldResourceVersion { requested, oldest }) => {
                    prop_assert_eq!(requested, Rv(q));
                    prop_assert!(q < oldest.0);
                    // The floor is exactly the newest evicted RV.
                    prop_assert_eq!(oldest.0, rvs[rvs.len() - h.len() - 1]);
                }
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }
    }
}
