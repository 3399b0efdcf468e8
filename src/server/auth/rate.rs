//! Token buckets: one ([`Bucket`]) for a whole flow, and one per key ([`Buckets`]: per user,
//! per source address) so that one caller cannot spend what every caller needs.
//!
//! Used by `auth::authn` (TokenReviews: one bucket for all, one per source address),
//! `auth::authz` (SubjectAccessReviews per user and address, keyed by `server::limits::user_at`)
//! and `server::conn` (HTTP/2 streams reset by the client after they were accepted, per
//! connection).

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Keys a [`Buckets`] remembers by default before it forgets those with a full bucket (which
/// behave as new ones would), then, if still too many, the rest.
const MAX_KEYS: usize = 10_000;

/// `qps` tokens a second, at most `burst` saved; `qps <= 0` is unbounded.
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    pub qps: f64,
    pub burst: u32,
}

impl Rate {
    fn unbounded(&self) -> bool {
        self.qps <= 0.0
    }

    fn burst(&self) -> f64 {
        f64::from(self.burst.max(1))
    }

    /// `(tokens, last)` refilled to `now`.
    fn refill(&self, (tokens, last): (f64, Instant), now: Instant) -> f64 {
        (tokens + now.saturating_duration_since(last).as_secs_f64() * self.qps).min(self.burst())
    }

    /// A `1/n` share of this rate (at least one a second, a burst of at least 1).
    pub fn share(&self, n: u32) -> Rate {
        let n = n.max(1);
        Rate {
            qps: if self.unbounded() { 0.0 } else { (self.qps / f64::from(n)).max(1.0) },
            burst: (self.burst / n).max(1),
        }
    }
}

/// One token bucket.
#[derive(Debug)]
pub struct Bucket {
    rate: Rate,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub fn new(qps: f64, burst: u32) -> Bucket {
        let rate = Rate { qps, burst };
        Bucket { state: Mutex::new((rate.burst(), Instant::now())), rate }
    }

    /// Takes a token; `false` when there is none.
    pub fn take(&self) -> bool {
        if self.rate.unbounded() {
            return true;
        }
        let now = Instant::now();
        let mut st = self.state.lock();
        let tokens = self.rate.refill(*st, now);
        let ok = tokens >= 1.0;
        *st = (if ok { tokens - 1.0 } else { tokens }, now);
        ok
    }
}

/// A token bucket per key, each at `rate`.
pub struct Buckets<K> {
    rate: Rate,
    map: Mutex<HashMap<K, (f64, Instant)>>,
    max_keys: usize,
}

impl<K: Hash + Eq + Clone> Buckets<K> {
    pub fn new(rate: Rate) -> Buckets<K> {
        Self::with_capacity(rate, MAX_KEYS)
    }

    /// Remembering up to `max_keys` keys: more than there will be callers at once, or the
    /// buckets are forgotten (and refilled) while in use.
    pub fn with_capacity(rate: Rate, max_keys: usize) -> Buckets<K> {
        Buckets { rate, map: Mutex::default(), max_keys: max_keys.max(1) }
    }

    /// Takes a token from `key`'s bucket; `false` when it has none.
    pub fn take(&self, key: &K) -> bool {
        if self.rate.unbounded() {
            return true;
        }
        let now = Instant::now();
        let mut m = self.map.lock();
        if !m.contains_key(key) && m.len() >= self.max_keys {
            let full = self.rate.burst();
            m.retain(|_, st| self.rate.refill(*st, now) < full);
            if m.len() >= self.max_keys {
                m.clear();
            }
        }
        let st = m.entry(key.clone()).or_insert((self.rate.burst(), now));
        let tokens = self.rate.refill(*st, now);
        let ok = tokens >= 1.0;
        *st = (if ok { tokens - 1.0 } else { tokens }, now);
        ok
    }

    /// Keys remembered (tests).
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The source a TokenReview bucket is kept for: an IPv4 address, or an IPv6 address's /64
/// (one host usually holds a whole /64).
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_bucket_refills_at_its_rate() {
        let b = Bucket::new(2.0, 3);
        assert!((0..3).all(|_| b.take()), "the burst");
        assert!(!b.take());
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(b.take(), "one more after 1/qps");
        assert!(!b.take());
        assert!((0..1000).all(|_| Bucket::new(0.0, 1).take()), "0 is unbounded");
    }

    #[tokio::test(start_paused = true)]
    async fn each_key_has_its_own_bucket_and_idle_keys_are_forgotten() {
        let b = Buckets::new(Rate { qps: 1.0, burst: 2 });
        let a = "a".to_string();
        assert!(b.take(&a) && b.take(&a));
        assert!(!b.take(&a), "a spent its burst");
        assert!(b.take(&"b".to_string()), "b did not");
        // Many keys: when the map is full, the full buckets are forgotten, a spent one is kept.
        for i in 0..MAX_KEYS - 2 {
            assert!(b.take(&format!("k{i}")));
        }
        tokio::time::advance(Duration::from_secs(1)).await; // k*: full again; a: 1 of 2
        assert!(b.take(&"new".to_string()));
        assert_eq!(b.len(), 2, "a and the new key");
        assert!(b.take(&a) && !b.take(&a), "a kept its state");
        assert!((0..1000).all(|_| Buckets::new(Rate { qps: 0.0, burst: 1 }).take(&1)), "0 is unbounded");
    }

    #[test]
    fn shares_and_sources() {
        let r = Rate { qps: 50.0, burst: 100 }.share(4);
        assert_eq!((r.qps, r.burst), (12.5, 25));
        let r = Rate { qps: 1.0, burst: 1 }.share(4);
        assert_eq!((r.qps, r.burst), (1.0, 1));
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(source_key(ip("10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(source_key(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(source_key(ip("2001:db8:1:2:3:4:5:6")), ip("2001:db8:1:2::"));
    }
}
