//! The six load shapes and their defaults, resolved with the command-line overrides into the
//! [`Plan`] every driver reads. Called by `bench::run`.
//!
//! Defaults are sized for a 2-core machine that runs the harness, the simulated apiserver and
//! the proxy at once; every number can be overridden by its flag.

use std::time::Duration;

/// What kind of load to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Many clients listing big collections at `resourceVersion=0` (and paginated with `limit`).
    ListHeavy,
    /// Many watchers of one whole resource; every change goes to every watcher.
    WatchFanout,
    /// One watcher per node with `fieldSelector=spec.nodeName=node-i`, pod churn, some GETs.
    Kubelet,
    /// A bit of everything: whole-resource and per-node watchers, lists, gets, churn.
    Mixed,
    /// kube-state-metrics-like sharded watchers (KEP-5866): the watchers split over 4 shards
    /// by uid (`shardSelector`), pod churn; compare with `watch-fanout` at the same sizes.
    Sharded,
    /// Informer-like clients (list, watch, resume, relist on 410) while a target restarts:
    /// the apiserver (direct, through the proxy), the proxy (cold, `--state-dir`), a rollout of
    /// two replicas. One column per case (`--cases`); see `restart`.
    Restart,
}

impl Scenario {
    pub fn as_str(self) -> &'static str {
        match self {
            Scenario::ListHeavy => "list-heavy",
            Scenario::WatchFanout => "watch-fanout",
            Scenario::Kubelet => "kubelet",
            Scenario::Mixed => "mixed",
            Scenario::Sharded => "sharded",
            Scenario::Restart => "restart",
        }
    }

    /// The scenario's default sizes.
    pub fn defaults(self) -> Sizes {
        match self {
            Scenario::ListHeavy => Sizes {
                objects: 10_000,
                object_size: 2048,
                watchers: 20,
                node_watchers: 0,
                lists_per_sec: 4.0,
                gets_per_sec: 50.0,
                events_per_sec: 5.0,
                lease_churn_per_sec: LEASE_CHURN,
            },
            Scenario::WatchFanout => Sizes {
                objects: 1_000,
                object_size: 1024,
                watchers: 10_000,
                node_watchers: 0,
                lists_per_sec: 0.0,
                gets_per_sec: 0.0,
                events_per_sec: 5.0,
                lease_churn_per_sec: LEASE_CHURN,
            },
            Scenario::Kubelet => Sizes {
                objects: 10_000,
                object_size: 2048,
                watchers: 0,
                node_watchers: 5_000,
                lists_per_sec: 0.0,
                gets_per_sec: 20.0,
                events_per_sec: 50.0,
                lease_churn_per_sec: LEASE_CHURN,
            },
            Scenario::Sharded => Sizes {
                objects: 2_000,
                object_size: 1024,
                watchers: 400,
                node_watchers: 0,
                lists_per_sec: 0.0,
                gets_per_sec: 0.0,
                events_per_sec: 20.0,
                lease_churn_per_sec: LEASE_CHURN,
            },
            Scenario::Restart => Sizes {
                objects: 2_000,
                object_size: 1024,
                watchers: 100,
                node_watchers: 0,
                lists_per_sec: 0.0,
                gets_per_sec: 0.0,
                events_per_sec: 20.0,
                lease_churn_per_sec: LEASE_CHURN,
            },
            Scenario::Mixed => Sizes {
                objects: 5_000,
                object_size: 1536,
                watchers: 200,
                node_watchers: 1_000,
                lists_per_sec: 1.0,
                gets_per_sec: 50.0,
                events_per_sec: 20.0,
                lease_churn_per_sec: LEASE_CHURN,
            },
        }
    }
}

/// How big the load is. `watchers` watch the whole resource; `node_watchers` each watch one
/// node's pods (`node-0..node-{n-1}`, the objects are spread over that many nodes).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Sizes {
    pub objects: usize,
    pub object_size: usize,
    pub watchers: usize,
    pub node_watchers: usize,
    pub lists_per_sec: f64,
    pub gets_per_sec: f64,
    pub events_per_sec: f64,
    /// Lease renewals per second in the in-process sim (node heartbeats: a resource the proxy
    /// does not cache moving the revision, as in any live cluster).
    pub lease_churn_per_sec: f64,
}

/// Default Lease renewals per second: ~200 nodes renewing every 10 s.
pub const LEASE_CHURN: f64 = 20.0;

/// Everything a phase needs to know, after defaults and overrides.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Plan {
    pub scenario: Scenario,
    #[serde(flatten)]
    pub sizes: Sizes,
    /// How long each target is driven.
    #[serde(serialize_with = "secs")]
    pub duration: Duration,
    /// Number of nodes the pods are spread over (at least 1).
    pub nodes: usize,
    /// Page size of the paginated LISTs.
    pub page_limit: usize,
    pub http2: bool,
    /// `--node-identities`: node watchers are kubelets with certificates of their own, the pods
    /// mount a Secret per node, and the GETs are those Secrets, by their nodes.
    pub node_identities: bool,
    /// `sharded`: the whole-resource watchers are spread over this many uid shards (0: none).
    pub shards: usize,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// Shards of the `sharded` scenario (kube-state-metrics' usual split in the KEP's example).
pub const SHARDS: usize = 4;

/// Namespaces the bench objects live in.
pub const NAMESPACES: usize = 10;

/// The label on namespaces the bench created, so that `--cleanup` deletes only those.
pub const CREATED_BY: (&str, &str) = ("app.kubernetes.io/created-by", "kube-watchcache-bench");

impl Plan {
    pub fn new(scenario: Scenario, sizes: Sizes, duration: Duration, http2: bool) -> Plan {
        let nodes = sizes.node_watchers.max(1).min(sizes.objects.max(1));
        let shards = if scenario == Scenario::Sharded { SHARDS } else { 0 };
        Plan { scenario, sizes, duration, nodes, page_limit: 500, http2, node_identities: false, shards }
    }

    /// Namespace and name of object `i`.
    pub fn object_key(i: usize) -> (String, String) {
        (format!("bench-{}", i % NAMESPACES), format!("bench-pod-{i}"))
    }

    /// The node object `i` is scheduled on.
    pub fn node_of(&self, i: usize) -> usize {
        i % self.nodes
    }

    /// Total watch clients.
    pub fn watch_clients(&self) -> usize {
        self.sizes.watchers + self.sizes.node_watchers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_follow_node_watchers_but_never_exceed_objects() {
        let mut s = Scenario::Kubelet.defaults();
        let p = Plan::new(Scenario::Kubelet, s.clone(), Duration::from_secs(1), false);
        assert_eq!(p.nodes, 5_000);
        assert_eq!(p.node_of(5_001), 1);
        s.objects = 10;
        assert_eq!(Plan::new(Scenario::Kubelet, s, Duration::from_secs(1), false).nodes, 10);
        let f = Plan::new(Scenario::WatchFanout, Scenario::WatchFanout.defaults(), Duration::ZERO, false);
        assert_eq!(f.nodes, 1);
        assert_eq!(f.watch_clients(), 10_000);
        assert_eq!(Plan::object_key(13), ("bench-3".into(), "bench-pod-13".into()));
    }
}
