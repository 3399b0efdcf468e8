//! Seats for requests waiting on a TokenReview: at most [`PER_SOURCE`] from one source address
//! (an IPv6 /64) and [`IN_ALL`] in all, past which the request is answered 429 at once.
//!
//! A request reaches authentication holding one of the proxy's in-flight permits
//! (`phase::admit`); concurrent requests with the same unknown token all wait on one review
//! (`cache::TtlCache::get_or_fetch`), and only the first spends a review from the rate bound.
//! Without seats, one client sending a few hundred requests with each fresh token holds every
//! permit for as long as the upstream takes to review it — with a slow token webhook, always —
//! and every other caller gets 429. With them, unknown tokens from one place hold at most
//! [`PER_SOURCE`] permits, and all unknown tokens together at most [`IN_ALL`] of the default
//! 400; a known token (cached) takes no seat. A client starting with a new token and many
//! requests at once gets 429 for those past its seats, and retries after a second, when the
//! token is known.
//!
//! Taken by `authn::TokenAuthenticator::review`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

/// Requests from one source waiting on reviews at once.
pub const PER_SOURCE: usize = 32;
/// Requests waiting on reviews at once, in all.
pub const IN_ALL: usize = 128;

/// The waiting requests, per source and in all.
#[derive(Default)]
pub struct Waiting {
    counts: Arc<Mutex<Counts>>,
}

#[derive(Default)]
struct Counts {
    all: usize,
    by_source: HashMap<Option<IpAddr>, usize>,
}

/// A seat; given back when dropped.
pub struct Seat {
    counts: Arc<Mutex<Counts>>,
    source: Option<IpAddr>,
}

impl Waiting {
    /// A seat for a request from `source` (its `rate::source_key`), or `None` when its source
    /// or the whole has none left.
    pub fn take(&self, source: Option<IpAddr>) -> Option<Seat> {
        let mut c = self.counts.lock();
        let mine = c.by_source.get(&source).copied().unwrap_or(0);
        if c.all >= IN_ALL || mine >= PER_SOURCE {
            return None;
        }
        c.all += 1;
        c.by_source.insert(source, mine + 1);
        Some(Seat { counts: self.counts.clone(), source })
    }

    /// Requests waiting now (tests).
    pub fn len(&self) -> usize {
        self.counts.lock().all
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut c = self.counts.lock();
        c.all = c.all.saturating_sub(1);
        if let Some(n) = c.by_source.get_mut(&self.source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.by_source.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_and_the_whole_have_their_bounds_and_seats_come_back() {
        let w = Waiting::default();
        let a: Option<IpAddr> = Some("10.0.0.1".parse().unwrap());
        let mine: Vec<Seat> = (0..PER_SOURCE).map(|_| w.take(a).expect("a seat")).collect();
        assert!(w.take(a).is_none(), "the source's seats are taken");
        let mut others = Vec::new();
        for i in 0..IN_ALL - PER_SOURCE {
            let ip: IpAddr = format!("10.1.{}.{}", i / 200, i % 200).parse().unwrap();
            others.push(w.take(Some(ip)).expect("another source's seat"));
        }
        assert!(w.take(Some("10.9.9.9".parse().unwrap())).is_none(), "all seats are taken");
        assert_eq!(w.len(), IN_ALL);
        drop(mine);
        assert!(w.take(a).is_some(), "given back");
        drop(others);
        assert!(w.is_empty());
    }
}
