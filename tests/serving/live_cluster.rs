//! Integration: the requests modern clients send, in a cluster that is never quiet. The
//! simulated apiserver renews node Leases (a resource the proxy does not cache) many times a
//! second, so etcd's revision always runs ahead of the cached resources' own RVs — as in every
//! real cluster. Most Recent LISTs must then be forwarded at once (never after a blind wait),
//! and watch-lists with resourceVersion unset (client-go ≥ 1.34 informers, kube-rs
//! `streaming_lists()`) must still be served by the cache, with one shared upstream LIST per
//! start and never a forwarded watch. Also: a custom resource in a `*.k8s.io` group.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use kube::{Api, Client, Config};
use kube_watchcache::app;
use kube_watchcache_sim::{Sim, SimOptions};
use serde_json::{json, Value};

/// Lease renewals per second in these tests (a busy cluster's heartbeats).
const LEASE_CHURN: f64 = 50.0;

async fn busy_cluster() -> Env {
    start_with(SimOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        lease_churn_per_sec: LEASE_CHURN,
        ..Default::default()
    })
    .await
}

/// Waits until the sim's revision has moved past `rv` (the lease churn is running).
async fn revision_moves_past(env: &Env, rv: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.sim.sim.current_rv().0 <= rv {
        assert!(Instant::now() < deadline, "the lease churn never moved the revision");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn cache_rv(env: &Env, resource: &str) -> u64 {
    env.proxy.readers().into_iter().find(|r| r.kind().resource == resource).unwrap().progress().rv.0
}

/// Upstream requests to exactly `path` whose query contains `part`.
fn upstream(env: &Env, path: &str, part: &str) -> usize {
    env.sim.sim.request_count(|r| r.path == path && r.query.contains(part))
}

const WATCH_LIST: &str =
    "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";

/// Requests to exactly `path` that asked for metadata only (`PartialObjectMetadataList`).
fn metadata_lists(env: &Env, path: &str) -> usize {
    env.sim.sim.request_count(|r| {
        r.path == path
            && r.headers
                .get("accept")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|a| a.contains("PartialObjectMetadataList"))
    })
}

#[tokio::test]
async fn most_recent_list_under_lease_churn_is_proven_by_metadata_and_served_from_the_cache() {
    let env = busy_cluster().await;
    let path = "/api/v1/namespaces/ns/configmaps";
    let probes_before = upstream(&env, "/api/v1/configmaps", "limit=1");
    for i in 0..16 {
        let written = env.create_cm("ns", &format!("c{i}"), json!({"data": i.to_string()}));
        env.synced_to(written).await;
        revision_moves_past(&env, env.sim.sim.current_rv().0).await;
        let arrived_rv = env.sim.sim.current_rv().0;
        assert!(cache_rv(&env, "configmaps") < arrived_rv, "the cache is behind the revision");
        let t = Instant::now();
        let r = env.get(&format!("{path}?limit=500")).await;
        let took = t.elapsed();
        assert_eq!(r.status, 200);
        // Read-your-writes, and never older than the upstream when the request arrived: the
        // list RV is the metadata list's, a revision the upstream issued after the arrival.
        assert_eq!(r.names().len(), i + 1, "write {i} visible");
        let list_rv: u64 = r.json()["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
        assert!(list_rv >= arrived_rv && list_rv <= env.sim.sim.current_rv().0, "list RV {list_rv}");
        // No blind wait (the old behaviour waited --consistent-read-wait, 1 s, every time).
        assert!(took < Duration::from_millis(900), "LIST {i} took {took:?}");
    }
    // Every LIST was proven by a metadata-only list and answered with the cache's bytes.
    assert_eq!(metadata_lists(&env, path), 16);
    assert_eq!(upstream(&env, path, "") - metadata_lists(&env, path), 0, "no full LIST went upstream");
    // Probes that keep failing are thinned out: at most 3 in a row, then one LIST in eight.
    let probes = upstream(&env, "/api/v1/configmaps", "limit=1") - probes_before;
    assert!(probes <= 3 + 16 / 8 + 1, "{probes} probes for 16 LISTs");
    let metrics = env.get("/watchcache/metrics").await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(!text.contains(r#"watchcache_forwarded_requests_total{reason="most_recent"}"#), "{text}");
    // A page of it continues at the proven RV: the upstream serves that token at once.
    let r = env.get(&format!("{path}?limit=5")).await;
    let token = r.json()["metadata"]["continue"].as_str().unwrap().to_owned();
    let t = Instant::now();
    let next = env.get(&format!("{path}?limit=5&continue={token}")).await;
    assert_eq!(next.status, 200);
    assert_eq!(next.names(), ["c13", "c14", "c15", "c2", "c3"]);
    assert!(t.elapsed() < Duration::from_millis(900), "not a wait for the cache (the old code waited 3 s)");
}

#[tokio::test]
async fn most_recent_list_is_served_from_the_cache_when_the_probe_proves_it() {
    // No lease churn: the cached resource's own RV is the revision.
    let env = start().await;
    let rv = env.create_cm("ns", "a", json!({}));
    env.synced_to(rv).await;
    let lists = upstream(&env, "/api/v1/namespaces/ns/configmaps", "");
    let r = env.get("/api/v1/namespaces/ns/configmaps").await;
    assert_eq!(r.names(), ["a"]);
    assert_eq!(upstream(&env, "/api/v1/namespaces/ns/configmaps", ""), lists, "served from the cache");
    assert!(upstream(&env, "/api/v1/configmaps", "limit=1") >= 1, "after a probe");
}

/// Reads a watch until the `k8s.io/initial-events-end` BOOKMARK: (ADDED names, its RV).
async fn initial_events(w: &mut WatchLines) -> (Vec<String>, u64) {
    let mut names = Vec::new();
    loop {
        let e = w.next(Duration::from_secs(5)).await.expect("initial events end with a bookmark");
        let (t, name) = type_name(&e);
        match t.as_str() {
            "ADDED" => names.push(name),
            "BOOKMARK" => {
                assert_eq!(e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
                return (names, rv_of(&e["object"]));
            }
            other => panic!("unexpected {other} before the end of the initial events: {e}"),
        }
    }
}

#[tokio::test]
async fn watch_list_rv_unset_under_lease_churn_is_served_by_the_cache() {
    let env = busy_cluster().await;
    for n in ["b", "a", "c"] {
        env.create_cm("ns", n, json!({"app": "x"}));
    }
    env.create_cm("other", "z", json!({"app": "x"}));
    revision_moves_past(&env, env.sim.sim.current_rv().0).await;
    assert!(cache_rv(&env, "configmaps") < env.sim.sim.current_rv().0, "the cache is behind the revision");
    let watches_before = upstream(&env, "/api/v1/configmaps", "watch");
    let path = "/api/v1/namespaces/ns/configmaps";
    let arrived_rv = env.sim.sim.current_rv().0;
    let t = Instant::now();
    let mut w =
        open_watch(&env.client, &env.proxy_url(&format!("{path}?{WATCH_LIST}&timeoutSeconds=4"))).await;
    assert_eq!(w.status, 200);
    let (names, end_rv) = initial_events(&mut w).await;
    let took = t.elapsed();
    assert_eq!(names, ["a", "b", "c"], "the namespace's state in key order");
    assert!(took < Duration::from_secs(1), "initial-events-end after {took:?}");
    // The state is not older than what the upstream had when the request arrived, and the
    // bookmark's RV is one the upstream issued.
    assert!(end_rv >= arrived_rv && end_rv <= env.sim.sim.current_rv().0, "end bookmark RV {end_rv}");
    // Live events come from the cache's fan-out, after the initial state.
    let written = env.update_cm("ns", "a", json!({"app": "x"}), "changed");
    let mut rvs = vec![end_rv];
    let mut saw_update = false;
    while let Some(e) = w.next(Duration::from_secs(6)).await {
        let (t, name) = type_name(&e);
        let rv = rv_of(&e["object"]);
        assert!(rv >= *rvs.last().unwrap(), "RVs never go backwards: {rvs:?} then {rv}");
        if t == "BOOKMARK" {
            assert!(rv > end_rv, "a bookmark never repeats the initial state's RV");
        } else {
            assert_eq!((t.as_str(), name.as_str(), rv), ("MODIFIED", "a", written));
            saw_update = true;
        }
        rvs.push(rv);
    }
    assert!(saw_update, "the live update arrived");
    // Exactly one upstream LIST of the watch's own selection, metadata only (the cache's
    // objects proven to be the upstream's state), and no upstream watch at all.
    assert_eq!(upstream(&env, path, "limit=500"), 1, "one initial list");
    assert_eq!(metadata_lists(&env, path), 1, "no object body read upstream");
    assert_eq!(upstream(&env, path, "watch"), 0, "the watch was never forwarded");
    assert_eq!(upstream(&env, "/api/v1/configmaps", "watch"), watches_before, "only the reflector's watch");
}

#[tokio::test]
async fn concurrent_watch_list_starts_share_their_upstream_list() {
    let env = busy_cluster().await;
    for i in 0..5 {
        env.create_cm("ns", &format!("c{i}"), json!({"app": "x"}));
    }
    revision_moves_past(&env, env.sim.sim.current_rv().0).await;
    let url = env.proxy_url(&format!(
        "/api/v1/namespaces/ns/configmaps?{WATCH_LIST}&labelSelector=app%3Dx&timeoutSeconds=30"
    ));
    let starts: Vec<_> = (0..20)
        .map(|_| {
            let (client, url) = (env.client.clone(), url.clone());
            tokio::spawn(async move {
                let mut w = open_watch(&client, &url).await;
                initial_events(&mut w).await
            })
        })
        .collect();
    let mut end_rvs = Vec::new();
    for s in starts {
        let (names, rv) = s.await.unwrap();
        assert_eq!(names, ["c0", "c1", "c2", "c3", "c4"]);
        end_rvs.push(rv);
    }
    let lists = upstream(&env, "/api/v1/namespaces/ns/configmaps", "labelSelector=app%3Dx");
    assert!((1..=2).contains(&lists), "20 concurrent starts made {lists} upstream lists");
    assert_eq!(upstream(&env, "/api/v1/namespaces/ns/configmaps", "watch"), 0);
}

#[tokio::test]
async fn watch_without_initial_events_rv_unset_starts_after_a_fresh_revision() {
    let env = busy_cluster().await;
    env.create_cm("ns", "a", json!({}));
    revision_moves_past(&env, env.sim.sim.current_rv().0).await;
    let path = "/api/v1/namespaces/ns/configmaps";
    let q = "watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=4";
    let mut w = open_watch(&env.client, &env.proxy_url(&format!("{path}?{q}"))).await;
    let written = env.update_cm("ns", "a", json!({}), "x");
    let e = w.next(Duration::from_secs(5)).await.expect("the update");
    assert_eq!(type_name(&e), ("MODIFIED".into(), "a".into()));
    assert_eq!(rv_of(&e["object"]), written);
    assert_eq!(upstream(&env, path, "watch"), 0, "served by the cache");
}

#[tokio::test]
async fn kube_watcher_with_streaming_lists_is_served_by_the_cache() {
    let env = busy_cluster().await;
    for n in ["a", "b"] {
        env.create_cm("ns", n, json!({}));
    }
    revision_moves_past(&env, env.sim.sim.current_rv().0).await;
    let watches_before = upstream(&env, "/api/v1/configmaps", "watch");
    let mut cfg = Config::new(env.proxy_url("").parse().unwrap());
    cfg.default_namespace = "ns".into();
    let api: Api<ConfigMap> = Api::namespaced(Client::try_from(cfg).unwrap(), "ns");
    let mut stream = watcher(api, watcher::Config::default().streaming_lists()).boxed();
    let mut init = Vec::new();
    let deadline = Duration::from_secs(10);
    loop {
        match tokio::time::timeout(deadline, stream.next()).await.expect("watcher event").unwrap() {
            Ok(watcher::Event::InitApply(cm)) => init.push(cm.metadata.name.unwrap()),
            Ok(watcher::Event::InitDone) => break,
            Ok(watcher::Event::Init) => {}
            other => panic!("unexpected before InitDone: {other:?}"),
        }
    }
    assert_eq!(init, ["a", "b"]);
    env.create_cm("ns", "c", json!({}));
    match tokio::time::timeout(deadline, stream.next()).await.expect("live event").unwrap() {
        Ok(watcher::Event::Apply(cm)) => assert_eq!(cm.metadata.name.as_deref(), Some("c")),
        other => panic!("expected the new configmap, got {other:?}"),
    }
    let path = "/api/v1/namespaces/ns/configmaps";
    assert_eq!(upstream(&env, path, "watch"), 0, "the streaming list never went upstream as a watch");
    // kube-rs starts its streaming list at resourceVersion=0 (client-go leaves it unset, see
    // above): the cache's own state, with no upstream read at all.
    assert_eq!(upstream(&env, path, ""), 0, "nothing of it reached the upstream");
    assert_eq!(upstream(&env, "/api/v1/configmaps", "watch"), watches_before);
}

#[tokio::test]
async fn a_custom_resource_in_a_k8s_io_group_is_encoded_as_one() {
    let sim = Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), ..Default::default() })
        .await
        .unwrap();
    let proxy = app::start(&serve_args(sim.addr, &["configmaps", "gateway.networking.k8s.io/gateways"]))
        .await
        .unwrap();
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let env = Env { sim, proxy, client: client() };
    env.ns("ns");
    let gw = env
        .sim
        .sim
        .create(
            "gateway.networking.k8s.io/gateways",
            "ns",
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                   "metadata": {"name": "web"}, "spec": {"gatewayClassName": "eg"}}),
        )
        .unwrap();
    let rv = rv_of(&gw);
    let reader = env.proxy.readers().into_iter().find(|r| r.kind().resource == "gateways").unwrap();
    assert!(!reader.kind().builtin, "decided from the upstream's list encoding, not the group name");
    reader.wait_for(kube_watchcache::resource::Rv(rv), Duration::from_secs(5)).await.unwrap();
    // Byte for byte what the upstream answers: an unstructured list (sorted keys) and object.
    let list = "/apis/gateway.networking.k8s.io/v1/namespaces/ns/gateways";
    let from_cache = env.get(&format!("{list}?resourceVersion=0")).await;
    let from_upstream = env.get_sim(&format!("{list}?resourceVersion=0")).await;
    assert_eq!(from_cache.status, 200);
    assert_eq!(from_cache.body, from_upstream.body, "list encoding");
    assert!(from_cache.body.starts_with(br#"{"apiVersion":"gateway.networking.k8s.io/v1","items":["#));
    let get = format!("{list}/web?resourceVersion=0");
    assert_eq!(env.get(&get).await.body, env.get_sim(&get).await.body, "object encoding");
    // A watch-list carries the object as the upstream has it.
    let mut w =
        open_watch(&env.client, &env.proxy_url(&format!("{list}?{WATCH_LIST}&resourceVersion=0"))).await;
    let added = w.next(Duration::from_secs(5)).await.expect("ADDED");
    let upstream_obj: Value = env.get_sim(&get).await.json();
    assert_eq!(added["object"], upstream_obj);
    assert_eq!(initial_events(&mut w).await.0, Vec::<String>::new(), "then the end bookmark");
}
