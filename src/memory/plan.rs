//! What to do about the caches' memory against `--cache-memory-limit`, decided from one
//! measurement (pure; `memory` applies it):
//!
//! - over the limit: bring the total down to [`TARGET`] of it, first by shortening the
//!   histories, the largest (in bytes) first, each down to its floor at most; then, if that is
//!   not enough, by dropping whole caches, the largest first (their reads are forwarded);
//! - at or under [`LOW_WATER`] of the limit: give every shortened history its configured
//!   length back, and take back one dropped cache, the smallest, if it fits under the low
//!   water with what it measured when dropped;
//! - in between: nothing (the gap keeps the caches from flapping).
//!
//! Called by `memory` (the governor's sweep).

use crate::cache::Usage;

/// After acting, the total aims at this share of the limit.
pub const TARGET: f64 = 0.9;
/// Shortened histories and dropped caches come back at or under this share of the limit.
pub const LOW_WATER: f64 = 0.7;

/// One running cache, as measured.
#[derive(Clone, Debug)]
pub struct Cache {
    pub name: String,
    pub usage: Usage,
    /// The fewest events its history may be shortened to.
    pub floor: usize,
    /// Whether its history is shorter than configured now.
    pub shortened: bool,
}

/// One dropped cache and what it measured when dropped.
#[derive(Clone, Debug)]
pub struct Dropped {
    pub name: String,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Keep at most `cap` events in this cache's history (the oldest go now).
    Shorten { name: String, cap: usize },
    /// Stop caching this resource (`bytes`: what it measured).
    Drop { name: String, bytes: u64 },
    /// Give this history its configured length back.
    Unlimit { name: String },
    /// Cache this dropped resource again.
    Readmit { name: String },
}

/// The actions for caches measured `caches` (and `dropped`) under `limit` bytes.
pub fn plan(limit: u64, caches: &[Cache], dropped: &[Dropped]) -> Vec<Action> {
    let total: u64 = caches.iter().map(|c| c.usage.total()).sum();
    let mut out = Vec::new();
    if total > limit {
        let mut excess = total - (limit as f64 * TARGET) as u64;
        // What each cache still holds after its history was shortened.
        let mut left: Vec<(usize, u64)> = caches.iter().map(|c| c.usage.total()).enumerate().collect();
        let mut by_history: Vec<usize> = (0..caches.len()).collect();
        by_history.sort_by(|&a, &b| {
            caches[b].usage.history.cmp(&caches[a].usage.history).then(caches[a].name.cmp(&caches[b].name))
        });
        for i in by_history {
            let c = &caches[i];
            let u = c.usage;
            if excess == 0 || u.history == 0 || u.events <= c.floor {
                continue;
            }
            let per_event = u.history.div_ceil(u.events as u64).max(1);
            let needed = excess.div_ceil(per_event);
            let removed = needed.min((u.events - c.floor) as u64);
            let freed = (removed * per_event).min(u.history);
            out.push(Action::Shorten { name: c.name.clone(), cap: u.events - removed as usize });
            excess = excess.saturating_sub(freed);
            left[i].1 -= freed;
        }
        left.sort_by(|a, b| b.1.cmp(&a.1).then(caches[a.0].name.cmp(&caches[b.0].name)));
        for (i, bytes) in left {
            if excess == 0 {
                break;
            }
            out.push(Action::Drop { name: caches[i].name.clone(), bytes });
            excess = excess.saturating_sub(bytes);
        }
        return out;
    }
    let low = (limit as f64 * LOW_WATER) as u64;
    if total <= low {
        for c in caches.iter().filter(|c| c.shortened) {
            out.push(Action::Unlimit { name: c.name.clone() });
        }
        let smallest = dropped.iter().min_by(|a, b| a.bytes.cmp(&b.bytes).then(a.name.cmp(&b.name)));
        if let Some(d) = smallest.filter(|d| total + d.bytes <= low) {
            out.push(Action::Readmit { name: d.name.clone() });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(name: &str, objects: u64, history: u64, events: usize) -> Cache {
        Cache {
            name: name.into(),
            usage: Usage { objects, history, events, history_cap: 1000 },
            floor: 100,
            shortened: false,
        }
    }

    #[test]
    fn under_the_limit_nothing_happens() {
        let caches = [cache("pods", 400, 100, 500), cache("configmaps", 300, 0, 0)];
        assert_eq!(plan(1000, &caches, &[]), []);
        // Between the low water and the limit, not even a comeback.
        assert_eq!(plan(1000, &caches, &[Dropped { name: "secrets".into(), bytes: 1 }]), []);
    }

    #[test]
    fn the_largest_history_is_shortened_first_and_only_as_much_as_needed() {
        // 1100 over a limit of 1000: down to 900, i.e. 200 bytes. pods' history (600 bytes,
        // 600 events) is the largest: 200 of its events go, and nothing else is touched.
        let caches = [cache("configmaps", 100, 300, 300), cache("pods", 100, 600, 600)];
        assert_eq!(plan(1000, &caches, &[]), [Action::Shorten { name: "pods".into(), cap: 400 }]);
    }

    #[test]
    fn histories_stop_at_their_floor_then_the_largest_cache_is_dropped() {
        // 2100 over 1000: 1200 to free. pods' history can give 400 (500 events, floor 100),
        // configmaps' 100 (200 events): 700 short; then the largest remaining cache goes
        // (secrets, 700, before pods' 600 left).
        let caches =
            [cache("configmaps", 200, 200, 200), cache("pods", 500, 500, 500), cache("secrets", 700, 0, 0)];
        assert_eq!(
            plan(1000, &caches, &[]),
            [
                Action::Shorten { name: "pods".into(), cap: 100 },
                Action::Shorten { name: "configmaps".into(), cap: 100 },
                Action::Drop { name: "secrets".into(), bytes: 700 },
            ]
        );
    }

    #[test]
    fn caches_are_dropped_largest_first_until_under_the_target() {
        let caches = [cache("a", 500, 0, 0), cache("b", 900, 0, 0), cache("c", 700, 0, 0)];
        // 2100 over 1000: 1200 to free; b (900) then c (700).
        assert_eq!(
            plan(1000, &caches, &[]),
            [Action::Drop { name: "b".into(), bytes: 900 }, Action::Drop { name: "c".into(), bytes: 700 }]
        );
    }

    #[test]
    fn under_the_low_water_histories_come_back_and_the_smallest_dropped_cache_if_it_fits() {
        let mut short = cache("pods", 300, 10, 100);
        short.shortened = true;
        let caches = [short, cache("configmaps", 100, 0, 0)];
        let dropped =
            [Dropped { name: "big".into(), bytes: 500 }, Dropped { name: "small".into(), bytes: 200 }];
        assert_eq!(
            plan(1000, &caches, &dropped),
            [Action::Unlimit { name: "pods".into() }, Action::Readmit { name: "small".into() }]
        );
        // One that would not fit under the low water stays dropped.
        let dropped = [Dropped { name: "big".into(), bytes: 500 }];
        assert_eq!(plan(1000, &caches, &dropped), [Action::Unlimit { name: "pods".into() }]);
    }
}
