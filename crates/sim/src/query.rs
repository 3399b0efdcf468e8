//! The sim's side of query parameters. ListOptions decoding, defaulting, validation,
//! resourceVersion parsing and continue tokens are `kube_watchcache::params` — the proxy's own code, so
//! the proxy and the sim validate with one implementation. This file keeps only what is
//! sim-specific: the `follow` flag of pod logs and turning a parsed resourceVersion into the
//! store's plain `Rv`.
//!
//! Called by `http` (decode), `read` / `watch` (RVs) and `subresource` (`follow`).

pub use kube_watchcache::params::{ContinueToken, ListOptions as Query, RvMatch, RvParam};
use kube_watchcache::resource::Rv;

/// The store's view of a parsed resourceVersion: unset and `0` both read the current state.
pub fn rv_of(p: RvParam) -> Rv {
    match p {
        RvParam::Unset | RvParam::Zero => Rv(0),
        RvParam::At(rv) => rv,
    }
}

/// `follow` of `pods/<name>/log` (Go's boolean rules: first value wins).
pub fn follow(raw: &str) -> bool {
    kube_watchcache::params::query_pairs(raw)
        .find(|(k, _)| k == "follow")
        .is_some_and(|(_, v)| kube_watchcache::params::parse_bool(&v))
}

/// A raw query string, decoded and defaulted as the apiserver does for a watch (the legacy
/// `/watch/` path is a watch whatever `watch` says).
pub fn watch_query(mut q: Query) -> Query {
    q.watch = true;
    q.apply_defaults();
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follow_uses_go_booleans() {
        assert!(follow("follow=true"));
        assert!(follow("follow="));
        assert!(!follow("follow=false&follow=true"));
        assert!(!follow("container=c"));
    }

    #[test]
    fn rv_of_maps_unset_and_zero_to_current() {
        assert_eq!(rv_of(RvParam::Unset), Rv(0));
        assert_eq!(rv_of(RvParam::Zero), Rv(0));
        assert_eq!(rv_of(RvParam::At(Rv(7))), Rv(7));
    }

    #[test]
    fn watch_query_defaults_to_watch_list() {
        let q = watch_query(Query::from_query("resourceVersion=0").unwrap());
        assert_eq!(q.send_initial_events, Some(true));
        assert_eq!(q.rv_match(), Some(RvMatch::NotOlderThan));
        let q = watch_query(Query::from_query("resourceVersion=5").unwrap());
        assert_eq!(q.send_initial_events, None);
    }
}
