//! Warnings a caller can cause, logged at most once per [`EVERY`] with how many were not: a
//! flood of requests with fresh tokens past the review rate, or an upstream failing every
//! TokenReview, is one line every half minute rather than one line a request (the rest at
//! debug; the counts are in the metrics).
//!
//! Used by `server::auth` (reviews past their rate or failing, certificates refused),
//! `server::proxy` (a forward that failed), `server::conn` (a connection closed for its
//! resets), `server::loopback` (`--auth=none` refusals) and `cache::watchers` (watchers closed
//! for not keeping up). Top-level: the cache and the server both use it.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// The least time between two warnings through one gate.
pub const EVERY: Duration = Duration::from_secs(30);

/// See the module doc.
#[derive(Default)]
pub struct WarnGate {
    state: Mutex<(Option<Instant>, u64)>,
}

impl WarnGate {
    /// A gate that lets the first warning through (`const`: one may be a `static`).
    pub const fn new() -> WarnGate {
        WarnGate { state: Mutex::new((None, 0)) }
    }

    /// `Some(n)` when a warning may be logged now (`n`: how many were held back since the
    /// last), `None` when it is to be logged at debug instead.
    pub fn pass(&self) -> Option<u64> {
        let now = Instant::now();
        let mut st = self.state.lock();
        let (last, held) = &mut *st;
        if last.is_some_and(|t| now.duration_since(t) < EVERY) {
            *held += 1;
            return None;
        }
        *last = Some(now);
        Some(std::mem::take(held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_warning_per_period_with_the_count_held_back() {
        let gate = WarnGate::default();
        assert_eq!(gate.pass(), Some(0));
        for _ in 0..1000 {
            assert_eq!(gate.pass(), None);
        }
        tokio::time::advance(EVERY - Duration::from_millis(1)).await;
        assert_eq!(gate.pass(), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(gate.pass(), Some(1001));
        assert_eq!(gate.pass(), None);
    }
}
