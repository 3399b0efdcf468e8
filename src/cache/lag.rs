//! Watch-delivery lag (issue 34): which (event, watcher) deliveries carry the event's arrival
//! stamp, and where the lag of a stamped one is observed.
//!
//! The fan-out (`cache::watchers`) stamps the first delivery of every event and one in
//! [`SAMPLE_EVERY`] of the rest, so an event fanned out to 5 000 watchers costs
//! 1 + 5 000 / 64 observations, and an unstamped delivery costs one counter increment and one
//! branch. The watch stream (`cache::watch`) observes a stamped delivery when it hands its
//! frame to the response body: the lag from `Writer::apply` (the upstream event's arrival at
//! the cache) to that moment, into `watchcache_watch_delivery_lag_seconds`, whose
//! per-resource child the cache gets from `CacheOptions::delivery_lag` (set by `app`).
//!
//! Also the cache's lag behind the upstream ([`Ahead`], read by `Reader::lag` for
//! `watchcache_cache_lag_seconds`): fed by `Reader::upstream_at` (`server::serve`, after a
//! consistent-read probe) and by the writer as the cache RV moves.

use std::collections::VecDeque;
use std::fmt;

use tokio::time::Instant;

use prometheus::{Histogram, HistogramVec};

/// One in this many deliveries after each event's first is stamped.
pub const SAMPLE_EVERY: u64 = 64;

/// Decides which deliveries are stamped. Lives in the fan-out's registry (under the cache
/// lock): a plain counter, no atomics.
#[derive(Debug, Default)]
pub struct Sampler {
    seq: u64,
    /// No delivery of the current event was made yet.
    first: bool,
}

impl Sampler {
    /// A new event is fanned out: its first delivery is stamped.
    pub fn event(&mut self) {
        self.first = true;
    }

    /// Whether the next delivery is stamped.
    #[inline]
    pub fn take(&mut self) -> bool {
        self.seq = self.seq.wrapping_add(1);
        std::mem::take(&mut self.first) || self.seq.is_multiple_of(SAMPLE_EVERY)
    }
}

/// The delivery-lag histogram family, labelled by `resource` (`None`: not observed, as in
/// unit tests that do not ask for it).
#[derive(Clone, Default)]
pub struct DeliveryLag(pub Option<HistogramVec>);

impl DeliveryLag {
    /// The child for one resource.
    pub(super) fn for_resource(&self, group_resource: &str) -> Option<Histogram> {
        self.0.as_ref().map(|v| v.with_label_values(&[group_resource]))
    }
}

impl fmt::Debug for DeliveryLag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "DeliveryLag(observed)" } else { "DeliveryLag(off)" })
    }
}

/// How many upstream RVs ahead of the cache are remembered; past that the newest is replaced
/// (the lag then counts from a later time: still a lower bound).
const AHEAD_KEPT: usize = 8;

/// The cache's lag behind the upstream (`watchcache_cache_lag_seconds`): upstream RVs the
/// cache had not reached when they were seen (consistent-read probes, `server::serve`), in
/// increasing RV order, each with when it was seen. Events, bookmarks and lists that take the
/// cache to an RV drop those at or below it.
#[derive(Debug, Default)]
pub struct Ahead {
    seen: VecDeque<(u64, Instant)>,
}

impl Ahead {
    /// The upstream was at `rv` at `at` (the caller checked the cache is behind it).
    pub fn seen(&mut self, rv: crate::resource::Rv, at: Instant) {
        if self.seen.back().is_some_and(|(last, _)| *last >= rv.0) {
            return;
        }
        if self.seen.len() == AHEAD_KEPT {
            self.seen.pop_back();
        }
        self.seen.push_back((rv.0, at));
    }

    /// The cache reached `rv`.
    pub fn reached(&mut self, rv: crate::resource::Rv) {
        while self.seen.front().is_some_and(|(r, _)| *r <= rv.0) {
            self.seen.pop_front();
        }
    }

    /// The newest RV seen (0: none).
    pub fn newest(&self) -> crate::resource::Rv {
        crate::resource::Rv(self.seen.back().map_or(0, |(rv, _)| *rv))
    }

    /// Forgets every RV seen (the upstream's storage went back: they name nothing now).
    pub fn clear(&mut self) {
        self.seen.clear();
    }

    /// Since when the cache has been known to be behind (`None`: it reached every RV seen).
    pub fn since(&self) -> Option<Instant> {
        self.seen.front().map(|(_, t)| *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_every_first_delivery_and_one_in_sample_every_of_the_rest() {
        let mut s = Sampler::default();
        // One event to 1 000 watchers: its first delivery, then every 64th.
        s.event();
        let stamped: Vec<usize> = (0..1000).filter(|_| s.take()).collect();
        assert_eq!(stamped.len(), 1 + 1000 / SAMPLE_EVERY as usize);
        assert_eq!(stamped[..3], [0, 63, 127]);
        // 100 events to one watcher each: every one is stamped.
        let stamped = (0..100).filter(|_| {
            s.event();
            s.take()
        });
        assert_eq!(stamped.count(), 100);
        // Two events to 5 000 watchers each: their firsts plus one in SAMPLE_EVERY.
        let mut s = Sampler::default();
        let mut stamped = 0;
        for _ in 0..2 {
            s.event();
            stamped += (0..5_000).filter(|_| s.take()).count();
        }
        assert!(stamped <= 2 + 10_000 / SAMPLE_EVERY as usize, "{stamped}");
        assert!(stamped >= 10_000 / SAMPLE_EVERY as usize, "{stamped}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_lag_counts_from_the_oldest_upstream_rv_the_cache_has_not_reached() {
        use crate::resource::Rv;
        let t0 = Instant::now();
        let mut a = Ahead::default();
        assert_eq!(a.since(), None);
        a.seen(Rv(10), t0);
        a.seen(Rv(10), t0 + std::time::Duration::from_secs(1));
        a.seen(Rv(20), t0 + std::time::Duration::from_secs(2));
        assert_eq!(a.since(), Some(t0));
        a.reached(Rv(15));
        assert_eq!(a.since(), Some(t0 + std::time::Duration::from_secs(2)));
        a.reached(Rv(20));
        assert_eq!(a.since(), None);
        for i in 1..=20 {
            a.seen(Rv(100 + i), t0 + std::time::Duration::from_secs(i));
        }
        assert_eq!(a.seen.len(), AHEAD_KEPT);
        assert_eq!(a.since(), Some(t0 + std::time::Duration::from_secs(1)));
        a.reached(Rv(200));
        assert_eq!(a.since(), None);
    }
}
