//! The client connections open at once, for `--max-connections`: at the bound, one connection
//! with no request in flight gives way to the connection waiting to be accepted — one of the
//! source address (an IPv6 /64) that holds the most connections, the one idle longest. So one
//! source holding every slot with idle connections (kept open by a `/healthz` a minute, before
//! any authentication) cannot keep the others out: each newcomer closes one of its idle ones.
//! A connection with a request in flight (a watch, an exec session's start) never gives way,
//! nor one younger than [`MIN_IDLE`] that has not had time to send its first request; the one
//! asked is closed as `--goaway-chance` closes one (GOAWAY on HTTP/2; HTTP/1.1 closes after the
//! request in progress, if one just started).
//!
//! Joined by `listener` for each accepted connection; [`Crowd::make_room`] is called by the
//! listener, at most every [`GIVE_WAY_EVERY`], while it waits for a slot and a connection waits
//! in the kernel's accept queue.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::conn::Activity;

/// The least time a connection has been idle (or open without a request) before it may give
/// way: a client polling every few seconds is not closed under its next request (a request
/// already on its way when an HTTP/1.1 connection closes fails, unless the client replays it).
pub const MIN_IDLE: Duration = Duration::from_secs(5);

/// How often, at most, a connection is asked to give way (`listener`, while one waits to be
/// accepted).
pub const GIVE_WAY_EVERY: Duration = Duration::from_secs(1);

/// A counted connection: its source and its requests.
type Counted = (Option<IpAddr>, Arc<Activity>);

/// See the module doc.
#[derive(Default)]
pub struct Crowd {
    members: Mutex<HashMap<u64, Counted>>,
    next: AtomicU64,
}

/// A connection's place in the crowd; it leaves when this is dropped.
pub struct Member {
    crowd: Arc<Crowd>,
    id: u64,
}

impl Drop for Member {
    fn drop(&mut self) {
        self.crowd.members.lock().remove(&self.id);
    }
}

impl Crowd {
    /// Counts the connection from `source` (its `rate::source_key`) whose requests `activity`
    /// follows, until the returned member is dropped.
    pub fn join(self: &Arc<Self>, source: Option<IpAddr>, activity: Arc<Activity>) -> Member {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.members.lock().insert(id, (source, activity));
        Member { crowd: self.clone(), id }
    }

    /// Asks one idle connection to give way (see the module doc); whether one was asked.
    pub fn make_room(&self) -> bool {
        let now = Instant::now();
        let members = self.members.lock();
        let mut per_source: HashMap<Option<IpAddr>, usize> = HashMap::new();
        for (source, _) in members.values() {
            *per_source.entry(*source).or_default() += 1;
        }
        let candidates = members.values().filter_map(|(source, a)| {
            let since = a.idle_since()?;
            let idle = now.saturating_duration_since(since);
            (idle >= MIN_IDLE && !a.asked_to_close()).then(|| (per_source[source], idle, a))
        });
        let Some((_, _, chosen)) = candidates.max_by_key(|(n, idle, _)| (*n, *idle)) else {
            return false;
        };
        chosen.ask_to_close()
    }

    /// Connections counted (tests).
    pub fn len(&self) -> usize {
        self.members.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn the_heaviest_sources_longest_idle_connection_gives_way() {
        let crowd = Arc::new(Crowd::default());
        let (a1, a2, a3) = (Activity::new(), Activity::new(), Activity::new());
        let (b1, busy) = (Activity::new(), Activity::new());
        let _m: Vec<Member> = [(ip("10.0.0.1"), &a1), (ip("10.0.0.1"), &a2), (ip("10.0.0.1"), &a3)]
            .into_iter()
            .chain([(ip("10.0.0.2"), &b1), (ip("10.0.0.3"), &busy)])
            .map(|(s, a)| crowd.join(s, a.clone()))
            .collect();
        // Too young: nobody gives way yet.
        assert!(!crowd.make_room());
        let _watch = busy.begin();
        tokio::time::advance(MIN_IDLE).await;
        let _a1_busy = a1.begin();
        tokio::time::advance(Duration::from_secs(5)).await;
        // 10.0.0.1 holds three: of its idle ones (a1 has a request in flight) the longest idle.
        drop(a1.begin());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(crowd.make_room());
        assert!(a2.asked_to_close() || a3.asked_to_close());
        assert!(!a1.asked_to_close() && !b1.asked_to_close() && !busy.asked_to_close());
        // Then the other idle one of the same source; then b1; never the busy ones.
        assert!(crowd.make_room());
        assert!(a2.asked_to_close() && a3.asked_to_close());
        assert!(crowd.make_room());
        assert!(b1.asked_to_close());
        assert!(!crowd.make_room(), "only connections with a request in flight are left");
        assert!(!a1.asked_to_close() && !busy.asked_to_close());
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_leaves_the_crowd_when_its_member_is_dropped() {
        let crowd = Arc::new(Crowd::default());
        let m = crowd.join(ip("10.0.0.1"), Activity::new());
        assert_eq!(crowd.len(), 1);
        drop(m);
        assert!(crowd.is_empty());
        tokio::time::advance(MIN_IDLE).await;
        assert!(!crowd.make_room());
    }
}
