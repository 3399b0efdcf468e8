//! Lock-free latency and lag histograms, and the per-target counters the drivers fill in.
//!
//! Written concurrently by every request driver and watcher of one phase (`load`, `watchers`),
//! read once at the end of the phase by `report`. Values are microseconds; buckets are
//! log-linear (32 sub-buckets per power of two, so a percentile is within ~3 % of the truth).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;

/// Sub-bucket bits: 2^5 = 32 sub-buckets per power of two.
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Values up to 2^40 µs (~12 days) are kept exactly enough; larger ones land in the last bucket.
const MAX_EXP: u32 = 40;
const BUCKETS: usize = (SUB + (MAX_EXP - SUB_BITS + 1) as u64 * SUB) as usize;

/// A concurrent histogram of microsecond values.
pub struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }
}

fn index(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros(); // ≥ SUB_BITS
    if exp > MAX_EXP {
        return BUCKETS - 1;
    }
    let shift = exp - SUB_BITS;
    let sub = (v >> shift) & (SUB - 1);
    (SUB + (shift as u64) * SUB + sub) as usize
}

/// The largest value that lands in bucket `i` (percentiles report the bucket's upper edge).
fn upper(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB {
        return i;
    }
    let shift = (i - SUB) / SUB;
    let sub = (i - SUB) % SUB;
    ((SUB + sub) << shift) + (1 << shift) - 1
}

impl Histogram {
    pub fn record(&self, micros: u64) {
        self.buckets[index(micros)].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum.fetch_add(micros, Relaxed);
        self.max.fetch_max(micros, Relaxed);
    }

    pub fn record_duration(&self, d: Duration) {
        self.record(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }

    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    pub fn max(&self) -> u64 {
        self.max.load(Relaxed)
    }

    pub fn mean(&self) -> f64 {
        let n = self.count();
        if n == 0 {
            0.0
        } else {
            self.sum.load(Relaxed) as f64 / n as f64
        }
    }

    /// The value at quantile `q` (0..=1): the upper edge of the bucket holding the q-th value,
    /// never above the recorded maximum. 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Relaxed);
            if seen >= rank {
                return upper(i).min(self.max());
            }
        }
        self.max()
    }

    /// p50 / p90 / p99 / max in milliseconds, for the report.
    pub fn summary(&self) -> Summary {
        let ms = |us: u64| us as f64 / 1000.0;
        Summary {
            count: self.count(),
            mean_ms: self.mean() / 1000.0,
            p50_ms: ms(self.quantile(0.50)),
            p90_ms: ms(self.quantile(0.90)),
            p99_ms: ms(self.quantile(0.99)),
            max_ms: ms(self.max()),
        }
    }
}

/// Percentiles of one histogram, in milliseconds.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Kinds of requests the drivers send; the names are the report's row labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// LIST `resourceVersion=0`, whole list.
    List,
    /// One page of a LIST with `limit` (consistent read, continue tokens followed).
    ListPage,
    /// GET `resourceVersion=0` of one object.
    Get,
    /// Time until a WATCH's response headers.
    WatchOpen,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::List, Kind::ListPage, Kind::Get, Kind::WatchOpen];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::List => "list rv=0",
            Kind::ListPage => "list limit page",
            Kind::Get => "get rv=0",
            Kind::WatchOpen => "watch open",
        }
    }
}

/// Latency, bytes and outcome counters of one request kind.
#[derive(Default)]
pub struct KindStats {
    pub latency: Histogram,
    pub bytes: AtomicU64,
    /// Requests that got a response (any status).
    pub done: AtomicU64,
    /// Requests that failed: non-2xx or transport errors.
    pub errors: AtomicU64,
    /// Requests not sent because too many were already in flight (open-loop overload).
    pub skipped: AtomicU64,
}

/// Everything measured against one target during one phase.
#[derive(Default)]
pub struct PhaseStats {
    kinds: [KindStats; 4],
    /// Outcomes by label: an HTTP status (`200`, `410`…), `transport`, `timeout`, `watch-error-410`.
    statuses: Mutex<BTreeMap<String, u64>>,
    /// Responses by HTTP version (`HTTP/1.1`, `HTTP/2.0`): what the connections really spoke.
    versions: Mutex<BTreeMap<String, u64>>,
    /// Watch event delivery lag: receive time − the writer's send stamp.
    pub lag: Histogram,
    /// Watch bytes received (all watchers).
    pub watch_bytes: AtomicU64,
    /// Watch events received (all watchers, all types).
    pub watch_events: AtomicU64,
    /// Per second of the phase: (sum of lag µs, count, max lag µs), for the chart.
    timeline: Mutex<Vec<(u64, u64, u64)>>,
}

