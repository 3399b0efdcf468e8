//! The shared time budget for slow watchers (the apiserver cacher's `timeBudget`): blocked
//! deliveries of one event may together wait at most what the budget holds; it refills by
//! 50 ms per second up to 100 ms, so a stalled client costs the writer at most ~5 % of its
//! time and the other watchers at most 100 ms of delay per burst.
//!
//! Owned by the cache `Writer`; used by `cache::dispatch` when an event did not fit some
//! watcher's queue.

use std::time::Duration;

use tokio::time::Instant;

/// Refill per second of elapsed time (apiserver: `refreshPerSecond`).
const REFRESH_PER_SECOND: Duration = Duration::from_millis(50);
/// Most the budget can hold (apiserver: `maxBudget`).
const MAX_BUDGET: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub struct TimeBudget {
    budget: Duration,
    last: Instant,
}

impl TimeBudget {
    /// An empty budget; it starts filling now.
    pub fn new(now: Instant) -> Self {
        TimeBudget { budget: Duration::ZERO, last: now }
    }

    /// Everything available at `now` (refill included); the budget is empty afterwards.
    pub fn take_available(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last);
        let refill = REFRESH_PER_SECOND.mul_f64(elapsed.as_secs_f64());
        self.budget = (self.budget + refill).min(MAX_BUDGET);
        self.last = now;
        std::mem::take(&mut self.budget)
    }

    /// Gives back what a dispatch did not use.
    pub fn return_unused(&mut self, unused: Duration) {
        self.budget = (self.budget + unused).min(MAX_BUDGET);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_empty_refills_at_50ms_per_second_up_to_100ms() {
        let t0 = Instant::now();
        let mut b = TimeBudget::new(t0);
        assert_eq!(b.take_available(t0), Duration::ZERO);
        assert_eq!(b.take_available(t0 + Duration::from_secs(1)), Duration::from_millis(50));
        assert_eq!(b.take_available(t0 + Duration::from_secs(1)), Duration::ZERO, "taken means gone");
        assert_eq!(b.take_available(t0 + Duration::from_secs(10)), MAX_BUDGET, "capped");
    }

    #[test]
    fn unused_time_comes_back_capped() {
        let t0 = Instant::now();
        let mut b = TimeBudget::new(t0);
        let got = b.take_available(t0 + Duration::from_secs(2));
        assert_eq!(got, Duration::from_millis(100));
        b.return_unused(Duration::from_millis(30));
        assert_eq!(b.take_available(t0 + Duration::from_secs(2)), Duration::from_millis(30));
        b.return_unused(Duration::from_secs(5));
        assert_eq!(b.take_available(t0 + Duration::from_secs(2)), MAX_BUDGET);
    }
}