impl PhaseStats {
    pub fn kind(&self, k: Kind) -> &KindStats {
        &self.kinds[k as usize]
    }

    pub fn status(&self, label: &str) {
        let mut s = self.statuses.lock();
        match s.get_mut(label) {
            Some(n) => *n += 1,
            None => {
                s.insert(label.to_owned(), 1);
            }
        }
    }

    pub fn statuses(&self) -> BTreeMap<String, u64> {
        self.statuses.lock().clone()
    }

    /// Counts one response's HTTP version.
    pub fn version(&self, v: http::Version) {
        *self.versions.lock().entry(format!("{v:?}")).or_default() += 1;
    }

    pub fn versions(&self) -> BTreeMap<String, u64> {
        self.versions.lock().clone()
    }

    /// Records the delivery lag of one writer change seen `second` seconds into the phase.
    /// Watchers batch these per chunk so the lock is taken rarely.
    pub fn record_lags(&self, second: usize, lags_us: &[u64]) {
        if lags_us.is_empty() {
            return;
        }
        for &l in lags_us {
            self.lag.record(l);
        }
        let mut t = self.timeline.lock();
        if t.len() <= second {
            t.resize(second + 1, (0, 0, 0));
        }
        let slot = &mut t[second];
        for &l in lags_us {
            slot.0 += l;
            slot.1 += 1;
            slot.2 = slot.2.max(l);
        }
    }

    /// Per second: (second, mean lag ms, max lag ms); seconds without events are left out.
    pub fn timeline(&self) -> Vec<(u64, f64, f64)> {
        self.timeline
            .lock()
            .iter()
            .enumerate()
            .filter(|(_, s)| s.1 > 0)
            .map(|(i, s)| (i as u64, s.0 as f64 / s.1 as f64 / 1000.0, s.2 as f64 / 1000.0))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for v in (0..100_000u64).chain([1 << 30, (1 << 40) - 1]) {
            let i = index(v);
            assert!(i >= last, "index must not decrease at {v}");
            last = i;
            let up = upper(i);
            assert!(up >= v, "upper edge {up} below {v}");
            assert!(up - v <= v / 32 + 1, "bucket of {v} too wide: {up}");
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn percentiles_of_a_uniform_sample() {
        let h = Histogram::default();
        for v in 1..=10_000 {
            h.record(v);
        }
        assert_eq!(h.count(), 10_000);
        let close = |got: u64, want: u64| (got as f64 - want as f64).abs() <= want as f64 * 0.04;
        assert!(close(h.quantile(0.5), 5_000), "p50 {}", h.quantile(0.5));
        assert!(close(h.quantile(0.9), 9_000), "p90 {}", h.quantile(0.9));
        assert!(close(h.quantile(0.99), 9_900), "p99 {}", h.quantile(0.99));
        assert_eq!(h.quantile(1.0), 10_000);
        assert_eq!(h.max(), 10_000);
        assert!((h.mean() - 5000.5).abs() < 1e-9);
    }

    #[test]
    fn percentiles_of_a_skewed_sample_and_empty() {
        let h = Histogram::default();
        assert_eq!(h.quantile(0.99), 0);
        for _ in 0..98 {
            h.record(10);
        }
        h.record(5_000);
        h.record(1_000_000);
        assert_eq!(h.quantile(0.5), 10);
        assert_eq!(h.quantile(0.98), 10);
        assert!((4_900..=5_200).contains(&h.quantile(0.99)), "{}", h.quantile(0.99));
        assert_eq!(h.quantile(1.0), 1_000_000);
        let s = h.summary();
        assert_eq!(s.max_ms, 1000.0);
        assert_eq!(s.p50_ms, 0.01);
    }

    #[test]
    fn timeline_keeps_mean_and_max_per_second() {
        let p = PhaseStats::default();
        p.record_lags(0, &[1000, 3000]);
        p.record_lags(2, &[5000]);
        assert_eq!(p.timeline(), vec![(0, 2.0, 3.0), (2, 5.0, 5.0)]);
        assert_eq!(p.lag.count(), 3);
        p.status("200");
        p.status("200");
        p.status("transport");
        assert_eq!(p.statuses().get("200"), Some(&2));
    }
}
